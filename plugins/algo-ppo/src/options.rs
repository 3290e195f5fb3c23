//! The options every variant shares, their defaults, and which combinations are allowed.

use areal_sdk_train::advantages::{Baseline, RewardShaping, Scale};
use serde::{Deserialize, Serialize};

/// The policy-gradient term of a variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Surrogate {
    /// `max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high))`, optionally dual-clipped.
    Clip,
    /// SAPO's soft gate: `−A · (4/τ)·σ(τ·(r − 1))`, τ by the sign of A.
    SoftGate,
    /// M2PO: `−A·r` without clipping, on the tokens left after masking the largest
    /// `(log π_θ/π_behav)²` until their mean is at most the threshold.
    SecondMoment,
}

/// Where π_prox comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Proximal {
    /// π_prox = π_behav: standard (coupled) PPO, no extra pass.
    #[default]
    Behaviour,
    /// A no-grad forward pass with the weights before the update (decoupled PPO).
    Recompute,
    /// The log-linear interpolation between behaviour and current logprobs by version.
    LogLinear,
}

/// What happens to tokens whose behaviour importance weight exceeds the cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapMode {
    /// Drop them from the loss (they still count in the normaliser).
    #[default]
    Mask,
    /// Use the cap as their weight.
    Clamp,
}

/// At which level the behaviour weight is capped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    /// Each token's own weight π_prox/π_behav.
    #[default]
    Token,
    /// The sequence's geometric-mean weight, used for all its tokens.
    Sequence,
}

/// How per-token losses become the mini-batch loss (verl's names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAgg {
    /// Sum over all tokens / tokens in the mini-batch (AReaL, DAPO).
    #[default]
    TokenMean,
    /// Mean over sequences of each sequence's token mean (GRPO, GSPO, SAPO).
    SeqMeanTokenMean,
    /// Mean over sequences of each sequence's token sum (RLOO: REINFORCE on the sequence).
    SeqMeanTokenSum,
    /// Sum over all tokens / (sequences × a constant) (Dr. GRPO).
    SeqMeanTokenSumNorm,
}

/// The estimator of KL(π ‖ π_ref) per token, with `d = log π − log π_ref`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KlEstimator {
    /// `d`.
    #[default]
    K1,
    /// `d² / 2`.
    K2,
    /// `exp(−d) + d − 1` (non-negative, unbiased; GRPO's).
    K3,
}

impl KlEstimator {
    /// The estimate for `d = log π − log π_ref`.
    pub fn of(self, d: f64) -> f64 {
        match self {
            KlEstimator::K1 => d,
            KlEstimator::K2 => 0.5 * d * d,
            KlEstimator::K3 => (-d).exp() + d - 1.0,
        }
    }
}

/// Where the KL penalty to the reference policy goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KlPlacement {
    /// A term `β·KL(π_θ ‖ π_ref)` of the loss, aggregated like the policy loss (GRPO).
    #[default]
    Loss,
    /// A per-token reward `−β·KL(π_old ‖ π_ref)` before advantages (RLHF, REINFORCE++).
    Reward,
}

/// The options of every variant; each variant starts from its
/// [`Variant::preset`](crate::Variant::preset).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// ε_low: the ratio is clipped below at 1 − ε_low. By default 0.2.
    pub eps_clip: f64,
    /// ε_high: the ratio is clipped above at 1 + ε_high; by default `eps_clip`.
    pub eps_clip_high: Option<f64>,
    /// Dual-clip constant c > 1 bounding the loss of negative-advantage tokens at −c·A.
    pub dual_clip: Option<f64>,
    /// Where π_prox comes from.
    pub proximal: Proximal,
    /// Upper bound on the behaviour importance weight π_prox/π_behav.
    pub behav_weight_cap: Option<f64>,
    /// Lower bound on the behaviour importance weight: with `behav_weight_mode = "mask"`,
    /// tokens whose weight falls outside [floor, cap] leave the loss (IcePop's two-sided
    /// mask); with `"clamp"` the weight is clamped into it.
    pub behav_weight_floor: Option<f64>,
    /// What happens above the cap.
    pub behav_weight_mode: CapMode,
    /// Whether the cap looks at tokens or sequences.
    pub behav_weight_level: Level,
    /// How per-token losses are aggregated.
    pub loss_agg: LossAgg,
    /// The constant of `seq-mean-token-sum-norm`; by default `rollout.max_new_tokens`.
    pub loss_agg_constant: Option<usize>,
    /// β of the KL penalty to the reference policy; 0 turns it (and the reference) off.
    pub kl_coef: f64,
    /// KL estimator.
    pub kl_estimator: KlEstimator,
    /// Where the KL penalty goes.
    pub kl_placement: KlPlacement,
    /// Reward shaping before advantages.
    pub reward: RewardShaping,
    /// DAPO's soft overlong punishment: the last `overlong_buffer` tokens before
    /// `overlong_max_tokens` cost up to `overlong_penalty`, linearly. 0 turns it off.
    pub overlong_buffer: usize,
    /// The length limit of the overlong punishment; by default `rollout.max_new_tokens`.
    pub overlong_max_tokens: Option<usize>,
    /// The largest overlong punishment.
    pub overlong_penalty: f64,
    /// Baseline subtracted from the return.
    pub baseline: Baseline,
    /// What the centred return is divided by.
    pub scale: Scale,
    /// Whiten the per-token advantages over all tokens of the batch.
    pub token_whitening: bool,
    /// Drop groups whose rewards are all equal (they carry no signal).
    pub dynamic_filter: bool,
    /// GAE discount (ppo-critic).
    pub gamma: f64,
    /// GAE λ (ppo-critic).
    pub lambda: f64,
    /// Weight of the value loss (ppo-critic).
    pub value_coef: f64,
    /// Clip range of the value update (ppo-critic); 0 turns clipping off.
    pub value_clip: f64,
    /// SAPO's gate temperature for positive advantages.
    pub tau_pos: f64,
    /// SAPO's gate temperature for negative advantages.
    pub tau_neg: f64,
    /// M2PO's bound on the mean of (log π_θ/π_behav)² over kept tokens.
    pub m2_threshold: f64,
    /// Token-level staleness cut: tokens whose lag (the trainer's version minus the version
    /// that sampled them) exceeds this leave the loss; their sample stays (its reward in the
    /// baseline, its other tokens trained). None by default.
    pub max_token_lag: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            eps_clip: 0.2,
            eps_clip_high: None,
            dual_clip: None,
            proximal: Proximal::Behaviour,
            behav_weight_cap: None,
            behav_weight_floor: None,
            behav_weight_mode: CapMode::Mask,
            behav_weight_level: Level::Token,
            loss_agg: LossAgg::TokenMean,
            loss_agg_constant: None,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K1,
            kl_placement: KlPlacement::Loss,
            reward: RewardShaping::default(),
            overlong_buffer: 0,
            overlong_max_tokens: None,
            overlong_penalty: 1.0,
            baseline: Baseline::GroupMean,
            scale: Scale::GroupStd,
            token_whitening: false,
            dynamic_filter: false,
            gamma: 1.0,
            lambda: 1.0,
            value_coef: 0.5,
            value_clip: 0.2,
            tau_pos: 1.0,
            tau_neg: 1.05,
            m2_threshold: 0.04,
            max_token_lag: None,
        }
    }
}
