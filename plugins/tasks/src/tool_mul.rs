//! `tool-mul`: the built-in multi-turn job — multiply two numbers, which a small model cannot
//! do in its head but can with the `python` tool, in episodes of tool-integrated reasoning
//! (`[episode] kind = "tool-calls"`, `format = "code-block"`).
//!
//! ````text
//! 37*48            the prompt
//! ```python        the policy's first turn: a call
//! 37*48
//! ```
//! ```output        the tool's answer (environment tokens)
//! 1776
//! ```
//! =1776            the policy's second turn: the answer, graded
//! ````
//!
//! **Demonstrations are imperfect on purpose**: with probability `demo_tool` (0.4 by default)
//! a demonstration calls the tool and copies its answer; otherwise it answers at once, in its
//! head: right with probability `demo_guess_right` (0.2), else with one digit wrong. A model
//! warmed up on them calls the tool only sometimes; only the reward teaches it to call every
//! time. Without the tool it has only its head.
//!
//! **Splits are disjoint by pair**: a pair's hash puts `a*b` in exactly one of train,
//! validation and eval.

use std::sync::Arc;

use areal_sdk::{
    BuildContext, DemoTurn, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, Split,
    Task, TaskItem, VerifyContext, mix_seed, stable_hash,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Deserialize;
use serde_json::json;

use crate::answers::{grade_number, number_after};
use crate::splits::{held_out_at, held_out_draws};

/// The name the task and its reward are registered under (`kind = "tool-mul"`).
pub const NAME: &str = "tool-mul";

/// Every printable ASCII character and the newline: the policy's alphabet for this job, so
/// that whatever a tool answers (a traceback, an error message) can be read.
pub fn alphabet() -> String {
    let mut a: String = (b' '..=b'~').map(char::from).collect();
    a.push('\n');
    a
}

/// Options of the `tool-mul` task.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolMulOptions {
    /// Digits of each factor. By default 2 (10 to 99).
    pub digits: u32,
    /// Size of the eval split. By default 200.
    pub eval_items: usize,
    /// Size of the validation split. By default 100.
    pub validation_items: usize,
    /// Probability that a demonstration calls the tool (else it answers in its head). By
    /// default 0.4.
    pub demo_tool: f64,
    /// Probability that an answer in the head is right (else one digit is wrong). By default
    /// 0.2.
    pub demo_guess_right: f64,
}

impl Default for ToolMulOptions {
    fn default() -> Self {
        Self {
            digits: 2,
            eval_items: 200,
            validation_items: 100,
            demo_tool: 0.4,
            demo_guess_right: 0.2,
        }
    }
}

/// The split of the pair `a*b`: 1 in 10 to eval, 1 in 10 to validation, the rest to train.
pub fn split_of(a: u64, b: u64) -> Split {
    match stable_hash(&format!("{a}*{b}")) % 10 {
        0 => Split::Eval,
        1 => Split::Validation,
        _ => Split::Train,
    }
}

/// The task.
#[derive(Clone, Debug)]
pub struct ToolMul {
    options: ToolMulOptions,
    seed: u64,
    eval: Arc<Vec<(u64, u64)>>,
    validation: Arc<Vec<(u64, u64)>>,
}

impl ToolMul {
    /// The task with `options`, drawing train items from `seed`.
    pub fn new(options: ToolMulOptions, seed: u64) -> Self {
        let (lo, hi) = range(options.digits);
        let held = |split: Split, count: usize| {
            held_out_draws(seed, split, count, |rng| {
                let pair = (rng.random_range(lo..=hi), rng.random_range(lo..=hi));
                (split_of(pair.0, pair.1) == split).then_some(pair)
            })
        };
        Self {
            eval: Arc::new(held(Split::Eval, options.eval_items)),
            validation: Arc::new(held(Split::Validation, options.validation_items)),
            options,
            seed,
        }
    }
}

fn range(digits: u32) -> (u64, u64) {
    (10u64.pow(digits - 1), 10u64.pow(digits) - 1)
}

fn item_for(id: String, (a, b): (u64, u64)) -> TaskItem {
    TaskItem {
        id,
        prompt: format!("{a}*{b}\n"),
        reference: json!({ "a": a, "b": b, "answer": a * b }),
    }
}

/// The factors of `item`.
pub fn factors(item: &TaskItem) -> Result<(u64, u64), PluginError> {
    let get = |k: &str| item.reference[k].as_u64();
    get("a")
        .zip(get("b"))
        .ok_or_else(|| PluginError::failed(NAME, format!("item {} has no `a` and `b`", item.id)))
}

/// What the `python` tool answers for `a*b` in a code block episode.
pub fn tool_answer(a: u64, b: u64) -> String {
    format!("\n```output\n{}\n```\n", a * b)
}

/// A demonstration: the call, the tool's answer and the copy (`tool`), or an answer in the
/// head, right when `right`, else with one digit of the product wrong.
pub fn demonstration(a: u64, b: u64, tool: bool, right: bool, rng: &mut StdRng) -> Vec<DemoTurn> {
    if tool {
        return vec![
            DemoTurn::Policy(format!("```python\n{a}*{b}\n```")),
            DemoTurn::Environment(tool_answer(a, b)),
            DemoTurn::Policy(format!("={}", a * b)),
        ];
    }
    if right {
        return vec![DemoTurn::Policy(format!("={}", a * b))];
    }
    let mut digits: Vec<u8> = (a * b).to_string().into_bytes();
    let i = rng.random_range(0..digits.len());
    let old = digits[i] - b'0';
    let mut new = rng.random_range(0..9u8);
    if new >= old {
        new += 1;
    }
    if i == 0 && new == 0 {
        new = if old == 1 { 2 } else { 1 };
    }
    digits[i] = b'0' + new;
    vec![DemoTurn::Policy(format!(
        "={}",
        String::from_utf8(digits).expect("digits")
    ))]
}

impl Task for ToolMul {
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
                let (lo, hi) = range(self.options.digits);
                let mut rng = StdRng::seed_from_u64(mix_seed(self.seed, index));
                loop {
                    let pair = (rng.random_range(lo..=hi), rng.random_range(lo..=hi));
                    if split_of(pair.0, pair.1) == Split::Train {
                        return Ok(item_for(id, pair));
                    }
                }
            }
            Split::Eval | Split::Validation => {
                let pair = held_out_at(NAME, split, &self.eval, &self.validation, index)?;
                Ok(item_for(id, *pair))
            }
        }
    }

    fn demonstration_turns(&self, item: &TaskItem) -> Result<Option<Vec<DemoTurn>>, PluginError> {
        let (a, b) = factors(item)?;
        let mut rng =
            StdRng::seed_from_u64(mix_seed(self.seed ^ 0x7001_c0de, stable_hash(&item.id)));
        let tool = rng.random::<f64>() < self.options.demo_tool;
        let right = rng.random::<f64>() < self.options.demo_guess_right;
        Ok(Some(demonstration(a, b, tool, right, &mut rng)))
    }

    fn demonstration(&self, item: &TaskItem) -> Result<Option<String>, PluginError> {
        // one text only for a one-turn demonstration; the tool's turns need the episode
        let turns = self.demonstration_turns(item)?.unwrap_or_default();
        Ok(match turns.as_slice() {
            [DemoTurn::Policy(text)] => Some(text.clone()),
            _ => None,
        })
    }
}

pub(crate) fn build_task(
    config: &PluginConfig,
    ctx: &BuildContext,
) -> Result<Arc<dyn Task>, PluginError> {
    let o: ToolMulOptions = config.parse()?;
    if !(1..=6).contains(&o.digits) {
        return Err(config.invalid("digits", format!("must be in 1..=6, found {}", o.digits)));
    }
    for (key, p) in [
        ("demo_tool", o.demo_tool),
        ("demo_guess_right", o.demo_guess_right),
    ] {
        if !(0.0..=1.0).contains(&p) {
            return Err(config.invalid(key, format!("must be in [0, 1], found {p}")));
        }
    }
    Ok(Arc::new(ToolMul::new(o, ctx.seed)))
}

/// The number after the last `=` of `text`, if that is all that follows it.
pub fn final_answer(text: &str) -> Option<u64> {
    number_after(text, '=')
}

/// 1 when the graded text's final answer (after its last `=`) is the product.
#[derive(Clone, Copy, Debug, Default)]
pub struct ToolMulVerifier;

impl RewardVerifier for ToolMulVerifier {
    fn name(&self) -> &str {
        NAME
    }

    fn verify(&self, input: &RewardInput, _: &VerifyContext) -> Result<Reward, PluginError> {
        grade_number(NAME, input, '=')
    }
}

pub(crate) fn build_verifier(
    config: &PluginConfig,
    _: &BuildContext,
) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    config.no_options()?;
    Ok(Arc::new(ToolMulVerifier))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demonstrations_call_the_tool_or_guess_wrong() {
        let mut rng = StdRng::seed_from_u64(3);
        let with = demonstration(37, 48, true, false, &mut rng);
        assert_eq!(
            with,
            vec![
                DemoTurn::Policy("```python\n37*48\n```".into()),
                DemoTurn::Environment("\n```output\n1776\n```\n".into()),
                DemoTurn::Policy("=1776".into()),
            ]
        );
        for _ in 0..200 {
            let [DemoTurn::Policy(guess)] = &demonstration(37, 48, false, false, &mut rng)[..]
            else {
                panic!("a guess is one turn");
            };
            let got = final_answer(guess).unwrap();
            assert_ne!(got, 1776);
            assert_eq!(got.to_string().len(), 4, "{guess}");
        }
        assert_eq!(
            demonstration(37, 48, false, true, &mut rng),
            vec![DemoTurn::Policy("=1776".into())]
        );
    }

    #[test]
    fn splits_are_disjoint_and_the_verifier_reads_the_last_answer() {
        let task = ToolMul::new(ToolMulOptions::default(), 1);
        for (i, &(a, b)) in task.eval.iter().enumerate() {
            assert_eq!(split_of(a, b), Split::Eval, "eval {i}");
        }
        assert_eq!(task.len(Split::Eval), Some(200));
        let item = task.item(Split::Train, 5).unwrap();
        let (a, b) = factors(&item).unwrap();
        assert_eq!(split_of(a, b), Split::Train);
        assert_eq!(
            final_answer("```python\n1*2\n```\n```output\n2\n```\n=2"),
            Some(2)
        );
        assert_eq!(final_answer("=12 or so"), None);
    }
}
