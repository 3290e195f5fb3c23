//! CISPO (MiniMax-M1, arXiv 2506.13585) as an out-of-tree [`Algorithm`] plugin.
//!
//! PPO clips the ratio inside a `min`, which silences the gradient of every token whose ratio
//! has left the trust region. CISPO clips the importance-sampling *weight* instead and stops its
//! gradient, so every token keeps contributing through log π_θ:
//!
//! `loss_t = −sg(clip(r_t, 1 − ε_low, 1 + ε_high)) · A_t · log π_θ(t)`, `r_t = π_θ / π_old`,
//!
//! averaged over the tokens of the mini-batch; advantages are GRPO's (group mean and std).
//! The reference implementation of that formula lives in `tests/train.rs` next to the
//! gradient check.

use std::sync::Arc;

use areal_sdk::{BuildContext, PluginConfig, PluginError};
use areal_sdk_train::advantages::{self, Baseline, RewardShaping, Scale};
use areal_sdk_train::{
    AdvantageInput, Advantages, Algorithm, LossInput, LossOutput, LossStats, ProximalMode,
    Requirements, register_algorithm,
};
use serde::Deserialize;

/// The options of `cispo`, read from the `[algorithm]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CispoOptions {
    /// Lower bound of the weight is 1 − ε_low. By default 1 (no lower bound), as in the paper.
    pub eps_low: f64,
    /// Upper bound of the weight is 1 + ε_high. By default 0.28.
    pub eps_high: f64,
}

impl Default for CispoOptions {
    fn default() -> Self {
        Self {
            eps_low: 1.0,
            eps_high: 0.28,
        }
    }
}

/// The algorithm.
#[derive(Clone, Debug)]
pub struct Cispo {
    options: CispoOptions,
}

impl Cispo {
    /// Check the options; errors name the full key (`algorithm.eps_high`).
    pub fn new(config: &PluginConfig) -> Result<Self, PluginError> {
        let options: CispoOptions = config.parse()?;
        if !(0.0..=1.0).contains(&options.eps_low) {
            return Err(config.invalid(
                "eps_low",
                format!("must be in [0, 1], found {}", options.eps_low),
            ));
        }
        if options.eps_high <= 0.0 {
            return Err(config.invalid(
                "eps_high",
                format!("must be positive, found {}", options.eps_high),
            ));
        }
        Ok(Self { options })
    }
}

impl Algorithm for Cispo {
    fn name(&self) -> &str {
        NAME
    }

    fn requirements(&self) -> Requirements {
        // r_t is measured against the behaviour policy: no extra forward pass.
        Requirements::new(ProximalMode::Behaviour)
    }

    fn advantages(&self, input: &AdvantageInput<'_>) -> Result<Advantages, PluginError> {
        let scalars = advantages::sequence_advantages(
            input.groups,
            &RewardShaping::default(),
            Baseline::GroupMean,
            Scale::GroupStd,
        );
        Ok(advantages::broadcast(input.groups, &scalars).into())
    }

    fn loss(&self, input: &LossInput) -> Result<LossOutput, PluginError> {
        let mask = input.loss_mask.clone();
        let current = input.current.0.clone();
        let old = input.proximal.0.clone().detach();
        let ratio = ((current.clone().detach() - old) * mask.clone()).exp();
        let (low, high) = (1.0 - self.options.eps_low, 1.0 + self.options.eps_high);
        let weight = ratio.clone().clamp(low, high);
        let clipped = ratio.clone().greater_elem(high).float() + ratio.lower_elem(low).float();

        let per_token = weight * input.advantages.clone() * current;
        let loss = (per_token * mask.clone())
            .sum()
            .neg()
            .div_scalar(input.minibatch_tokens.max(1) as f32);

        let mut stats = LossStats::default();
        let tokens = f64::from(mask.clone().sum().into_scalar::<f32>());
        let clipped = f64::from((clipped * mask).sum().into_scalar::<f32>());
        stats.add("weight_clipped_fraction", clipped, tokens);
        Ok(LossOutput { loss, stats })
    }
}

fn build(config: &PluginConfig, _: &BuildContext) -> Result<Arc<dyn Algorithm>, PluginError> {
    Ok(Arc::new(Cispo::new(config)?))
}

/// The name the plugin is registered under.
pub const NAME: &str = "cispo";

register_algorithm!(
    NAME,
    "CISPO (example plugin): REINFORCE with clipped, stop-gradient importance weights",
    build
);
