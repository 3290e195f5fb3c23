//! `chain-steps`: partial credit for the built-in `chain-sum` task.
//!
//! `chain-sum`'s own reward is 1 for the right final answer and 0 otherwise. This one also
//! pays for each running total that is right, so a response that carries correctly for most
//! of the chain earns more than one that goes wrong at the first step:
//!
//! ```text
//! reward = final_weight · [final answer right] + (1 − final_weight) · (right totals / terms)
//! ```
//!
//! ```
//! use areal_example_chain_steps::{ChainSteps, Options};
//!
//! let reward = ChainSteps::new(Options { final_weight: 0.5 });
//! // a5b8c3=: totals 5, 13, 16; the second step forgot its carry
//! let (value, right, found) = reward.score("a5=5,b8=3,c3=6>6", &[5, 8, 3]);
//! assert_eq!((right, found), (1, true));
//! assert!((value - 0.5 / 3.0).abs() < 1e-12);
//! ```

use std::sync::Arc;

use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, Verdict,
    VerifyContext, register_reward,
};
use serde::Deserialize;

/// Options of `chain-steps` (the `[reward]` section). Unknown keys are errors that name them.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Options {
    /// The share of the reward that the final answer carries; the rest is shared equally by
    /// the running totals. By default 0.5.
    pub final_weight: f64,
}

impl Default for Options {
    fn default() -> Self {
        Self { final_weight: 0.5 }
    }
}

/// The verifier.
#[derive(Clone, Debug)]
pub struct ChainSteps {
    options: Options,
}

impl ChainSteps {
    /// The verifier with `options`.
    pub fn new(options: Options) -> Self {
        Self { options }
    }

    /// The reward of `completion` for `terms`, how many running totals are right, and whether
    /// a final answer (after `>`) was found.
    pub fn score(&self, completion: &str, terms: &[u64]) -> (f64, usize, bool) {
        let (steps, answer) = match completion.rsplit_once('>') {
            Some((steps, answer)) => (steps, answer.trim().parse::<u64>().ok()),
            None => (completion, None),
        };
        // `a5=5,b8=13,c3=16`: the total after each `=`, in order.
        let mut total = 0;
        let mut right = 0;
        for (step, term) in steps.split(',').zip(terms) {
            total += term;
            let written = step
                .split_once('=')
                .and_then(|(_, t)| t.trim().parse::<u64>().ok());
            if written == Some(total) {
                right += 1;
            }
        }
        let final_right = answer == Some(terms.iter().sum());
        let w = self.options.final_weight;
        let value =
            w * f64::from(u8::from(final_right)) + (1.0 - w) * right as f64 / terms.len() as f64;
        let value = value.min(1.0); // w + (1 − w) may round above 1
        (value, right, answer.is_some())
    }
}

impl RewardVerifier for ChainSteps {
    fn name(&self) -> &str {
        NAME
    }

    fn verify(&self, input: &RewardInput, _ctx: &VerifyContext) -> Result<Reward, PluginError> {
        // The task's reference: `{"terms": [5, 8, 3], "answer": 16}`. A reference without
        // terms is the task's fault, not the sample's: an error, which costs only this sample.
        let terms: Vec<u64> = input.reference["terms"]
            .as_array()
            .and_then(|a| a.iter().map(serde_json::Value::as_u64).collect())
            .filter(|t: &Vec<u64>| !t.is_empty())
            .ok_or_else(|| {
                PluginError::failed(
                    NAME,
                    format!("item {}: the reference has no `terms`", input.item_id),
                )
            })?;
        let (value, right, found) = self.score(&input.completion, &terms);
        // A wrong answer is a reward, never an error.
        let verdict = if !found {
            Verdict::NoAnswer
        } else if value >= 1.0 {
            Verdict::Accepted
        } else if value > 0.0 {
            Verdict::Partial
        } else {
            Verdict::WrongAnswer
        };
        Ok(Reward::new(value, verdict)
            .with_version(concat!(
                "areal-example-chain-steps ",
                env!("CARGO_PKG_VERSION")
            ))
            .with_limit("final_weight", self.options.final_weight)
            .with_detail("right_totals", right as u64)
            .with_detail("terms", terms.len() as u64))
    }
}

fn build(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    let options: Options = config.parse()?;
    if !(0.0..=1.0).contains(&options.final_weight) {
        return Err(config.invalid(
            "final_weight",
            format!("must be between 0 and 1, found {}", options.final_weight),
        ));
    }
    Ok(Arc::new(ChainSteps::new(options)))
}

/// The name the plugin is registered under.
pub const NAME: &str = "chain-steps";

register_reward!(
    NAME,
    "chain-sum with partial credit: the final answer and each right running total",
    build
);
