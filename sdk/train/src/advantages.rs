//! Advantage estimation helpers shared by algorithms: reward shaping, baselines and scaling
//! ([`centre`] for any per-sample score, [`sequence_advantages`] for rewards), whitening over
//! a batch's tokens, and broadcasting a sequence-level advantage to its tokens.
//!
//! All functions work on plain numbers in the order the engine hands groups over: groups in
//! order, samples in order within each group ("flat order").

use areal_sdk::TrajectoryGroup;
use serde::{Deserialize, Serialize};

/// Reward shaping `clip((r + bias) · scale, −clip, +clip)`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardShaping {
    /// Added to the raw reward. By default 0.
    pub bias: f64,
    /// Multiplies the biased reward. By default 1.
    pub scale: f64,
    /// Symmetric bound on the shaped reward; `None` (the default) leaves it unbounded.
    pub clip: Option<f64>,
}

impl Default for RewardShaping {
    fn default() -> Self {
        Self {
            bias: 0.0,
            scale: 1.0,
            clip: None,
        }
    }
}

impl RewardShaping {
    /// The shaped reward.
    pub fn apply(&self, reward: f64) -> f64 {
        let shaped = (reward + self.bias) * self.scale;
        match self.clip {
            Some(c) => shaped.clamp(-c.abs(), c.abs()),
            None => shaped,
        }
    }
}

/// What is subtracted from a sample's shaped reward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Baseline {
    /// Nothing.
    None,
    /// Mean reward of the sample's group (same prompt).
    GroupMean,
    /// Mean reward of the whole batch.
    BatchMean,
    /// Mean reward of the other samples of the group (RLOO); 0 for a group of one.
    LeaveOneOut,
}

/// What the centred reward is divided by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scale {
    /// Nothing.
    None,
    /// Standard deviation of the group's shaped rewards (+ [`STD_EPS`]).
    GroupStd,
    /// Standard deviation of the batch's shaped rewards (+ [`STD_EPS`]).
    BatchStd,
}

/// Added to a standard deviation before dividing by it.
pub const STD_EPS: f64 = 1e-6;

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Unbiased (n − 1) standard deviation, as PyTorch's `Tensor.std()`; 0 for fewer than two
/// values.
pub fn std_unbiased(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let m = mean(values);
    let var = values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (values.len() - 1) as f64;
    var.sqrt()
}

/// One scalar advantage per sample, in flat order: `(shape(r) − baseline) / scale`.
pub fn sequence_advantages(
    groups: &[TrajectoryGroup],
    shaping: &RewardShaping,
    baseline: Baseline,
    scale: Scale,
) -> Vec<f64> {
    let shaped: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.samples.iter().map(|s| shaping.apply(s.reward.total())))
        .collect();
    let sizes: Vec<usize> = groups.iter().map(|g| g.samples.len()).collect();
    centre(&shaped, &sizes, baseline, scale)
        .into_iter()
        .zip(&shaped)
        .map(|((b, s), r)| (r - b) / s)
        .collect()
}

/// The baseline and the divisor of every score, in flat order: `scores` holds one number per
/// sample and `group_sizes` how many consecutive samples make each group. The advantage of a
/// score `x` with `(b, s)` is `(x − b) / s`.
pub fn centre(
    scores: &[f64],
    group_sizes: &[usize],
    baseline: Baseline,
    scale: Scale,
) -> Vec<(f64, f64)> {
    let batch_mean = mean(scores);
    let batch_std = std_unbiased(scores);
    let mut out = Vec::with_capacity(scores.len());
    let mut start = 0;
    for &n in group_sizes {
        let group = &scores[start..start + n];
        start += n;
        let group_mean = mean(group);
        let group_std = std_unbiased(group);
        for &r in group {
            let b = match baseline {
                Baseline::None => 0.0,
                Baseline::GroupMean => group_mean,
                Baseline::BatchMean => batch_mean,
                Baseline::LeaveOneOut if n > 1 => (group_mean * n as f64 - r) / (n - 1) as f64,
                Baseline::LeaveOneOut => 0.0,
            };
            let s = match scale {
                Scale::None => 1.0,
                Scale::GroupStd => group_std + STD_EPS,
                Scale::BatchStd => batch_std + STD_EPS,
            };
            out.push((b, s));
        }
    }
    out
}

/// Whiten per-token values over every token of the batch: `(x − mean) / (std + STD_EPS)`,
/// with the unbiased standard deviation of all tokens (REINFORCE++'s global normalisation).
pub fn whiten(per_token: &mut [Vec<f64>]) {
    let all: Vec<f64> = per_token.iter().flatten().copied().collect();
    let (m, s) = (mean(&all), std_unbiased(&all) + STD_EPS);
    for x in per_token.iter_mut().flatten() {
        *x = (*x - m) / s;
    }
}

/// Which tokens of each sample's completion a policy sampled (true) and which the environment
/// of an episode wrote (false), in flat order.
pub fn sampled_masks(groups: &[TrajectoryGroup]) -> Vec<Vec<bool>> {
    groups
        .iter()
        .flat_map(|g| &g.samples)
        .map(|s| {
            let c = &s.completion;
            (0..c.len()).map(|i| c.is_sampled(i)).collect()
        })
        .collect()
}

/// Each sample's per-token `values` at its sampled tokens only (`masks` from
/// [`sampled_masks`]): what a recursion over the policy's tokens (returns-to-go, GAE) or a
/// statistic over them (whitening) works on.
pub fn only_sampled<T: Copy>(values: &[Vec<T>], masks: &[Vec<bool>]) -> Vec<Vec<T>> {
    values
        .iter()
        .zip(masks)
        .map(|(v, m)| {
            v.iter()
                .zip(m)
                .filter(|(_, keep)| **keep)
                .map(|(x, _)| *x)
                .collect()
        })
        .collect()
}

/// The inverse of [`only_sampled`]: each sample's values back at its sampled tokens, `fill`
/// at the environment's.
pub fn at_sampled<T: Copy>(values: Vec<Vec<T>>, masks: &[Vec<bool>], fill: T) -> Vec<Vec<T>> {
    values
        .into_iter()
        .zip(masks)
        .map(|(v, m)| {
            let mut v = v.into_iter();
            m.iter()
                .map(|&keep| if keep { v.next().unwrap_or(fill) } else { fill })
                .collect()
        })
        .collect()
}

/// Give every generated token of each sample its sample's scalar advantage (γ = λ = 1 without
/// a critic, where the return of every token is the final reward).
pub fn broadcast(groups: &[TrajectoryGroup], per_sample: &[f64]) -> Vec<Vec<f32>> {
    groups
        .iter()
        .flat_map(|g| g.samples.iter())
        .zip(per_sample)
        .map(|(s, &a)| vec![a as f32; s.completion.len()])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use areal_sdk::{Completion, FinishReason, Reward, Trajectory, Verdict};

    fn group(rewards: &[f64]) -> TrajectoryGroup {
        TrajectoryGroup {
            group_id: 0,
            item_id: "x".into(),
            prompt_ids: vec![1],
            admitted_at: 0,
            samples: rewards
                .iter()
                .enumerate()
                .map(|(i, &r)| Trajectory {
                    sample_id: i as u64,
                    completion: Completion {
                        token_ids: vec![1; i + 1],
                        behaviour_logprobs: vec![-0.5; i + 1],
                        versions: vec![0; i + 1],
                        finish_reason: FinishReason::Stop,
                    },
                    reward: Reward::new(r, Verdict::Partial),
                })
                .collect(),
        }
    }

    #[test]
    fn group_mean_and_std() {
        let groups = [group(&[1.0, 0.0, 0.0, 1.0]), group(&[2.0, 2.0])];
        let adv = sequence_advantages(
            &groups,
            &RewardShaping::default(),
            Baseline::GroupMean,
            Scale::GroupStd,
        );
        // group 1: mean 0.5, unbiased std sqrt(1/3)
        let s = (1.0f64 / 3.0).sqrt() + STD_EPS;
        let want = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0];
        for (a, w) in adv.iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{adv:?}");
        }
    }

    #[test]
    fn leave_one_out_and_batch() {
        let groups = [group(&[1.0, 0.0, 0.5])];
        let adv = sequence_advantages(
            &groups,
            &RewardShaping::default(),
            Baseline::LeaveOneOut,
            Scale::None,
        );
        assert_eq!(adv, vec![1.0 - 0.25, 0.0 - 0.75, 0.5 - 0.5]);
        let shaping = RewardShaping {
            bias: -0.5,
            scale: 4.0,
            clip: Some(1.5),
        };
        let adv = sequence_advantages(&groups, &shaping, Baseline::BatchMean, Scale::None);
        // shaped: 1.5 (clipped from 2), -1.5 (clipped from -2), 0; mean 0
        assert_eq!(adv, vec![1.5, -1.5, 0.0]);
        let tokens = broadcast(&groups, &adv);
        assert_eq!(
            tokens,
            vec![vec![1.5], vec![-1.5, -1.5], vec![0.0, 0.0, 0.0]]
        );
    }

    #[test]
    fn whitening_uses_every_token_of_the_batch() {
        let mut tokens = vec![vec![1.0, 1.0, 1.0], vec![-1.0]];
        whiten(&mut tokens);
        let all: Vec<f64> = tokens.iter().flatten().copied().collect();
        // mean 0.5, unbiased std 1: (x − 0.5) / (1 + 1e-6)
        let s = 1.0 + STD_EPS;
        let want = [0.5 / s, 0.5 / s, 0.5 / s, -1.5 / s];
        for (a, w) in all.iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{all:?}");
        }
        // centre works on any per-sample score with group boundaries
        let pairs = centre(&[3.0, 1.0, 5.0], &[2, 1], Baseline::GroupMean, Scale::None);
        assert_eq!(pairs, vec![(2.0, 1.0), (2.0, 1.0), (5.0, 1.0)]);
    }
}
