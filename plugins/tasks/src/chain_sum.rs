//! `chain-sum`: add a chain of digits step by step.
//!
//! A prompt is `n` digits to add, each after a letter that names it, `a5b8c3=`; the expected
//! response takes the terms in order, one step per term — the term's letter, its digit, and the
//! running total — and ends with the answer after `>`:
//!
//! ```text
//! a5b8c3=  →  a5=5,b8=13,c3=16>16
//! ```
//!
//! (The letters let a small model find the next term by looking it up rather than by
//! counting.) Response length grows with `n` (11 characters for two terms, 75 for twelve), and
//! `n` follows a decaying distribution, so a few prompts take far longer to answer than most:
//! the long tail asynchronous RL is meant for.
//!
//! **Demonstrations are imperfect on purpose.** The demonstrator forgets the carry — writes
//! `c5=13` after a total of 18 instead of `c5=23` — with probability `demo_carry_error` (0.6
//! by default) whenever a step crosses a multiple of ten, and carries on from its own wrong
//! total. A model warmed up on them learns to forget carries more often than not; the reward
//! (the final answer is right) is what teaches it to carry. Everything else in the
//! demonstrations is correct.
//!
//! **Splits are disjoint by construction**: a prompt's hash puts it in exactly one of train,
//! validation and eval; the held-out splits are lists of distinct prompts fixed by the task's
//! seed.

use std::sync::Arc;

use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, Split, Task,
    TaskItem, VerifyContext, mix_seed, stable_hash,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Deserialize;
use serde_json::json;

use crate::answers::{grade_number, number_after};
use crate::splits::{held_out_at, held_out_draws};

/// The name the chain-sum task and its reward are registered under (`kind = "chain-sum"`).
pub const NAME: &str = "chain-sum";

/// Characters of prompts and responses.
pub const ALPHABET: &str = "0123456789=,>abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN";

/// The letter that names term `i` (0-based): `a`, `b`, ...
fn label(i: usize) -> char {
    ALPHABET[13..].chars().nth(i).expect("at most 40 terms")
}

/// Options of the `chain-sum` task.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChainSumOptions {
    /// Fewest terms of a prompt. By default 2.
    pub min_terms: usize,
    /// Most terms of a prompt. By default 12.
    pub max_terms: usize,
    /// P(n terms) ∝ decay^(n − min_terms) · (n − min_terms + 1)^(−power). By default 0.8.
    pub decay: f64,
    /// The power-law part of the distribution of n: with `decay = 1`, `power = 1.5` and
    /// terms 2 to 40, the median prompt has 3 terms and one in a hundred has 35 or more (a
    /// heavy tail of long responses, as reasoning models produce). By default 0.
    pub power: f64,
    /// Size of the eval split. By default 500.
    pub eval_items: usize,
    /// Size of the validation split. By default 200.
    pub validation_items: usize,
    /// Probability that the demonstrator forgets a carry. By default 0.6.
    pub demo_carry_error: f64,
}

impl Default for ChainSumOptions {
    fn default() -> Self {
        Self {
            min_terms: 2,
            max_terms: 12,
            decay: 0.8,
            power: 0.0,
            eval_items: 500,
            validation_items: 200,
            demo_carry_error: 0.6,
        }
    }
}

/// The task.
#[derive(Clone, Debug)]
pub struct ChainSum {
    options: ChainSumOptions,
    seed: u64,
    eval: Arc<Vec<Vec<u32>>>,
    validation: Arc<Vec<Vec<u32>>>,
}

/// The split a prompt belongs to: 1 in 20 to eval, 1 in 20 to validation, the rest to train.
pub fn split_of(prompt: &str) -> Split {
    match stable_hash(prompt) % 20 {
        0 => Split::Eval,
        1 => Split::Validation,
        _ => Split::Train,
    }
}

/// `a5b8c3=` for terms 5, 8, 3.
pub fn prompt(terms: &[u32]) -> String {
    let body: String = terms
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{}{t}", label(i)))
        .collect();
    format!("{body}=")
}

/// The response with running totals; `forget()` says whether the demonstrator forgets the
/// carry at a step that crosses a multiple of ten.
pub fn response(terms: &[u32], mut forget: impl FnMut() -> bool) -> String {
    let mut total = 0;
    let mut steps = Vec::with_capacity(terms.len());
    for (i, &t) in terms.iter().enumerate() {
        let mut next = total + t;
        if total % 10 + t >= 10 && forget() {
            next -= 10;
        }
        steps.push(format!("{}{t}={next}", label(i)));
        total = next;
    }
    format!("{}>{total}", steps.join(","))
}

impl ChainSum {
    /// The task with `options`; its splits follow from `seed`.
    pub fn new(options: ChainSumOptions, seed: u64) -> Self {
        let mut task = Self {
            options,
            seed,
            eval: Arc::default(),
            validation: Arc::default(),
        };
        task.eval = Arc::new(task.held_out(Split::Eval, task.options.eval_items));
        task.validation = Arc::new(task.held_out(Split::Validation, task.options.validation_items));
        task
    }

    fn draw(&self, rng: &mut StdRng) -> Vec<u32> {
        let o = &self.options;
        let weights: Vec<f64> = (o.min_terms..=o.max_terms)
            .map(|n| {
                let k = n - o.min_terms;
                o.decay.powi(k as i32) * ((k + 1) as f64).powf(-o.power)
            })
            .collect();
        let mut u = rng.random::<f64>() * weights.iter().sum::<f64>();
        let mut n = o.max_terms;
        for (i, w) in weights.iter().enumerate() {
            if u < *w {
                n = o.min_terms + i;
                break;
            }
            u -= w;
        }
        (0..n).map(|_| rng.random_range(1..=9)).collect()
    }

    /// Draw prompts from `stream` until one falls in `split`.
    fn draw_in(&self, split: Split, rng: &mut StdRng) -> Vec<u32> {
        loop {
            let terms = self.draw(rng);
            if split_of(&prompt(&terms)) == split {
                return terms;
            }
        }
    }

    /// Distinct prompts (terms are distinct exactly when their prompts are).
    fn held_out(&self, split: Split, count: usize) -> Vec<Vec<u32>> {
        held_out_draws(self.seed, split, count, |rng| {
            Some(self.draw_in(split, rng))
        })
    }

    fn item_for(&self, id: String, terms: &[u32]) -> TaskItem {
        TaskItem {
            id,
            prompt: prompt(terms),
            reference: json!({ "terms": terms, "answer": terms.iter().sum::<u32>() }),
        }
    }
}

impl Task for ChainSum {
    fn name(&self) -> &str {
        NAME
    }

    fn len(&self, split: Split) -> Option<usize> {
        match split {
            Split::Train => None,
            Split::Eval => Some(self.eval.len()),
            Split::Validation => Some(self.validation.len()),
        }
    }

    fn item(&self, split: Split, index: u64) -> Result<TaskItem, PluginError> {
        let id = format!("{}-{index}", split.as_str());
        match split {
            Split::Train => {
                let mut rng = StdRng::seed_from_u64(mix_seed(self.seed, index));
                let terms = self.draw_in(Split::Train, &mut rng);
                Ok(self.item_for(id, &terms))
            }
            Split::Eval | Split::Validation => {
                let terms = held_out_at(NAME, split, &self.eval, &self.validation, index)?;
                Ok(self.item_for(id, terms))
            }
        }
    }

    fn demonstration(&self, item: &TaskItem) -> Result<Option<String>, PluginError> {
        let terms = terms_of(item)?;
        let mut rng =
            StdRng::seed_from_u64(mix_seed(self.seed ^ 0xdead_beef, stable_hash(&item.id)));
        let p = self.options.demo_carry_error;
        Ok(Some(response(&terms, || rng.random::<f64>() < p)))
    }
}

/// The digits an item asks to add (its `reference.terms`).
pub fn terms_of(item: &TaskItem) -> Result<Vec<u32>, PluginError> {
    item.reference["terms"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(|t| t.as_u64().map(|t| t as u32))
                .collect::<Option<Vec<_>>>()
        })
        .filter(|t| !t.is_empty())
        .ok_or_else(|| PluginError::failed(NAME, format!("item {} has no `terms`", item.id)))
}

pub(crate) fn build_task(
    config: &PluginConfig,
    ctx: &BuildContext,
) -> Result<Arc<dyn Task>, PluginError> {
    let o: ChainSumOptions = config.parse()?;
    if o.min_terms < 2 || o.max_terms < o.min_terms || o.max_terms > 40 {
        return Err(config.invalid(
            "max_terms",
            format!(
                "terms must satisfy 2 ≤ min_terms ≤ max_terms ≤ 40, found {}..={}",
                o.min_terms, o.max_terms
            ),
        ));
    }
    if !(o.decay > 0.0 && o.decay <= 1.0) {
        return Err(config.invalid("decay", format!("must be in (0, 1], found {}", o.decay)));
    }
    if !(o.power >= 0.0 && o.power.is_finite()) {
        return Err(config.invalid("power", format!("must be ≥ 0, found {}", o.power)));
    }
    if !(0.0..=1.0).contains(&o.demo_carry_error) {
        return Err(config.invalid(
            "demo_carry_error",
            format!("must be in [0, 1], found {}", o.demo_carry_error),
        ));
    }
    Ok(Arc::new(ChainSum::new(o, ctx.seed)))
}

/// The final answer of a response: the digits after its last `>`.
pub fn final_answer(response: &str) -> Option<u64> {
    number_after(response, '>')
}

/// Reward 1 when the final answer is the sum, 0 otherwise.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChainSumVerifier;

impl RewardVerifier for ChainSumVerifier {
    fn name(&self) -> &str {
        NAME
    }

    fn verify(&self, input: &RewardInput, _ctx: &VerifyContext) -> Result<Reward, PluginError> {
        Ok(grade_number(self.name(), input, '>')?.with_version(env!("CARGO_PKG_VERSION")))
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
    Ok(Arc::new(ChainSumVerifier))
}
