//! Mismatch apart from staleness: how far the generators' logprobs are from the trainer's
//! recomputation of the same tokens with the weights the step starts from.
//!
//! Every trained token has a behaviour logprob (the generator's, under the version that
//! sampled it) and the trainer's logprob under version k (the weights the step starts from):
//! with the proximal recompute, every token of the batch from its no-grad pass; without it,
//! the tokens of the step's first mini-batch from that mini-batch's forward pass, which runs
//! before any update (all tokens with one mini-batch). For a token sampled by version k
//! itself the two differ only by *mismatch* (the generator and the trainer computing the same
//! distribution differently: kernels, precision, batching); for a token sampled by version
//! k − lag they also differ by *staleness* (the policy moved lag versions since). Both are summarised with the same
//! numbers, on `log r = log π_trainer − log π_generator` per token:
//! - `abs_mean`, `abs_max`: mean and largest |log r|;
//! - `kl_k1`: mean −log r, the k1 estimate of KL(π_generator ‖ π_trainer) on the generator's
//!   samples; `kl_k3`: mean exp(log r) − log r − 1, its k3 estimate (unbiased, ≥ 0);
//! - `log_ppl_diff`: over sequences, the mean of each sequence's mean log r: the generator's
//!   log-perplexity of its tokens minus the trainer's (verl's `rollout_corr/log_ppl_diff`).

use std::collections::BTreeMap;

use areal_sdk::{PROMPT_VERSION, PolicyVersion};
use serde::{Deserialize, Serialize};

use super::batch::Sequence;

/// The difference of trainer and generator logprobs over a set of tokens.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogprobGap {
    /// Tokens compared.
    pub tokens: u64,
    /// Mean |log π_trainer − log π_generator|.
    pub abs_mean: f64,
    /// Largest |log π_trainer − log π_generator|.
    pub abs_max: f64,
    /// Mean of log π_generator − log π_trainer (k1 estimate of KL(π_generator ‖ π_trainer)).
    pub kl_k1: f64,
    /// Mean of r − log r − 1 with r = π_trainer/π_generator (k3 estimate of the same KL).
    pub kl_k3: f64,
    /// Mean over sequences of the mean of log π_trainer − log π_generator over the
    /// sequence's tokens counted here (the log-perplexity difference).
    pub log_ppl_diff: f64,
}

/// Mismatch and staleness of one step's batch (every token with the proximal recompute, the
/// first mini-batch's without it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OffPolicyStats {
    /// Tokens sampled by the trainer's version k: generator against trainer, same weights.
    pub mismatch: LogprobGap,
    /// Tokens sampled by an older version (lag ≥ 1): π_behav against π_prox.
    pub staleness: LogprobGap,
    /// `staleness` by token lag (keys are the lag, "1", "2", ...; lags above 8 under "9+").
    pub staleness_by_lag: BTreeMap<String, LogprobGap>,
}

/// Running sums of one [`LogprobGap`].
#[derive(Default)]
struct Gap {
    tokens: u64,
    abs_sum: f64,
    abs_max: f64,
    k1_sum: f64,
    k3_sum: f64,
    /// Σ over sequences of the sequence's mean, and how many sequences.
    seq_sum: f64,
    seqs: u64,
    /// The current sequence's Σ log r and tokens.
    cur_sum: f64,
    cur_n: u64,
}

impl Gap {
    fn add(&mut self, log_r: f64) {
        self.tokens += 1;
        self.abs_sum += log_r.abs();
        self.abs_max = self.abs_max.max(log_r.abs());
        self.k1_sum -= log_r;
        self.k3_sum += log_r.exp() - log_r - 1.0;
        self.cur_sum += log_r;
        self.cur_n += 1;
    }

    fn end_sequence(&mut self) {
        if self.cur_n > 0 {
            self.seq_sum += self.cur_sum / self.cur_n as f64;
            self.seqs += 1;
        }
        self.cur_sum = 0.0;
        self.cur_n = 0;
    }

    fn finish(&self) -> LogprobGap {
        let per = |x: f64| {
            if self.tokens > 0 {
                x / self.tokens as f64
            } else {
                0.0
            }
        };
        LogprobGap {
            tokens: self.tokens,
            abs_mean: per(self.abs_sum),
            abs_max: self.abs_max,
            kl_k1: per(self.k1_sum),
            kl_k3: per(self.k3_sum),
            log_ppl_diff: if self.seqs > 0 {
                self.seq_sum / self.seqs as f64
            } else {
                0.0
            },
        }
    }
}

/// The bucket of a token lag ≥ 1 in [`OffPolicyStats::staleness_by_lag`].
fn bucket(lag: u64) -> String {
    if lag > 8 {
        "9+".into()
    } else {
        lag.to_string()
    }
}

/// Mismatch and staleness of `seqs`, whose trained tokens' logprobs under the trainer's
/// version `version` are `proximal[i]`, token for token; a sequence with none (not in the
/// mini-batch measured) is left out.
pub(super) fn measure(
    seqs: &[Sequence],
    proximal: &[Vec<f32>],
    version: PolicyVersion,
) -> OffPolicyStats {
    let mut mismatch = Gap::default();
    let mut staleness = Gap::default();
    let mut by_lag: BTreeMap<String, Gap> = BTreeMap::new();
    for (s, p) in seqs.iter().zip(proximal) {
        if p.is_empty() {
            continue;
        }
        for t in s.completion() {
            let v = s.versions[t];
            if v == PROMPT_VERSION {
                continue;
            }
            let log_r = f64::from(p[t]) - f64::from(s.behaviour[t]);
            // a token of a version newer than the trainer's would be a generator's bug: lag 0
            match version.saturating_sub(v) {
                0 => mismatch.add(log_r),
                lag => {
                    staleness.add(log_r);
                    by_lag.entry(bucket(lag)).or_default().add(log_r);
                }
            }
        }
        mismatch.end_sequence();
        staleness.end_sequence();
        by_lag.values_mut().for_each(Gap::end_sequence);
    }
    OffPolicyStats {
        mismatch: mismatch.finish(),
        staleness: staleness.finish(),
        staleness_by_lag: by_lag.into_iter().map(|(k, g)| (k, g.finish())).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(behaviour: &[f32], versions: &[u64]) -> Sequence {
        let n = behaviour.len();
        Sequence {
            tokens: vec![1; n + 1],
            prompt_len: 1,
            behaviour: std::iter::once(0.0)
                .chain(behaviour.iter().copied())
                .collect(),
            versions: std::iter::once(PROMPT_VERSION)
                .chain(versions.iter().copied())
                .collect(),
            withheld: false,
            advantages: Vec::new(),
            returns: Vec::new(),
        }
    }

    #[test]
    fn mismatch_and_staleness_are_measured_apart_by_token_lag() {
        // trainer at version 5; the proximal logprobs lead the behaviour ones by these log r
        let seqs = [
            seq(&[-1.0, -2.0, -0.5], &[5, 4, 4]),
            seq(&[-0.3, -1.2], &[3, 5]),
        ];
        let log_r = [[0.01f32, 0.2, -0.4], [0.5, -0.03, 0.0]];
        let proximal: Vec<Vec<f32>> = seqs
            .iter()
            .zip(&log_r)
            .map(|(s, r)| {
                let mut p = vec![0.0];
                p.extend(s.behaviour[1..].iter().zip(r).map(|(b, r)| b + r));
                p
            })
            .collect();
        let m = measure(&seqs, &proximal, 5);
        let k3 = |r: f64| r.exp() - r - 1.0;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6;

        // version 5: log r 0.01 (sequence 0) and −0.03 (sequence 1)
        let (a, b) = (f64::from(0.01f32), f64::from(-0.03f32));
        assert_eq!(m.mismatch.tokens, 2);
        assert!(close(m.mismatch.abs_mean, (a.abs() + b.abs()) / 2.0));
        assert!(close(m.mismatch.abs_max, 0.03));
        assert!(close(m.mismatch.kl_k1, -(a + b) / 2.0));
        assert!(close(m.mismatch.kl_k3, (k3(a) + k3(b)) / 2.0));
        assert!(close(m.mismatch.log_ppl_diff, (a + b) / 2.0));

        // lag 1: 0.2, −0.4 (sequence 0); lag 2: 0.5 (sequence 1)
        assert_eq!(m.staleness.tokens, 3);
        assert!(close(m.staleness.abs_mean, (0.2 + 0.4 + 0.5) / 3.0));
        assert!(close(m.staleness.abs_max, 0.5));
        // per sequence: (0.2 − 0.4)/2 and 0.5
        assert!(close(m.staleness.log_ppl_diff, (-0.1 + 0.5) / 2.0));
        assert_eq!(m.staleness_by_lag.len(), 2);
        assert_eq!(m.staleness_by_lag["1"].tokens, 2);
        assert!(close(
            m.staleness_by_lag["1"].kl_k3,
            (k3(0.2) + k3(-0.4)) / 2.0
        ));
        assert_eq!(m.staleness_by_lag["2"].tokens, 1);
        assert!(close(m.staleness_by_lag["2"].abs_mean, 0.5));
        assert!(m.staleness.kl_k3 > 0.0 && m.mismatch.kl_k3 >= 0.0);
    }

    #[test]
    fn lags_above_eight_share_a_bucket() {
        let seqs = [seq(&[-1.0, -1.0], &[1, 0])];
        let proximal = vec![vec![0.0, -0.9, -1.1]];
        let m = measure(&seqs, &proximal, 20);
        assert_eq!(m.mismatch.tokens, 0);
        assert_eq!(m.mismatch, LogprobGap::default());
        assert_eq!(m.staleness_by_lag.keys().collect::<Vec<_>>(), vec!["9+"]);
        assert_eq!(m.staleness_by_lag["9+"].tokens, 2);
    }
}
