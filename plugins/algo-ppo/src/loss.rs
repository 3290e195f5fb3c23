//! The loss of one micro-batch: ratio, surrogate, behaviour weight, KL term, aggregation and
//! the value loss.

use std::ops::Range;

use areal_sdk::PluginError;
use areal_sdk_train::burn::tensor::activation::sigmoid;
use areal_sdk_train::burn::tensor::{Device, Tensor, TensorData};
use areal_sdk_train::{LossInput, LossOutput, LossStats};

use crate::options::{
    CapMode, KlEstimator, KlPlacement, Level, LossAgg, Options, Proximal, Surrogate,
};
use crate::variants::Variant;

/// Sum of `values` over the tokens where `mask` is 1, as an f64.
fn masked_sum(values: Tensor<1>, mask: &Tensor<1>) -> f64 {
    f64::from((values * mask.clone()).sum().into_scalar::<f32>())
}

fn host(t: Tensor<1>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("converted to f32")
}

fn tensor(values: Vec<f32>, device: &Device) -> Tensor<1> {
    let n = values.len();
    Tensor::<1>::from_data(TensorData::new(values, [n]), device)
}

/// Each completion's trained tokens (the loss mask's, within its range), as a
/// `[sequences, tokens]` indicator matrix: per-sequence means and broadcasts are matrix
/// products, so gradients flow through them.
struct Segments {
    matrix: Tensor<2>,
    inv_len: Tensor<1>,
    count: usize,
}

impl Segments {
    fn new(input: &LossInput, n: usize, device: &Device) -> Self {
        let completions: &[Range<usize>] = &input.completions;
        let s = completions.len();
        let mut m = vec![0.0f32; s * n];
        for (i, r) in completions.iter().enumerate() {
            for t in r.clone() {
                if input.versions[t] != areal_sdk::PROMPT_VERSION {
                    m[i * n + t] = 1.0;
                }
            }
        }
        let inv_len = (0..s)
            .map(|i| 1.0 / input.trained_tokens(i).max(1) as f32)
            .collect();
        Self {
            matrix: Tensor::<2>::from_data(TensorData::new(m, [s, n]), device),
            inv_len: tensor(inv_len, device),
            count: s,
        }
    }

    /// Every trained token gets the mean of its sequence's `x`; the others get 0.
    fn broadcast_mean(&self, x: Tensor<1>) -> Tensor<1> {
        let n = x.dims()[0];
        let sums = self
            .matrix
            .clone()
            .matmul(x.reshape([n, 1]))
            .reshape([self.count]);
        let means = sums * self.inv_len.clone();
        self.matrix
            .clone()
            .transpose()
            .matmul(means.reshape([self.count, 1]))
            .reshape([n])
    }
}

/// The per-token estimate of KL(π ‖ π_ref) for `d = log π − log π_ref`.
fn kl(estimator: KlEstimator, d: Tensor<1>) -> Tensor<1> {
    match estimator {
        KlEstimator::K1 => d,
        KlEstimator::K2 => d.clone().mul(d).mul_scalar(0.5),
        KlEstimator::K3 => d.clone().neg().exp() + d - 1.0,
    }
}

/// M2PO's mask: drop the tokens with the largest `d²` until the mean `d²` of the rest is at
/// most `threshold`. Returns the keep mask (1/0) and the number dropped.
pub fn second_moment_mask(d: &[f32], mask: &[f32], threshold: f64) -> (Vec<f32>, usize) {
    let mut order: Vec<usize> = (0..d.len()).filter(|&t| mask[t] > 0.0).collect();
    let sq = |t: usize| f64::from(d[t]) * f64::from(d[t]);
    order.sort_by(|&a, &b| sq(b).total_cmp(&sq(a)).then(a.cmp(&b)));
    let mut total: f64 = order.iter().map(|&t| sq(t)).sum();
    let mut count = order.len();
    let mut keep = mask.to_vec();
    let mut dropped = 0;
    for &t in &order {
        if count == 0 || total / count as f64 <= threshold {
            break;
        }
        total -= sq(t);
        count -= 1;
        keep[t] = 0.0;
        dropped += 1;
    }
    (keep, dropped)
}

/// The loss of `variant` with options `o` on one micro-batch.
pub(crate) fn loss(
    variant: Variant,
    o: &Options,
    input: &LossInput,
) -> Result<LossOutput, PluginError> {
    let mask = input.loss_mask.clone();
    let n = mask.dims()[0];
    let device = mask.device();
    let adv = input.advantages.clone();
    let current = input.current.0.clone();
    let proximal = input.proximal.0.clone().detach();
    let behaviour = input.behaviour.0.clone().detach();
    let needs_segments = variant.sequence_ratio()
        || (o.behav_weight_level == Level::Sequence && o.proximal != Proximal::Behaviour);
    let segments = needs_segments.then(|| Segments::new(input, n, &device));

    let mut stats = LossStats::default();
    let tokens = masked_sum(mask.clone(), &mask);

    // Masked positions (prompt tokens) are zeroed before exp so they cannot overflow.
    let token_log_ratio = (current.clone() - proximal.clone()) * mask.clone();
    let log_ratio = match &segments {
        Some(s) if variant.sequence_ratio() => s.broadcast_mean(token_log_ratio.clone()),
        _ => token_log_ratio.clone(),
    };
    let ratio = log_ratio.exp();
    let mut loss_mask = mask.clone();

    let mut per_token = match variant.surrogate() {
        Surrogate::Clip => {
            let eps_low = o.eps_clip;
            let eps_high = o.eps_clip_high.unwrap_or(o.eps_clip);
            let clipped_ratio = ratio.clone().clamp(1.0 - eps_low, 1.0 + eps_high);
            let surrogate = adv.clone().neg() * ratio.clone();
            let surrogate_clipped = adv.clone().neg() * clipped_ratio;
            let clip_active = surrogate_clipped.clone().greater(surrogate.clone()).float();
            stats.add("clip_fraction", masked_sum(clip_active, &mask), tokens);
            let mut per_token = surrogate.max_pair(surrogate_clipped);
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
            per_token
        }
        Surrogate::SoftGate => {
            let positive = adv.clone().greater_elem(0.0);
            let tau = Tensor::<1>::full([n], o.tau_neg as f32, &device)
                .mask_fill(positive, o.tau_pos as f32);
            let gate = sigmoid(tau.clone() * (ratio.clone() - 1.0)).mul_scalar(4.0) / tau;
            stats.add("gate", masked_sum(gate.clone(), &mask), tokens);
            gate.neg() * adv.clone()
        }
        Surrogate::SecondMoment => {
            let d = host((current.clone().detach() - behaviour.clone()) * mask.clone());
            let m = host(mask.clone());
            let m2: f64 = d.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            stats.add("m2", m2, tokens);
            let (keep, dropped) = second_moment_mask(&d, &m, o.m2_threshold);
            stats.add("m2_masked_fraction", dropped as f64, tokens);
            loss_mask = loss_mask * tensor(keep, &device);
            adv.clone().neg() * ratio.clone()
        }
    };

    if o.proximal != Proximal::Behaviour {
        let token_log_w = (proximal.clone() - behaviour.clone()) * mask.clone();
        let log_w = match (&segments, o.behav_weight_level) {
            (Some(s), Level::Sequence) => s.broadcast_mean(token_log_w),
            _ => token_log_w,
        };
        let weight = log_w.exp();
        stats.add("behav_weight", masked_sum(weight.clone(), &mask), tokens);
        let live = mask.clone().greater_elem(0.0);
        let over = o.behav_weight_cap.map(|cap| {
            let over = weight.clone().greater_elem(cap).bool_and(live.clone());
            stats.add(
                "behav_capped_fraction",
                masked_sum(over.clone().float(), &mask),
                tokens,
            );
            (cap, over)
        });
        let under = o.behav_weight_floor.map(|floor| {
            let under = weight.clone().lower_elem(floor).bool_and(live.clone());
            stats.add(
                "behav_floored_fraction",
                masked_sum(under.clone().float(), &mask),
                tokens,
            );
            (floor, under)
        });
        let weight = match o.behav_weight_mode {
            CapMode::Mask => {
                for (_, outside) in over.into_iter().chain(under) {
                    loss_mask = loss_mask.mask_fill(outside, 0.0);
                }
                weight
            }
            CapMode::Clamp => {
                let weight = match over {
                    Some((cap, _)) => weight.clamp_max(cap),
                    None => weight,
                };
                match under {
                    Some((floor, _)) => weight.clamp_min(floor),
                    None => weight,
                }
            }
        };
        per_token = per_token * weight;
    }

    if let Some(bound) = o.max_token_lag {
        let keep: Vec<f32> = input
            .versions
            .iter()
            .map(|&v| {
                let lag = input.trainer_version.saturating_sub(v);
                if v == areal_sdk::PROMPT_VERSION || lag <= bound {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        let keep = tensor(keep, &device);
        stats.add(
            "lag_masked_fraction",
            masked_sum(keep.clone().neg() + 1.0, &mask),
            tokens,
        );
        loss_mask = loss_mask * keep;
    }

    if let Some(reference) = &input.reference {
        let d = (current.clone() - reference.0.clone().detach()) * mask.clone();
        let k = kl(o.kl_estimator, d);
        stats.add("kl_ref", masked_sum(k.clone().detach(), &mask), tokens);
        if o.kl_coef > 0.0 && o.kl_placement == KlPlacement::Loss {
            per_token = per_token + k.mul_scalar(o.kl_coef);
        }
    } else if o.kl_coef > 0.0 && o.kl_placement == KlPlacement::Loss {
        return Err(PluginError::failed(
            variant.name(),
            "the KL term needs reference logprobs, and the engine gave none",
        ));
    }

    stats.add("ratio", masked_sum(ratio, &mask), tokens);
    // k1 estimate of KL(π_prox ‖ π_θ) over the micro-batch's tokens
    stats.add(
        "approx_kl",
        masked_sum(token_log_ratio.neg(), &mask),
        tokens,
    );
    stats.add("advantage", masked_sum(adv, &mask), tokens);

    // Aggregation: a per-token weight whose sum over the mini-batch's tokens is the mean.
    let sequences = input.minibatch_sequences.max(1) as f32;
    let mut weights = vec![0.0f32; n];
    for (i, r) in input.completions.iter().enumerate() {
        let w = match o.loss_agg {
            LossAgg::TokenMean => 1.0 / input.minibatch_tokens.max(1) as f32,
            LossAgg::SeqMeanTokenMean => 1.0 / (input.trained_tokens(i).max(1) as f32 * sequences),
            LossAgg::SeqMeanTokenSum => 1.0 / sequences,
            LossAgg::SeqMeanTokenSumNorm => {
                1.0 / (sequences * o.loss_agg_constant.unwrap_or(1).max(1) as f32)
            }
        };
        weights[r.clone()].fill(w);
    }
    let mut loss = (per_token * loss_mask * tensor(weights, &device)).sum();

    if variant.critic() {
        let Some(critic) = &input.critic else {
            return Err(PluginError::failed(
                variant.name(),
                "the value loss needs values, and the engine gave none",
            ));
        };
        let returns = critic.returns.clone().detach();
        let values = critic.values.clone();
        let unclipped = (values.clone() - returns.clone()).powi_scalar(2);
        let per_token = match Some(o.value_clip).filter(|c| *c > 0.0) {
            Some(c) => {
                let old = critic.old_values.clone().detach();
                let clipped_v = old.clone() + (values - old).clamp(-c, c);
                let clipped = (clipped_v - returns).powi_scalar(2);
                stats.add(
                    "value_clip_fraction",
                    masked_sum(clipped.clone().greater(unclipped.clone()).float(), &mask),
                    tokens,
                );
                unclipped.max_pair(clipped)
            }
            None => unclipped,
        }
        .mul_scalar(0.5);
        stats.add(
            "value_loss",
            masked_sum(per_token.clone().detach(), &mask),
            tokens,
        );
        let value_loss = (per_token * mask.clone())
            .sum()
            .div_scalar(input.minibatch_tokens.max(1) as f32);
        loss = loss + value_loss.mul_scalar(o.value_coef);
    }
    Ok(LossOutput { loss, stats })
}
