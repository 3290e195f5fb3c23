//! The members of the PPO family, each written once: its name, description, the parts that
//! make it what it is (surrogate, ratio, critic, which proximal policies it allows, the
//! options only it reads) and its preset of [`Options`]. The entry also registers it as an
//! algorithm plugin. A new variant is one entry here plus its test (`tests/ppo.rs`) and its
//! section of `docs/algorithms.md`.

use areal_sdk::{BuildContext, PluginConfig};
use areal_sdk_train::advantages::{Baseline, RewardShaping, Scale};
use areal_sdk_train::register_algorithm;

use crate::options::{KlEstimator, KlPlacement, LossAgg, Options, Proximal, Surrogate};

/// Which proximal policies (`proximal`) a variant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProximalRule {
    /// Any: π_prox = π_behav (coupled) or a decoupled one.
    Any,
    /// Only π_prox = π_behav; the text says why (and what to use instead).
    Coupled(&'static str),
    /// Never π_prox = π_behav: the variant is the decoupled loss (with π_prox = π_behav it
    /// is `ppo`).
    Decoupled,
}

/// Defines [`Variant`] and everything each variant is, from one entry per variant, and
/// registers each as an algorithm plugin.
macro_rules! variants {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident = $name:literal {
            description: $description:literal,
            surrogate: $surrogate:ident,
            sequence_ratio: $sequence_ratio:literal,
            critic: $critic:literal,
            proximal: $proximal:expr,
            own_keys: [$($own:literal),* $(,)?],
            preset: |$base:ident, $max_new_tokens:pat_param| $preset:expr $(,)?
        }
    )*) => {
        /// A member of the PPO family. Each is a preset of [`Options`] plus the parts that
        /// make it what it is (its surrogate, its ratio), which options cannot change.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Variant {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Variant {
            /// Every variant, in the order `areal plugins` lists them.
            pub const ALL: [Variant; [$(stringify!($variant)),*].len()] = [$(Variant::$variant),*];

            /// Registered name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Variant::$variant => $name,)*
                }
            }

            /// One line saying what it is (as `areal plugins` shows it).
            pub const fn description(self) -> &'static str {
                match self {
                    $(Variant::$variant => $description,)*
                }
            }

            /// The policy-gradient term.
            pub fn surrogate(self) -> Surrogate {
                match self {
                    $(Variant::$variant => Surrogate::$surrogate,)*
                }
            }

            /// Whether the importance ratio is per sequence (GSPO) rather than per token.
            pub fn sequence_ratio(self) -> bool {
                match self {
                    $(Variant::$variant => $sequence_ratio,)*
                }
            }

            /// Whether the variant trains a critic.
            pub fn critic(self) -> bool {
                match self {
                    $(Variant::$variant => $critic,)*
                }
            }

            /// Which proximal policies it allows.
            pub fn proximal_rule(self) -> ProximalRule {
                match self {
                    $(Variant::$variant => $proximal,)*
                }
            }

            /// Options only this kind of variant reads; elsewhere they are rejected.
            pub fn own_keys(self) -> &'static [&'static str] {
                match self {
                    $(Variant::$variant => &[$($own),*],)*
                }
            }

            /// The defaults of this variant, from its paper. `max_new_tokens` is the rollout
            /// length limit when known (DAPO's overlong buffer is a fifth of it); the length
            /// limits left unset default to it for every variant when the options are
            /// resolved.
            pub fn preset(self, max_new_tokens: Option<usize>) -> Options {
                match self {
                    $(Variant::$variant => {
                        let $base = Options::default();
                        let $max_new_tokens = max_new_tokens;
                        $preset
                    })*
                }
            }
        }

        $(
            register_algorithm!(
                $name,
                $description,
                |config: &PluginConfig, ctx: &BuildContext| {
                    crate::build(Variant::$variant, config, ctx)
                }
            );
        )*
    };
}

variants! {
    /// AReaL's decoupled PPO (arXiv 2505.24298, Eq. 5).
    DecoupledPpo = "decoupled-ppo" {
        description: "AReaL's decoupled PPO: clipped ratio to a recomputed proximal policy, weighted by π_prox/π_behav",
        surrogate: Clip,
        sequence_ratio: false,
        critic: false,
        proximal: ProximalRule::Decoupled,
        own_keys: [],
        preset: |base, _| Options {
            proximal: Proximal::Recompute,
            ..base
        },
    }
    /// Standard clipped PPO (Schulman et al. 2017): π_prox = π_behav.
    Ppo = "ppo" {
        description: "standard clipped PPO: the behaviour policy is the proximal policy (no recompute)",
        surrogate: Clip,
        sequence_ratio: false,
        critic: false,
        proximal: ProximalRule::Coupled(
            "ppo is the coupled loss (π_prox = π_behav); use kind = \"decoupled-ppo\" for a \
             recomputed or log-linear proximal policy",
        ),
        own_keys: [],
        preset: |base, _| base,
    }
    /// PPO with a critic: a value head, GAE, clipped value loss.
    PpoCritic = "ppo-critic" {
        description: "PPO with a critic: value head on the policy's trunk, GAE, clipped value loss",
        surrogate: Clip,
        sequence_ratio: false,
        critic: true,
        proximal: ProximalRule::Any,
        own_keys: ["gamma", "lambda", "value_coef", "value_clip"],
        preset: |base, _| Options {
            baseline: Baseline::None,
            scale: Scale::None,
            token_whitening: true,
            ..base
        },
    }
    /// GRPO (DeepSeekMath, arXiv 2402.03300).
    Grpo = "grpo" {
        description: "GRPO: group mean/std advantages, per-sequence token mean, k3 KL to the reference in the loss",
        surrogate: Clip,
        sequence_ratio: false,
        critic: false,
        proximal: ProximalRule::Any,
        own_keys: [],
        preset: |base, _| Options {
            loss_agg: LossAgg::SeqMeanTokenMean,
            kl_coef: 0.04,
            kl_estimator: KlEstimator::K3,
            kl_placement: KlPlacement::Loss,
            ..base
        },
    }
    /// Dr. GRPO (arXiv 2503.20783).
    DrGrpo = "dr-grpo" {
        description: "Dr. GRPO: group-mean advantages without std, token sums over a constant normaliser",
        surrogate: Clip,
        sequence_ratio: false,
        critic: false,
        proximal: ProximalRule::Any,
        own_keys: [],
        preset: |base, _| Options {
            scale: Scale::None,
            loss_agg: LossAgg::SeqMeanTokenSumNorm,
            ..base
        },
    }
    /// RLOO (arXiv 2402.14740).
    Rloo = "rloo" {
        description: "RLOO: leave-one-out baseline, REINFORCE on the whole sequence (token sum, sequence mean)",
        surrogate: Clip,
        sequence_ratio: false,
        critic: false,
        proximal: ProximalRule::Any,
        own_keys: [],
        preset: |base, _| Options {
            baseline: Baseline::LeaveOneOut,
            scale: Scale::None,
            loss_agg: LossAgg::SeqMeanTokenSum,
            ..base
        },
    }
    /// DAPO (arXiv 2503.14476).
    Dapo = "dapo" {
        description: "DAPO: clip-higher, overlong punishment, dynamic filtering of all-equal groups, token mean",
        surrogate: Clip,
        sequence_ratio: false,
        critic: false,
        proximal: ProximalRule::Any,
        own_keys: [],
        preset: |base, max_new_tokens| Options {
            eps_clip_high: Some(0.28),
            dynamic_filter: true,
            // DAPO's 4096-token buffer of a 20480-token limit: a fifth
            overlong_buffer: max_new_tokens.map_or(0, |m| m / 5),
            ..base
        },
    }
    /// GSPO (arXiv 2507.18071).
    Gspo = "gspo" {
        description: "GSPO: sequence-level geometric-mean ratio, clipped per sequence",
        surrogate: Clip,
        sequence_ratio: true,
        critic: false,
        proximal: ProximalRule::Any,
        own_keys: [],
        preset: |base, _| Options {
            eps_clip: 3e-4,
            eps_clip_high: Some(4e-4),
            loss_agg: LossAgg::SeqMeanTokenMean,
            ..base
        },
    }
    /// SAPO (arXiv 2511.20347).
    Sapo = "sapo" {
        description: "SAPO: soft sigmoid gates on the ratio instead of clipping (coupled loss only)",
        surrogate: SoftGate,
        sequence_ratio: false,
        critic: false,
        proximal: ProximalRule::Coupled(
            "sapo's soft gate is defined on π_θ/π_old and is not combined with the decoupled \
             loss (as in AReaL): the behaviour weight would multiply a gate that already \
             bounds the update; use proximal = \"behaviour\"",
        ),
        own_keys: ["tau_pos", "tau_neg"],
        preset: |base, _| Options {
            loss_agg: LossAgg::SeqMeanTokenMean,
            ..base
        },
    }
    /// M2PO (arXiv 2510.01161).
    M2po = "m2po" {
        description: "M2PO: unclipped ratio, masking the tokens that push the second moment of log(π_θ/π_behav) over a bound",
        surrogate: SecondMoment,
        sequence_ratio: false,
        critic: false,
        proximal: ProximalRule::Any,
        own_keys: ["m2_threshold"],
        preset: |base, _| base,
    }
    /// REINFORCE++ (arXiv 2501.03262).
    ReinforcePlusPlus = "reinforce++" {
        description: "REINFORCE++: per-token KL penalty in the reward, returns whitened over the batch's tokens",
        surrogate: Clip,
        sequence_ratio: false,
        critic: false,
        proximal: ProximalRule::Any,
        own_keys: [],
        preset: |base, _| Options {
            baseline: Baseline::None,
            scale: Scale::None,
            token_whitening: true,
            kl_coef: 0.01,
            kl_estimator: KlEstimator::K1,
            kl_placement: KlPlacement::Reward,
            ..base
        },
    }
    /// AReaL's own "GRPO" recipe: decoupled PPO with batch-level normalisation.
    ArealGrpo = "areal-grpo" {
        description: "AReaL's \"GRPO\" recipe: decoupled PPO with reward bias/scale and batch mean/std",
        surrogate: Clip,
        sequence_ratio: false,
        critic: false,
        proximal: ProximalRule::Decoupled,
        own_keys: [],
        preset: |base, _| Options {
            eps_clip: 0.4,
            proximal: Proximal::Recompute,
            reward: RewardShaping {
                bias: -0.5,
                scale: 10.0,
                clip: Some(20.0),
            },
            baseline: Baseline::BatchMean,
            scale: Scale::BatchStd,
            ..base
        },
    }
}
