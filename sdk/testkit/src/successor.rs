//! The `testkit-successor` task and verifiers: continue a letter with its successors.
//!
//! A prompt is one letter; the ideal completion is the `length` letters that follow it in the
//! alphabet, cyclically (`c` → `defghijk` over 11+ letters, wrapping after the last letter).
//! The reward is the fraction of the first `length` letters that follow their predecessor
//! (the prompt's letter for the first), so every step is credited on its own and a bigram
//! policy can learn the whole task.

use std::sync::Arc;
use std::time::Duration;

use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, Split, Task,
    TaskItem, Verdict, VerifyContext, mix_seed,
};
use serde::Deserialize;

use crate::tokenizer::LetterTokenizer;
use serde_json::json;

/// The name the successor task and reward are registered under.
pub(crate) const NAME: &str = "testkit-successor";

/// The name the faulty reward is registered under.
pub(crate) const FAULTY_NAME: &str = "testkit-faulty";

/// Options of the `testkit-successor` task.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SuccessorTaskOptions {
    /// Letters in the alphabet; must match the policy's. By default 8.
    pub letters: u32,
    /// Length of the ideal completion. By default 6.
    pub length: u32,
}

impl Default for SuccessorTaskOptions {
    fn default() -> Self {
        Self {
            letters: 8,
            length: 6,
        }
    }
}

/// Prompts are single letters: the train split draws them at random, the eval and validation
/// splits hold each letter once.
#[derive(Clone, Debug)]
pub struct SuccessorTask {
    options: SuccessorTaskOptions,
    seed: u64,
}

impl SuccessorTask {
    /// The task with `options`, drawing train prompts from `seed`.
    pub fn new(options: SuccessorTaskOptions, seed: u64) -> Self {
        Self { options, seed }
    }

    fn item_for(&self, id: String, letter: u32) -> TaskItem {
        TaskItem {
            id,
            prompt: char::from_u32('a' as u32 + letter)
                .expect("letter is in the alphabet")
                .to_string(),
            reference: json!({ "letters": self.options.letters, "length": self.options.length }),
        }
    }
}

impl Task for SuccessorTask {
    fn name(&self) -> &str {
        NAME
    }

    fn len(&self, split: Split) -> Option<usize> {
        match split {
            Split::Train => None,
            // with so few prompts, both held-out splits are every letter once
            Split::Eval | Split::Validation => Some(self.options.letters as usize),
        }
    }

    fn item(&self, split: Split, index: u64) -> Result<TaskItem, PluginError> {
        match split {
            Split::Train => {
                let letter = (mix_seed(self.seed, index) % u64::from(self.options.letters)) as u32;
                Ok(self.item_for(format!("train-{index}"), letter))
            }
            Split::Eval | Split::Validation if index < u64::from(self.options.letters) => {
                Ok(self.item_for(format!("{}-{index}", split.as_str()), index as u32))
            }
            Split::Eval | Split::Validation => Err(PluginError::failed(
                self.name(),
                format!(
                    "{} index {index} out of range (the split has {} items)",
                    split.as_str(),
                    self.options.letters
                ),
            )),
        }
    }
}

pub(crate) fn build_task(
    config: &PluginConfig,
    ctx: &BuildContext,
) -> Result<Arc<dyn Task>, PluginError> {
    let options: SuccessorTaskOptions = config.parse()?;
    LetterTokenizer::check_letters(config, options.letters)?;
    if options.length == 0 {
        return Err(config.invalid("length", "must be at least 1, found 0"));
    }
    Ok(Arc::new(SuccessorTask::new(options, ctx.seed)))
}

/// Score a completion: the fraction of its first `length` letters that follow their
/// predecessor; a shorter completion misses the rest.
pub fn successor_reward(input: &RewardInput) -> Result<Reward, PluginError> {
    let field = |name: &str| {
        input.reference[name].as_u64().ok_or_else(|| {
            PluginError::failed(
                NAME,
                format!(
                    "reference of item {} has no integer `{name}`",
                    input.item_id
                ),
            )
        })
    };
    let letters = field("letters")? as u32;
    let length = field("length")? as usize;
    let Some(start) = input.prompt.chars().last() else {
        return Err(PluginError::failed(NAME, "empty prompt"));
    };
    // Every step counts on its own: c[i] must follow c[i-1] (the prompt's letter for i = 0).
    let mut prev = start as u32 - 'a' as u32;
    let mut correct = 0;
    for c in input.completion.chars().take(length) {
        let letter = (c as u32).wrapping_sub('a' as u32);
        if letter == (prev + 1) % letters {
            correct += 1;
        }
        prev = letter;
    }
    let value = correct as f64 / length as f64;
    let verdict = match correct {
        0 => Verdict::WrongAnswer,
        c if c == length => Verdict::Accepted,
        _ => Verdict::Partial,
    };
    Ok(Reward::new(value, verdict)
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_detail("correct_steps", correct))
}

/// The `testkit-successor` verifier.
#[derive(Clone, Copy, Debug, Default)]
pub struct SuccessorVerifier;

impl RewardVerifier for SuccessorVerifier {
    fn name(&self) -> &str {
        NAME
    }

    fn verify(&self, input: &RewardInput, _ctx: &VerifyContext) -> Result<Reward, PluginError> {
        successor_reward(input)
    }

    fn cache_identity(&self) -> Option<String> {
        Some(env!("CARGO_PKG_VERSION").into())
    }
}

pub(crate) fn build_verifier(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    config.no_options()?;
    Ok(Arc::new(SuccessorVerifier))
}

/// Options of the `testkit-faulty` verifier: the successor reward, except that samples whose
/// id is a multiple of one of these misbehave (0 disables each fault).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultyOptions {
    /// Panic on these samples.
    pub panic_every: u64,
    /// Return `Err` on these samples.
    pub error_every: u64,
    /// Block on these samples, ignoring the deadline, for `hang_ms`.
    pub hang_every: u64,
    /// How long a hang lasts. By default one hour.
    pub hang_ms: Option<u64>,
}

/// A verifier that panics, fails or hangs on purpose, for testing the reward service.
#[derive(Clone, Debug, Default)]
pub struct FaultyVerifier {
    options: FaultyOptions,
}

impl FaultyVerifier {
    /// A faulty verifier with `options`.
    pub fn new(options: FaultyOptions) -> Self {
        Self { options }
    }
}

fn hits(every: u64, id: u64) -> bool {
    every > 0 && id.is_multiple_of(every)
}

impl RewardVerifier for FaultyVerifier {
    fn name(&self) -> &str {
        FAULTY_NAME
    }

    fn verify(&self, input: &RewardInput, _ctx: &VerifyContext) -> Result<Reward, PluginError> {
        let id = input.sample_id;
        if hits(self.options.hang_every, id) {
            // Deliberately ignores the deadline, like a verifier stuck in a C library.
            std::thread::sleep(Duration::from_millis(
                self.options.hang_ms.unwrap_or(3_600_000),
            ));
        }
        if hits(self.options.panic_every, id) {
            panic!("testkit-faulty panics on sample {id} as configured");
        }
        if hits(self.options.error_every, id) {
            return Err(PluginError::failed(
                self.name(),
                format!("fails on sample {id} as configured"),
            ));
        }
        successor_reward(input)
    }
}

pub(crate) fn build_faulty(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    Ok(Arc::new(FaultyVerifier::new(config.parse()?)))
}
