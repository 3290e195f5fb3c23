//! The PPO family as [`Algorithm`] plugins, each selectable with `algorithm.kind`:
//!
//! | kind | what it is |
//! |---|---|
//! | `decoupled-ppo` (default) | AReaL's decoupled objective (arXiv 2505.24298, Eq. 5) |
//! | `ppo` | standard clipped PPO: π_prox = π_behav |
//! | `ppo-critic` | PPO with a value head, GAE and a clipped value loss |
//! | `grpo` | group mean/std advantages, per-sequence token mean, k3 KL term in the loss |
//! | `dr-grpo` | group mean, no std, a constant normaliser |
//! | `rloo` | leave-one-out baseline, REINFORCE on the sequence |
//! | `dapo` | ε_high > ε_low, overlong punishment, dynamic filtering, token mean |
//! | `gspo` | sequence-level geometric-mean ratio |
//! | `sapo` | soft sigmoid gates instead of clipping |
//! | `m2po` | second-moment masking of stale tokens instead of clipping |
//! | `reinforce++` | KL in the reward, global whitening of token advantages |
//! | `areal-grpo` | AReaL's "GRPO" recipe: decoupled PPO with batch mean/std |
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

use std::sync::Arc;

use areal_sdk::{BuildContext, PluginConfig, PluginError, TrajectoryGroup};
use areal_sdk_train::{
    AdvantageInput, Advantages, Algorithm, LossInput, LossOutput, ProximalMode, Requirements,
    register_algorithm,
};

pub use advantage::overlong_punishment;
pub use loss::second_moment_mask;
pub use options::{
    CapMode, KlEstimator, KlPlacement, Level, LossAgg, Options, Proximal, Surrogate, Variant,
};

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
        let options = options::resolve(variant, config, ctx)?;
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
        let mut rewards = group.samples.iter().map(|s| s.reward.value);
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

fn build(
    variant: Variant,
    config: &PluginConfig,
    ctx: &BuildContext,
) -> Result<Arc<dyn Algorithm>, PluginError> {
    Ok(Arc::new(PpoFamily::new(variant, config, ctx)?))
}

macro_rules! register {
    ($($variant:ident: $description:expr;)*) => {$(
        register_algorithm!(
            Variant::$variant.name(),
            $description,
            |config: &PluginConfig, ctx: &BuildContext| build(Variant::$variant, config, ctx)
        );
    )*};
}

register! {
    DecoupledPpo: "AReaL's decoupled PPO: clipped ratio to a recomputed proximal policy, weighted by π_prox/π_behav";
    Ppo: "standard clipped PPO: the behaviour policy is the proximal policy (no recompute)";
    PpoCritic: "PPO with a critic: value head on the policy's trunk, GAE, clipped value loss";
    Grpo: "GRPO: group mean/std advantages, per-sequence token mean, k3 KL to the reference in the loss";
    DrGrpo: "Dr. GRPO: group-mean advantages without std, token sums over a constant normaliser";
    Rloo: "RLOO: leave-one-out baseline, REINFORCE on the whole sequence (token sum, sequence mean)";
    Dapo: "DAPO: clip-higher, overlong punishment, dynamic filtering of all-equal groups, token mean";
    Gspo: "GSPO: sequence-level geometric-mean ratio, clipped per sequence";
    Sapo: "SAPO: soft sigmoid gates on the ratio instead of clipping (coupled loss only)";
    M2po: "M2PO: unclipped ratio, masking the tokens that push the second moment of log(π_θ/π_behav) over a bound";
    ReinforcePlusPlus: "REINFORCE++: per-token KL penalty in the reward, returns whitened over the batch's tokens";
    ArealGrpo: "AReaL's \"GRPO\" recipe: decoupled PPO with reward bias/scale and batch mean/std";
}
