//! The PPO family as [`Algorithm`] plugins, each selectable with `algorithm.kind`:
//!
//! `areal plugins` lists them, each with what it is; `variants.rs` defines them, one entry each
//! (name, description, the parts that make it what it is, its preset).
//!
//! Every variant is one [`Variant`] preset of the same [`Options`]; options that make no sense
//! for a variant are rejected with the reason. `docs/algorithms.md` has the formulas.
//!
//! ```
//! use areal_sdk::{BuildContext, PluginConfig};
//! use areal_sdk_train::{AlgorithmPlugin, ProximalMode};
//! use areal_algo_ppo as _; // links the registrations
//!
//! let cfg = PluginConfig::new("algorithm", "decoupled-ppo").with("eps_clip", 0.25);
//! let algo = AlgorithmPlugin::build_from(&cfg, &BuildContext::new(1, 1)).unwrap();
//! assert_eq!(algo.requirements().proximal, ProximalMode::Recompute);
//!
//! let grpo = PluginConfig::new("algorithm", "grpo");
//! let algo = AlgorithmPlugin::build_from(&grpo, &BuildContext::new(1, 1)).unwrap();
//! assert!(algo.requirements().reference); // its KL term needs the reference policy
//! ```

mod advantage;
mod loss;
mod options;
mod resolve;
mod variants;

use std::sync::Arc;

use areal_sdk::{BuildContext, PluginConfig, PluginError, TrajectoryGroup};
use areal_sdk_train::{
    AdvantageInput, Advantages, Algorithm, LossInput, LossOutput, ProximalMode, Requirements,
};

pub use advantage::overlong_punishment;
pub use loss::second_moment_mask;
pub use options::{
    CapMode, KlEstimator, KlPlacement, Level, LossAgg, Options, Proximal, Surrogate,
};
pub use variants::{ProximalRule, Variant};

/// One member of the PPO family with its options.
#[derive(Clone, Debug)]
pub struct PpoFamily {
    variant: Variant,
    options: Options,
}

impl PpoFamily {
    /// `variant` configured by the section `config` (its preset, overridden by the keys given).
    pub fn new(
        variant: Variant,
        config: &PluginConfig,
        ctx: &BuildContext,
    ) -> Result<Self, PluginError> {
        let options = resolve::resolve(variant, config, ctx)?;
        Ok(Self { variant, options })
    }

    /// The variant.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The resolved options.
    pub fn options(&self) -> &Options {
        &self.options
    }
}

impl Algorithm for PpoFamily {
    fn name(&self) -> &str {
        self.variant.name()
    }

    fn requirements(&self) -> Requirements {
        let proximal = match self.options.proximal {
            Proximal::Behaviour => ProximalMode::Behaviour,
            Proximal::Recompute => ProximalMode::Recompute,
            Proximal::LogLinear => ProximalMode::LogLinear,
        };
        Requirements::new(proximal)
            .with_reference(self.options.kl_coef > 0.0)
            .with_values(self.variant.critic())
    }

    fn keep_group(&self, group: &TrajectoryGroup) -> bool {
        if !self.options.dynamic_filter {
            return true;
        }
        let mut rewards = group.samples.iter().map(|s| s.reward.total());
        match rewards.next() {
            Some(first) => rewards.any(|r| r != first),
            None => false,
        }
    }

    fn advantages(&self, input: &AdvantageInput<'_>) -> Result<Advantages, PluginError> {
        if self.variant.critic() && input.values.is_none() {
            return Err(PluginError::failed(
                self.name(),
                "GAE needs the values before the update, and the engine gave none",
            ));
        }
        Ok(advantage::compute(input, &self.options))
    }

    fn loss(&self, input: &LossInput) -> Result<LossOutput, PluginError> {
        loss::loss(self.variant, &self.options, input)
    }
}

/// The plugin of `variant` for its config section (what each variant registers).
pub(crate) fn build(
    variant: Variant,
    config: &PluginConfig,
    ctx: &BuildContext,
) -> Result<Arc<dyn Algorithm>, PluginError> {
    Ok(Arc::new(PpoFamily::new(variant, config, ctx)?))
}
