//! The options every variant shares, their defaults, and which combinations are allowed.

use areal_sdk::{BuildContext, PluginConfig, PluginError};
use areal_sdk_train::advantages::{Baseline, RewardShaping, Scale};

use crate::variants::{ProximalRule, Variant};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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

/// The options of every variant; each variant starts from its [`Variant::preset`].
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
}

impl Default for Options {
    fn default() -> Self {
        Self {
            eps_clip: 0.2,
            eps_clip_high: None,
            dual_clip: None,
            proximal: Proximal::Behaviour,
            behav_weight_cap: None,
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
        }
    }
}

/// Overlay `over` onto `base`, merging tables key by key.
fn overlay(base: &mut Map<String, Value>, over: &Map<String, Value>) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(Value::Object(b)), Value::Object(o)) => overlay(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The options of `variant` for a config section: its preset, overridden by the section's
/// keys, checked.
pub(crate) fn resolve(
    variant: Variant,
    config: &PluginConfig,
    ctx: &BuildContext,
) -> Result<Options, PluginError> {
    let key = |k: &str| format!("{}.{k}", config.path());
    for own in Variant::ALL.iter().flat_map(|v| v.own_keys()) {
        if config.params().contains_key(*own) && !variant.own_keys().contains(own) {
            let owners: Vec<&str> = Variant::ALL
                .iter()
                .filter(|v| v.own_keys().contains(own))
                .map(|v| v.name())
                .collect();
            return Err(PluginError::config(
                key(own),
                format!(
                    "only applies to {}, not to {}",
                    owners.join(", "),
                    variant.name()
                ),
            ));
        }
    }
    let Value::Object(mut table) =
        serde_json::to_value(variant.preset(ctx.max_new_tokens)).expect("options serialise")
    else {
        unreachable!("options serialise to a table")
    };
    overlay(&mut table, config.params());
    table.insert("kind".into(), Value::String(variant.name().into()));
    let mut options: Options =
        PluginConfig::from_value(config.path(), Value::Object(table))?.parse()?;
    // The length limits default to the rollout's, whatever the variant.
    options.loss_agg_constant = options.loss_agg_constant.or(ctx.max_new_tokens);
    options.overlong_max_tokens = options.overlong_max_tokens.or(ctx.max_new_tokens);
    check(variant, &options, config)?;
    Ok(options)
}

fn check(variant: Variant, o: &Options, config: &PluginConfig) -> Result<(), PluginError> {
    let bad = |k: &str, why: String| Err(config.invalid(k, why));
    let given = |k: &str| config.params().contains_key(k);
    let name = variant.name();
    let surrogate = variant.surrogate();

    // Clipping applies to the clipped surrogate only.
    if surrogate != Surrogate::Clip {
        for k in ["eps_clip", "eps_clip_high", "dual_clip"] {
            if given(k) {
                let why = match surrogate {
                    Surrogate::SoftGate => "sapo replaces clipping with a soft sigmoid gate",
                    _ => "m2po does not clip the ratio; it masks by second moment (m2_threshold)",
                };
                return bad(k, format!("does not apply: {why}"));
            }
        }
    } else {
        if !(o.eps_clip > 0.0 && o.eps_clip < 1.0) {
            return bad(
                "eps_clip",
                format!("must be in (0, 1), found {}", o.eps_clip),
            );
        }
        let high = o.eps_clip_high.unwrap_or(o.eps_clip);
        if high <= 0.0 {
            return bad("eps_clip_high", format!("must be positive, found {high}"));
        }
        if let Some(c) = o.dual_clip
            && c <= 1.0
        {
            return bad("dual_clip", format!("must be greater than 1, found {c}"));
        }
    }

    // Coupled or decoupled.
    match (variant.proximal_rule(), o.proximal) {
        (ProximalRule::Coupled(why), p) if p != Proximal::Behaviour => {
            return bad("proximal", why.into());
        }
        (ProximalRule::Decoupled, Proximal::Behaviour) => {
            return bad(
                "proximal",
                format!("{name} is the decoupled loss; with π_prox = π_behav it is kind = \"ppo\""),
            );
        }
        _ => {}
    }
    if o.behav_weight_cap.is_some() && o.proximal == Proximal::Behaviour {
        return bad(
            "behav_weight_cap",
            format!(
                "needs the decoupled loss (kind = \"decoupled-ppo\", or proximal = \"recompute\"): \
                 {name} has π_prox = π_behav here, so the behaviour weight is always 1"
            ),
        );
    }
    if let Some(cap) = o.behav_weight_cap
        && cap <= 1.0
    {
        return bad(
            "behav_weight_cap",
            format!("must be greater than 1, found {cap}"),
        );
    }

    // Aggregation.
    if o.loss_agg == LossAgg::SeqMeanTokenSumNorm {
        match o.loss_agg_constant {
            None => {
                return bad(
                    "loss_agg_constant",
                    "seq-mean-token-sum-norm needs a constant (the generation length limit); \
                     set it, or run under the engine, which passes rollout.max_new_tokens"
                        .into(),
                );
            }
            Some(0) => return bad("loss_agg_constant", "must be at least 1".into()),
            Some(_) => {}
        }
    }

    // A critic's advantages are GAE's; sequence baselines do not apply.
    if variant.critic() {
        for k in ["baseline", "scale"] {
            if given(k) {
                return bad(
                    k,
                    "does not apply to ppo-critic: its advantages come from GAE on the value head"
                        .into(),
                );
            }
        }
    }

    // KL.
    if !(o.kl_coef >= 0.0 && o.kl_coef.is_finite()) {
        return bad(
            "kl_coef",
            format!("must be a finite number ≥ 0, found {}", o.kl_coef),
        );
    }

    // Overlong punishment.
    if o.overlong_buffer > 0 {
        let Some(max) = o.overlong_max_tokens else {
            return bad(
                "overlong_max_tokens",
                "the overlong punishment (overlong_buffer > 0) needs the length limit".into(),
            );
        };
        if o.overlong_buffer >= max {
            return bad(
                "overlong_buffer",
                format!(
                    "must be below the length limit {max}, found {}",
                    o.overlong_buffer
                ),
            );
        }
    }
    if o.overlong_penalty < 0.0 {
        return bad(
            "overlong_penalty",
            format!("must be ≥ 0, found {}", o.overlong_penalty),
        );
    }

    // Variant-specific.
    if !(0.0..=1.0).contains(&o.gamma) {
        return bad("gamma", format!("must be in [0, 1], found {}", o.gamma));
    }
    if !(0.0..=1.0).contains(&o.lambda) {
        return bad("lambda", format!("must be in [0, 1], found {}", o.lambda));
    }
    if o.value_coef <= 0.0 {
        return bad(
            "value_coef",
            format!("must be positive, found {}", o.value_coef),
        );
    }
    if o.value_clip.is_nan() || o.value_clip < 0.0 {
        return bad(
            "value_clip",
            format!("must be ≥ 0 (0 turns clipping off), found {}", o.value_clip),
        );
    }
    for (k, tau) in [("tau_pos", o.tau_pos), ("tau_neg", o.tau_neg)] {
        if tau <= 0.0 {
            return bad(k, format!("must be positive, found {tau}"));
        }
    }
    if o.m2_threshold <= 0.0 {
        return bad(
            "m2_threshold",
            format!("must be positive, found {}", o.m2_threshold),
        );
    }
    Ok(())
}
