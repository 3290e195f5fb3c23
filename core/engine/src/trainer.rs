//! One training step: pack, recompute proximal logprobs, advantages, loss, optimizer steps.

use std::collections::BTreeMap;
use std::ops::Range;

use areal_sdk::{PROMPT_VERSION, PolicyVersion, TrajectoryGroup};
use areal_sdk_train::burn::optim::ModuleOptimizer;
use areal_sdk_train::burn::tensor::{Device, Tensor, TensorData};
use areal_sdk_train::{
    Algorithm, BehaviourLogprobs, CurrentLogprobs, LossInput, LossStats, PackedBatch, Policy,
    ProximalLogprobs, ProximalMode,
};

use crate::error::EngineError;
use crate::packing::pack;

/// Trainer settings taken from the config.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainerSettings {
    /// Learning rate.
    pub lr: f64,
    /// Global gradient-norm clip (`None`: off).
    pub max_grad_norm: Option<f64>,
    /// Optimizer steps per batch.
    pub minibatches: usize,
    /// Token budget of a micro-batch.
    pub token_budget: usize,
    /// Minimum micro-batches per mini-batch.
    pub min_microbatches: usize,
    /// Sampling temperature of the rollouts (logprobs are computed at it).
    pub temperature: f32,
}

/// What a step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    /// Loss summed over mini-batches.
    pub loss: f64,
    /// Gradient norm of the last mini-batch, before clipping.
    pub grad_norm: f64,
    /// Micro-batches run (each forward + backward).
    pub microbatches: usize,
    /// Tokens through the forward/backward passes (prompts included).
    pub packed_tokens: usize,
    /// Generated tokens trained on.
    pub trained_tokens: usize,
    /// Sequences longer than the token budget.
    pub oversized: usize,
    /// Mean |logπ_prox − logπ_behav| over tokens sampled by version k (recompute only).
    pub on_policy_logprob_gap: f64,
    /// Algorithm statistics (means).
    pub stats: BTreeMap<String, f64>,
}

/// One sequence as the trainer sees it: prompt + completion, with per-token data.
#[derive(Clone, Debug)]
struct Sequence {
    tokens: Vec<u32>,
    prompt_len: usize,
    behaviour: Vec<f32>,
    versions: Vec<PolicyVersion>,
    advantages: Vec<f32>,
}

impl Sequence {
    fn completion(&self) -> Range<usize> {
        self.prompt_len..self.tokens.len()
    }
}

fn sequences(
    groups: &[TrajectoryGroup],
    advantages: Vec<Vec<f32>>,
) -> Result<Vec<Sequence>, EngineError> {
    let samples: Vec<_> = groups
        .iter()
        .flat_map(|g| g.samples.iter().map(move |s| (g, s)))
        .collect();
    if advantages.len() != samples.len() {
        return Err(EngineError::Invalid(format!(
            "algorithm returned advantages for {} samples, the batch has {}",
            advantages.len(),
            samples.len()
        )));
    }
    let mut out = Vec::new();
    for ((group, sample), adv) in samples.into_iter().zip(advantages) {
        let c = &sample.completion;
        if adv.len() != c.len() {
            return Err(EngineError::Invalid(format!(
                "algorithm returned {} advantages for sample {} with {} tokens",
                adv.len(),
                sample.sample_id,
                c.len()
            )));
        }
        if c.is_empty() {
            continue;
        }
        let p = group.prompt_ids.len();
        let mut tokens = group.prompt_ids.clone();
        tokens.extend(&c.token_ids);
        let mut behaviour = vec![0.0; p];
        behaviour.extend(&c.behaviour_logprobs);
        let mut versions = vec![PROMPT_VERSION; p];
        versions.extend(&c.versions);
        let mut advantages = vec![0.0; p];
        advantages.extend(adv);
        out.push(Sequence {
            tokens,
            prompt_len: p,
            behaviour,
            versions,
            advantages,
        });
    }
    Ok(out)
}

/// Split `n` items into `parts` contiguous chunks whose sizes differ by at most one.
fn chunks(n: usize, parts: usize) -> Vec<Range<usize>> {
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

fn tensor(values: Vec<f32>, device: &Device) -> Tensor<1> {
    let n = values.len();
    Tensor::<1>::from_data(TensorData::new(values, [n]), device)
}

fn to_vec(t: Tensor<1>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("converted to f32")
}

/// A micro-batch: sequence indices and their packed layout.
struct Micro {
    members: Vec<usize>,
    batch: PackedBatch,
}

fn micro(seqs: &[Sequence], members: Vec<usize>, temperature: f32) -> Micro {
    let mut batch = PackedBatch::new(temperature);
    for &i in &members {
        batch.push(&seqs[i].tokens);
    }
    Micro { members, batch }
}

/// Check a policy's logprob tensor against its batch.
fn checked(
    values: Tensor<1>,
    batch: &PackedBatch,
    policy: &dyn Policy,
) -> Result<Tensor<1>, EngineError> {
    if values.dims() != [batch.num_tokens()] {
        return Err(EngineError::Invalid(format!(
            "policy {} returned {:?} logprobs for {} tokens",
            policy.name(),
            values.dims(),
            batch.num_tokens()
        )));
    }
    Ok(values)
}

/// Train on `groups` with the weights at version `version` (the step produces version + 1).
pub fn train_step(
    policy: &mut dyn Policy,
    optimizer: &mut ModuleOptimizer,
    algorithm: &dyn Algorithm,
    groups: &[TrajectoryGroup],
    version: PolicyVersion,
    settings: &TrainerSettings,
) -> Result<StepReport, EngineError> {
    let advantages = algorithm
        .advantages(groups)
        .map_err(|e| EngineError::plugin("computing advantages", e))?;
    let seqs = sequences(groups, advantages)?;
    let mut report = StepReport::default();
    if seqs.is_empty() {
        return Ok(report);
    }
    let device = policy.device();
    let mode = algorithm.requirements().proximal;

    // Pack every mini-batch once; both passes use the same layout.
    let minibatches: Vec<Vec<Micro>> = chunks(seqs.len(), settings.minibatches)
        .into_iter()
        .map(|range| {
            let indices: Vec<usize> = range.collect();
            let lengths: Vec<usize> = indices.iter().map(|&i| seqs[i].tokens.len()).collect();
            let packing = pack(&lengths, settings.token_budget, settings.min_microbatches);
            report.oversized += packing.oversized.len();
            packing
                .microbatches
                .into_iter()
                .map(|mb| {
                    micro(
                        &seqs,
                        mb.into_iter().map(|j| indices[j]).collect(),
                        settings.temperature,
                    )
                })
                .collect()
        })
        .collect();
    if report.oversized > 0 {
        tracing::warn!(
            target: "areal::trainer",
            oversized = report.oversized,
            token_budget = settings.token_budget,
            "sequences longer than the token budget were given micro-batches of their own"
        );
    }

    // π_prox: the weights before any update of this step.
    let mut proximal: Vec<Option<Vec<f32>>> = vec![None; seqs.len()];
    if mode == ProximalMode::Recompute {
        let (mut gap_sum, mut gap_n) = (0.0f64, 0usize);
        for mb in minibatches.iter().flatten() {
            let lp = policy
                .logprobs_no_grad(&mb.batch)
                .map_err(|e| EngineError::plugin("recomputing proximal logprobs", e))?;
            let lp = to_vec(checked(lp, &mb.batch, policy)?);
            for (&i, range) in mb.members.iter().zip(mb.batch.ranges()) {
                let values = lp[range].to_vec();
                for t in seqs[i].completion() {
                    if seqs[i].versions[t] == version {
                        gap_sum += f64::from((values[t] - seqs[i].behaviour[t]).abs());
                        gap_n += 1;
                    }
                }
                proximal[i] = Some(values);
            }
        }
        report.on_policy_logprob_gap = if gap_n > 0 {
            gap_sum / gap_n as f64
        } else {
            0.0
        };
    }

    let mut stats = LossStats::default();
    for mbs in &minibatches {
        let members = mbs.iter().flat_map(|m| &m.members);
        let minibatch_tokens: usize = members.clone().map(|&i| seqs[i].completion().len()).sum();
        let minibatch_sequences = members.count();
        for mb in mbs {
            let mut behaviour = Vec::with_capacity(mb.batch.num_tokens());
            let mut versions = Vec::with_capacity(mb.batch.num_tokens());
            let mut adv = Vec::with_capacity(mb.batch.num_tokens());
            let mut mask = Vec::with_capacity(mb.batch.num_tokens());
            let mut prox = Vec::new();
            let mut completions = Vec::with_capacity(mb.members.len());
            for &i in &mb.members {
                let s = &seqs[i];
                let offset = behaviour.len();
                completions.push(offset + s.prompt_len..offset + s.tokens.len());
                behaviour.extend(&s.behaviour);
                versions.extend(&s.versions);
                adv.extend(&s.advantages);
                mask.extend(
                    (0..s.tokens.len()).map(|t| if t < s.prompt_len { 0.0f32 } else { 1.0 }),
                );
                if let Some(p) = &proximal[i] {
                    prox.extend(p);
                }
            }
            let current = policy
                .logprobs(&mb.batch)
                .map_err(|e| EngineError::plugin("computing current logprobs", e))?;
            let current = checked(current, &mb.batch, policy)?;
            let behaviour_t = tensor(behaviour.clone(), &device);
            let proximal_t = match mode {
                ProximalMode::Recompute => tensor(prox, &device),
                ProximalMode::Behaviour => behaviour_t.clone(),
                ProximalMode::LogLinear => {
                    let alpha: Vec<f32> = versions
                        .iter()
                        .map(|&v| {
                            if v == PROMPT_VERSION {
                                0.0
                            } else {
                                ((version - v) as f32 / (version + 1 - v) as f32).clamp(0.0, 1.0)
                            }
                        })
                        .collect();
                    let alpha = tensor(alpha, &device);
                    behaviour_t.clone() + alpha * (current.clone().detach() - behaviour_t.clone())
                }
            };
            let input = LossInput {
                current: CurrentLogprobs(current),
                proximal: ProximalLogprobs(proximal_t.detach()),
                behaviour: BehaviourLogprobs(behaviour_t),
                advantages: tensor(adv, &device),
                loss_mask: tensor(mask, &device),
                versions,
                completions,
                minibatch_tokens,
                minibatch_sequences,
                trainer_version: version,
            };
            let out = algorithm
                .loss(&input)
                .map_err(|e| EngineError::plugin("computing the loss", e))?;
            if out.loss.dims() != [1] {
                return Err(EngineError::Invalid(format!(
                    "algorithm {} returned a loss of shape {:?}, expected [1]",
                    algorithm.name(),
                    out.loss.dims()
                )));
            }
            report.loss += f64::from(out.loss.clone().into_scalar::<f32>());
            stats.merge(&out.stats);
            policy
                .backward(out.loss)
                .map_err(|e| EngineError::plugin("backward pass", e))?;
            report.microbatches += 1;
            report.packed_tokens += mb.batch.num_tokens();
        }
        report.trained_tokens += minibatch_tokens;
        let step = policy
            .step(optimizer, settings.lr, settings.max_grad_norm)
            .map_err(|e| EngineError::plugin("optimizer step", e))?;
        report.grad_norm = step.grad_norm;
    }
    report.stats = stats.means();
    Ok(report)
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
