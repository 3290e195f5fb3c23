//! The PPO family as [`Algorithm`] plugins.
//!
//! - `decoupled-ppo` (the default): AReaL's decoupled objective (arXiv 2505.24298, Eq. 5).
//!   Per generated token with advantage A:
//!   `u = exp(logπ_θ − logπ_prox)`, `w = exp(logπ_prox − logπ_behav)`,
//!   `loss_t = −w · min(u·A, clip(u, 1−ε_low, 1+ε_high)·A)`, averaged over the tokens of the
//!   whole mini-batch. π_prox is recomputed before the update (or approximated log-linearly
//!   with `proximal = "log-linear"`); tokens whose w exceeds `behav_weight_cap` are masked or
//!   clamped.
//! - `ppo`: standard PPO, the special case π_prox = π_behav (w = 1, no recompute).
//!
//! Both share options: clipping bounds, dual clip, reward shaping, the advantage baseline and
//! scale. The rest of the family (GRPO, DAPO, GSPO, ...) is added here as further plugins.
//!
//! ```
//! use areal_sdk::{BuildContext, PluginConfig};
//! use areal_sdk_train::{AlgorithmPlugin, ProximalMode};
//! use areal_algo_ppo as _; // links the registrations
//!
//! let cfg = PluginConfig::new("algorithm", "decoupled-ppo").with("eps_clip", 0.25);
//! let algo = AlgorithmPlugin::build_from(&cfg, &BuildContext::new(1, 1)).unwrap();
//! assert_eq!(algo.requirements().proximal, ProximalMode::Recompute);
//! ```

use std::sync::Arc;

use areal_sdk::{BuildContext, PluginConfig, PluginError, TrajectoryGroup};
use areal_sdk_train::advantages::{self, Baseline, RewardShaping, Scale};
use areal_sdk_train::burn::tensor::Tensor;
use areal_sdk_train::{
    Algorithm, LossInput, LossOutput, LossStats, ProximalMode, Requirements, register_algorithm,
};
use serde::Deserialize;

/// How the proximal policy of `decoupled-ppo` is obtained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Proximal {
    /// A no-grad forward pass with the weights before the update.
    #[default]
    Recompute,
    /// The log-linear interpolation between behaviour and current logprobs by version.
    LogLinear,
}

/// What happens to tokens whose behaviour importance weight exceeds the cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapMode {
    /// Drop them from the loss (they still count in the normaliser).
    #[default]
    Mask,
    /// Use the cap as their weight.
    Clamp,
}

/// Options shared by `ppo` and `decoupled-ppo`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoOptions {
    /// Lower clipping bound ε_low: the ratio is clipped below at 1 − ε_low. By default 0.2.
    pub eps_clip: f64,
    /// Upper clipping bound ε_high; by default equal to `eps_clip`.
    pub eps_clip_high: Option<f64>,
    /// Dual-clip constant c > 1 bounding the loss of negative-advantage tokens at −c·A. By
    /// default off.
    pub dual_clip: Option<f64>,
    /// Upper bound on the behaviour importance weight w (decoupled only). By default off.
    pub behav_weight_cap: Option<f64>,
    /// What to do with tokens above the cap. By default `mask`.
    pub behav_weight_mode: CapMode,
    /// How π_prox is obtained (decoupled only). By default `recompute`.
    pub proximal: Proximal,
    /// Reward shaping before advantages. By default none.
    pub reward: RewardShaping,
    /// Baseline subtracted from shaped rewards. By default `group-mean`.
    pub baseline: Baseline,
    /// Scale the centred rewards are divided by. By default `group-std`.
    pub scale: Scale,
}

impl Default for PpoOptions {
    fn default() -> Self {
        Self {
            eps_clip: 0.2,
            eps_clip_high: None,
            dual_clip: None,
            behav_weight_cap: None,
            behav_weight_mode: CapMode::Mask,
            proximal: Proximal::Recompute,
            reward: RewardShaping::default(),
            baseline: Baseline::GroupMean,
            scale: Scale::GroupStd,
        }
    }
}

/// PPO with a clipped surrogate, standard or decoupled.
#[derive(Clone, Debug)]
pub struct Ppo {
    name: &'static str,
    decoupled: bool,
    options: PpoOptions,
}

impl Ppo {
    /// Check options against the variant; `path` is the config section for error messages.
    pub fn new(decoupled: bool, options: PpoOptions, path: &str) -> Result<Self, PluginError> {
        let key = |k: &str| format!("{path}.{k}");
        let high = options.eps_clip_high.unwrap_or(options.eps_clip);
        if !(options.eps_clip > 0.0 && options.eps_clip < 1.0) {
            return Err(PluginError::config(
                key("eps_clip"),
                format!("must be in (0, 1), found {}", options.eps_clip),
            ));
        }
        if high <= 0.0 {
            return Err(PluginError::config(
                key("eps_clip_high"),
                format!("must be positive, found {high}"),
            ));
        }
        if let Some(c) = options.dual_clip
            && c <= 1.0
        {
            return Err(PluginError::config(
                key("dual_clip"),
                format!("must be greater than 1, found {c}"),
            ));
        }
        if let Some(cap) = options.behav_weight_cap {
            if !decoupled {
                return Err(PluginError::config(
                    key("behav_weight_cap"),
                    "only applies to decoupled-ppo: in standard PPO the behaviour weight is 1",
                ));
            }
            if cap <= 1.0 {
                return Err(PluginError::config(
                    key("behav_weight_cap"),
                    format!("must be greater than 1, found {cap}"),
                ));
            }
        }
        if !decoupled && options.proximal != Proximal::Recompute {
            return Err(PluginError::config(
                key("proximal"),
                "only applies to decoupled-ppo: standard PPO uses the behaviour policy as proximal",
            ));
        }
        Ok(Self {
            name: if decoupled { "decoupled-ppo" } else { "ppo" },
            decoupled,
            options,
        })
    }
}

/// Sum of `values` over the tokens where `mask` is 1, as an f64.
fn masked_sum(values: Tensor<1>, mask: &Tensor<1>) -> f64 {
    f64::from((values * mask.clone()).sum().into_scalar::<f32>())
}

impl Algorithm for Ppo {
    fn name(&self) -> &str {
        self.name
    }

    fn requirements(&self) -> Requirements {
        Requirements::new(match (self.decoupled, self.options.proximal) {
            (false, _) => ProximalMode::Behaviour,
            (true, Proximal::Recompute) => ProximalMode::Recompute,
            (true, Proximal::LogLinear) => ProximalMode::LogLinear,
        })
    }

    fn advantages(&self, groups: &[TrajectoryGroup]) -> Result<Vec<Vec<f32>>, PluginError> {
        let scalars = advantages::sequence_advantages(
            groups,
            &self.options.reward,
            self.options.baseline,
            self.options.scale,
        );
        Ok(advantages::broadcast(groups, &scalars))
    }

    fn loss(&self, input: &LossInput) -> Result<LossOutput, PluginError> {
        let o = &self.options;
        let eps_low = o.eps_clip;
        let eps_high = o.eps_clip_high.unwrap_or(o.eps_clip);
        let adv = input.advantages.clone();
        let mask = input.loss_mask.clone();
        let current = input.current.0.clone();
        let proximal = input.proximal.0.clone().detach();
        let behaviour = input.behaviour.0.clone().detach();

        // Masked positions (prompt tokens) are zeroed before exp so they cannot overflow.
        let log_ratio = (current - proximal.clone()) * mask.clone();
        let ratio = log_ratio.clone().exp();
        let clipped_ratio = ratio.clone().clamp(1.0 - eps_low, 1.0 + eps_high);
        let surrogate = adv.clone().neg() * ratio.clone();
        let surrogate_clipped = adv.clone().neg() * clipped_ratio;
        let clip_active = surrogate_clipped.clone().greater(surrogate.clone()).float();
        let mut per_token = surrogate.max_pair(surrogate_clipped);

        let mut stats = LossStats::default();
        let tokens = masked_sum(mask.clone(), &mask);
        if let Some(c) = o.dual_clip {
            let bound = adv.clone().neg().mul_scalar(c);
            let negative = adv.clone().lower_elem(0.0);
            let capped = per_token.clone().min_pair(bound.clone());
            let dual_active = per_token.clone().greater(bound).bool_and(negative.clone());
            stats.add(
                "dual_clip_fraction",
                masked_sum(dual_active.float(), &mask),
                tokens,
            );
            per_token = per_token.mask_where(negative, capped);
        }

        let mut loss_mask = mask.clone();
        if self.decoupled {
            let weight = ((proximal - behaviour) * mask.clone()).exp();
            stats.add("behav_weight", masked_sum(weight.clone(), &mask), tokens);
            let weight = match o.behav_weight_cap {
                Some(cap) => {
                    let over = weight.clone().greater_elem(cap);
                    stats.add(
                        "behav_capped_fraction",
                        masked_sum(over.clone().float(), &mask),
                        tokens,
                    );
                    match o.behav_weight_mode {
                        CapMode::Mask => {
                            loss_mask = loss_mask.mask_fill(over, 0.0);
                            weight
                        }
                        CapMode::Clamp => weight.clamp_max(cap),
                    }
                }
                None => weight,
            };
            per_token = per_token * weight;
        }

        stats.add("clip_fraction", masked_sum(clip_active, &mask), tokens);
        stats.add("ratio", masked_sum(ratio, &mask), tokens);
        // k1 estimate of KL(π_prox ‖ π_θ) over the mini-batch's tokens
        stats.add("approx_kl", masked_sum(log_ratio.neg(), &mask), tokens);
        stats.add("advantage", masked_sum(adv, &mask), tokens);

        let normaliser = input.minibatch_tokens.max(1) as f32;
        let loss = (per_token * loss_mask).sum().div_scalar(normaliser);
        Ok(LossOutput { loss, stats })
    }
}

fn build(decoupled: bool, config: &PluginConfig) -> Result<Arc<dyn Algorithm>, PluginError> {
    Ok(Arc::new(Ppo::new(
        decoupled,
        config.parse()?,
        config.path(),
    )?))
}

register_algorithm!(
    "decoupled-ppo",
    "AReaL's decoupled PPO: clipped ratio to a recomputed proximal policy, weighted by π_prox/π_behav",
    |config: &PluginConfig, _: &BuildContext| build(true, config)
);
register_algorithm!(
    "ppo",
    "standard clipped PPO: the behaviour policy is the proximal policy (no recompute)",
    |config: &PluginConfig, _: &BuildContext| build(false, config)
);
