//! The trainer's view of a batch: sequences with per-token data, packed micro-batches, and
//! the checks of what plugins hand back.

use std::ops::Range;

use areal_sdk::{PROMPT_VERSION, PolicyVersion, TrajectoryGroup};
use areal_sdk_train::burn::tensor::{Device, Tensor, TensorData};
use areal_sdk_train::{PackedBatch, Policy};

use crate::error::EngineError;

/// One sequence as the trainer sees it: prompt + completion, with per-token data. A token is
/// trained on when a policy sampled it: not the prompt's, nor an episode's environment tokens
/// (both carry `PROMPT_VERSION`).
#[derive(Clone, Debug)]
pub(super) struct Sequence {
    pub(super) tokens: Vec<u32>,
    pub(super) prompt_len: usize,
    pub(super) behaviour: Vec<f32>,
    pub(super) versions: Vec<PolicyVersion>,
    /// Past `rollout.max_lag` with `max_lag_policy = "withhold"`: its reward stays in its
    /// group's baseline, none of its tokens is trained.
    pub(super) withheld: bool,
    /// Filled in once the algorithm has computed advantages (0 on prompt tokens).
    pub(super) advantages: Vec<f32>,
    /// Value targets, when the algorithm trains a critic (0 on prompt tokens).
    pub(super) returns: Vec<f32>,
}

impl Sequence {
    pub(super) fn completion(&self) -> Range<usize> {
        self.prompt_len..self.tokens.len()
    }

    /// 1 on the tokens trained on (sampled by a policy, the sequence not withheld), 0
    /// elsewhere.
    pub(super) fn loss_mask(&self) -> Vec<f32> {
        self.versions
            .iter()
            .map(|&v| {
                if v == PROMPT_VERSION || self.withheld {
                    0.0
                } else {
                    1.0
                }
            })
            .collect()
    }

    /// How many tokens are trained on.
    pub(super) fn trained_tokens(&self) -> usize {
        if self.withheld {
            return 0;
        }
        self.versions
            .iter()
            .filter(|&&v| v != PROMPT_VERSION)
            .count()
    }
}

/// The sequences to train on (samples with a non-empty completion), and for every sample in
/// flat order the index of its sequence.
pub(super) fn sequences(groups: &[TrajectoryGroup]) -> (Vec<Sequence>, Vec<Option<usize>>) {
    let mut out = Vec::new();
    let mut index = Vec::new();
    for group in groups {
        for sample in &group.samples {
            let c = &sample.completion;
            if c.is_empty() {
                index.push(None);
                continue;
            }
            let p = group.prompt_ids.len();
            let mut tokens = group.prompt_ids.clone();
            tokens.extend(&c.token_ids);
            let mut behaviour = vec![0.0; p];
            behaviour.extend(&c.behaviour_logprobs);
            let mut versions = vec![PROMPT_VERSION; p];
            versions.extend(&c.versions);
            index.push(Some(out.len()));
            out.push(Sequence {
                tokens,
                prompt_len: p,
                behaviour,
                versions,
                withheld: false,
                advantages: Vec::new(),
                returns: Vec::new(),
            });
        }
    }
    (out, index)
}

/// Check the algorithm's per-token vectors against the samples' completion lengths.
pub(super) fn check_lengths(
    what: &str,
    values: &[Vec<f32>],
    groups: &[TrajectoryGroup],
) -> Result<(), EngineError> {
    let samples: Vec<_> = groups.iter().flat_map(|g| &g.samples).collect();
    if values.len() != samples.len() {
        return Err(EngineError::internal(format!(
            "algorithm returned {what} for {} samples, the batch has {}",
            values.len(),
            samples.len()
        )));
    }
    for (v, sample) in values.iter().zip(samples) {
        if v.len() != sample.completion.len() {
            return Err(EngineError::internal(format!(
                "algorithm returned {} {what} for sample {} with {} tokens",
                v.len(),
                sample.sample_id,
                sample.completion.len()
            )));
        }
    }
    Ok(())
}

/// Per-sample completion slices of per-token values, `per_sequence(i)` being sequence `i`'s
/// (empty for samples without a completion).
pub(super) fn completion_slices<'a>(
    seqs: &[Sequence],
    index: &[Option<usize>],
    per_sequence: impl Fn(usize) -> &'a [f32],
) -> Vec<Vec<f32>> {
    index
        .iter()
        .map(|i| match i {
            Some(i) => per_sequence(*i)[seqs[*i].completion()].to_vec(),
            None => Vec::new(),
        })
        .collect()
}

/// Split `n` items into `parts` contiguous chunks whose sizes differ by at most one.
pub(super) fn chunks(n: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    let (base, extra) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .filter(|r| !r.is_empty())
        .collect()
}

pub(super) fn tensor(values: Vec<f32>, device: &Device) -> Tensor<1> {
    let n = values.len();
    Tensor::<1>::from_data(TensorData::new(values, [n]), device)
}

pub(super) fn to_vec(t: Tensor<1>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("converted to f32")
}

/// A micro-batch: sequence indices and their packed layout.
pub(super) struct Micro {
    pub(super) members: Vec<usize>,
    pub(super) batch: PackedBatch,
}

impl Micro {
    /// Per-token `values` of the packed batch, handed out to their sequences: `into[i]`
    /// for each member `i`.
    pub(super) fn scatter(&self, values: &[f32], into: &mut [Vec<f32>]) {
        for (&i, range) in self.members.iter().zip(self.batch.ranges()) {
            into[i] = values[range].to_vec();
        }
    }
}

pub(super) fn micro(seqs: &[Sequence], members: Vec<usize>, temperature: f32) -> Micro {
    let mut batch = PackedBatch::new(temperature);
    for &i in &members {
        batch.push(&seqs[i].tokens);
    }
    Micro { members, batch }
}

/// Check a policy's logprob tensor against its batch.
pub(super) fn checked(
    values: Tensor<1>,
    batch: &PackedBatch,
    policy: &dyn Policy,
) -> Result<Tensor<1>, EngineError> {
    if values.dims() != [batch.num_tokens()] {
        return Err(EngineError::internal(format!(
            "policy {} returned {:?} logprobs for {} tokens",
            policy.name(),
            values.dims(),
            batch.num_tokens()
        )));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_are_contiguous_and_balanced() {
        assert_eq!(chunks(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(chunks(2, 4), vec![0..1, 1..2]);
        assert_eq!(chunks(5, 1), vec![0..5]);
        assert_eq!(chunks(0, 2), Vec::<std::ops::Range<usize>>::new());
    }
}
