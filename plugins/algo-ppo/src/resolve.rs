//! A variant's options for a config section: its preset, overridden by the keys given, and
//! checked (combinations that make no sense are refused with the reason).

use areal_sdk::{BuildContext, PluginConfig, PluginError};
use serde_json::{Map, Value};

use crate::options::{LossAgg, Options, Proximal, Surrogate};
use crate::variants::{ProximalRule, Variant};

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
    // bounds on the behaviour weight, which is 1 in the coupled loss
    for (k, set) in [
        ("behav_weight_cap", o.behav_weight_cap.is_some()),
        ("behav_weight_floor", o.behav_weight_floor.is_some()),
    ] {
        if set && o.proximal == Proximal::Behaviour {
            return bad(
                k,
                format!(
                    "needs the decoupled loss (kind = \"decoupled-ppo\", or proximal = \"recompute\"): \
                     {name} has π_prox = π_behav here, so the behaviour weight is always 1"
                ),
            );
        }
    }
    if let Some(cap) = o.behav_weight_cap
        && cap <= 1.0
    {
        return bad(
            "behav_weight_cap",
            format!("must be greater than 1, found {cap}"),
        );
    }
    if let Some(floor) = o.behav_weight_floor
        && !(floor > 0.0 && floor < 1.0)
    {
        return bad(
            "behav_weight_floor",
            format!("must be in (0, 1), found {floor}"),
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
