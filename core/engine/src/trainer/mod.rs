//! One training step: pack, recompute proximal logprobs, advantages, loss, optimizer steps.

use std::collections::BTreeMap;

use areal_sdk::{PROMPT_VERSION, PolicyVersion, TrajectoryGroup};
use areal_sdk_train::burn::optim::ModuleOptimizer;
use areal_sdk_train::{
    AdvantageInput, Algorithm, BehaviourLogprobs, CriticInput, CurrentLogprobs, LossInput,
    LossStats, Policy, ProximalLogprobs, ProximalMode, ReferenceLogprobs,
};

use crate::error::EngineError;
use crate::packing::pack;

use batch::{
    Micro, Sequence, check_lengths, checked, chunks, completion_slices, micro, sequences, tensor,
    to_vec,
};

mod batch;
mod off_policy;
pub(crate) mod sft;

pub use off_policy::{LogprobGap, OffPolicyStats};

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
    /// `rollout.max_lag` with `max_lag_policy = "withhold"`: a sample with a token whose lag
    /// (this step's version minus the token's) is past it trains no token, its reward kept
    /// in its group's baseline.
    pub withhold_past_lag: Option<u64>,
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
    /// Mean |logπ_trainer − logπ_behav| over tokens sampled by version k (see `off_policy`).
    pub on_policy_logprob_gap: f64,
    /// Mismatch and staleness of the batch: every token with the proximal recompute, the
    /// first mini-batch's without it.
    pub off_policy: Option<OffPolicyStats>,
    /// Samples withheld from training for their lag (`max_lag_policy = "withhold"`).
    pub withheld_samples: usize,
    /// Algorithm statistics (means).
    pub stats: BTreeMap<String, f64>,
}

/// Train on `groups` with the weights at version `version` (the step produces version + 1).
/// `reference` is the frozen reference policy, required when the algorithm asks for one.
pub fn train_step(
    policy: &mut dyn Policy,
    reference: Option<&dyn Policy>,
    optimizer: &mut ModuleOptimizer,
    algorithm: &dyn Algorithm,
    groups: &[TrajectoryGroup],
    version: PolicyVersion,
    settings: &TrainerSettings,
) -> Result<StepReport, EngineError> {
    let (mut seqs, index) = sequences(groups);
    let mut report = StepReport::default();
    if seqs.is_empty() {
        return Ok(report);
    }
    if let Some(bound) = settings.withhold_past_lag {
        for s in &mut seqs {
            s.withheld = s
                .versions
                .iter()
                .any(|&v| v != PROMPT_VERSION && version.saturating_sub(v) > bound);
            report.withheld_samples += usize::from(s.withheld);
        }
    }
    let device = policy.device();
    let needs = algorithm.requirements();
    let mode = needs.proximal;
    let reference = match (needs.reference, reference) {
        (false, _) => None,
        (true, Some(r)) => Some(r),
        (true, None) => {
            return Err(EngineError::internal(format!(
                "algorithm {} asks for reference logprobs but the trainer has no reference policy",
                algorithm.name()
            )));
        }
    };

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

    // One no-grad pass with the weights before any update of this step: π_prox, π_ref, V_old.
    let mut proximal: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
    let mut reference_lp: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
    let mut old_values: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
    for mb in minibatches.iter().flatten() {
        if mode == ProximalMode::Recompute {
            let lp = policy
                .logprobs_no_grad(&mb.batch)
                .map_err(|e| EngineError::plugin("recomputing proximal logprobs", e))?;
            mb.scatter(&to_vec(checked(lp, &mb.batch, policy)?), &mut proximal);
        }
        if let Some(r) = reference {
            let lp = r
                .logprobs_no_grad(&mb.batch)
                .map_err(|e| EngineError::plugin("computing reference logprobs", e))?;
            mb.scatter(&to_vec(checked(lp, &mb.batch, r)?), &mut reference_lp);
        }
        if needs.values {
            let v = policy
                .values_no_grad(&mb.batch)
                .map_err(|e| EngineError::plugin("computing values", e))?;
            mb.scatter(&to_vec(checked(v, &mb.batch, policy)?), &mut old_values);
        }
    }
    // Mismatch and staleness against the weights the step starts from: the recompute's
    // logprobs, or without it the first mini-batch's forward pass, which runs with the same
    // weights (before any update) and so measures the same gaps on its tokens (all of them
    // with one mini-batch), at no extra cost.
    let mut first_pass: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];

    // Advantages (and value targets) from rewards and the numbers of the no-grad pass.
    let old: Vec<Vec<f32>> = if mode == ProximalMode::Recompute {
        completion_slices(&seqs, &index, |i| &proximal[i])
    } else {
        completion_slices(&seqs, &index, |i| &seqs[i].behaviour)
    };
    let reference_c = reference.map(|_| completion_slices(&seqs, &index, |i| &reference_lp[i]));
    let values_c = needs
        .values
        .then(|| completion_slices(&seqs, &index, |i| &old_values[i]));
    let mut input = AdvantageInput::new(groups, &old);
    if let Some(r) = &reference_c {
        input = input.with_reference(r);
    }
    if let Some(v) = &values_c {
        input = input.with_values(v);
    }
    let computed = algorithm
        .advantages(&input)
        .map_err(|e| EngineError::plugin("computing advantages", e))?;
    check_lengths("advantages", &computed.advantages, groups)?;
    let returns = match (&computed.returns, needs.values) {
        (Some(r), _) => {
            check_lengths("returns", r, groups)?;
            Some(r)
        }
        (None, true) => {
            return Err(EngineError::internal(format!(
                "algorithm {} asks for values but returned no value targets (returns)",
                algorithm.name()
            )));
        }
        (None, false) => None,
    };
    for (sample, i) in index.iter().enumerate() {
        if let Some(i) = *i {
            let s = &mut seqs[i];
            // 0 wherever no policy sampled the token (the prompt, an episode's environment),
            // whatever the algorithm put there
            let mask = s.loss_mask();
            let trained = |values: &[f32]| -> Vec<f32> {
                let mut out = vec![0.0; s.prompt_len];
                out.extend(values);
                out.iter().zip(&mask).map(|(v, m)| v * m).collect()
            };
            s.advantages = trained(&computed.advantages[sample]);
            if let Some(r) = returns {
                s.returns = trained(&r[sample]);
            }
        }
    }

    let mut stats = LossStats::default();
    for (k, mbs) in minibatches.iter().enumerate() {
        let record_first_pass = k == 0 && mode != ProximalMode::Recompute;
        let members = mbs.iter().flat_map(|m| &m.members);
        let minibatch_tokens: usize = members.clone().map(|&i| seqs[i].trained_tokens()).sum();
        let minibatch_sequences = members.filter(|&&i| !seqs[i].withheld).count();
        for mb in mbs {
            let n = mb.batch.num_tokens();
            let gather = |per: &dyn Fn(&Sequence, usize) -> Vec<f32>| -> Vec<f32> {
                let mut out = Vec::with_capacity(n);
                for &i in &mb.members {
                    out.extend(per(&seqs[i], i));
                }
                out
            };
            let behaviour = gather(&|s, _| s.behaviour.clone());
            let adv = gather(&|s, _| s.advantages.clone());
            let mask = gather(&|s, _| s.loss_mask());
            let mut versions = Vec::with_capacity(n);
            let mut completions = Vec::with_capacity(mb.members.len());
            for &i in &mb.members {
                let s = &seqs[i];
                let offset = versions.len();
                completions.push(offset + s.prompt_len..offset + s.tokens.len());
                versions.extend(&s.versions);
            }
            let current = policy
                .logprobs(&mb.batch)
                .map_err(|e| EngineError::plugin("computing current logprobs", e))?;
            let current = checked(current, &mb.batch, policy)?;
            if record_first_pass {
                mb.scatter(&to_vec(current.clone().detach()), &mut first_pass);
            }
            let behaviour_t = tensor(behaviour, &device);
            let proximal_t = match mode {
                ProximalMode::Recompute => tensor(gather(&|_, i| proximal[i].clone()), &device),
                ProximalMode::Behaviour => behaviour_t.clone(),
                ProximalMode::LogLinear => {
                    let alpha: Vec<f32> = versions
                        .iter()
                        .map(|&v| {
                            if v == PROMPT_VERSION {
                                0.0
                            } else {
                                // a token from a version newer than the trainer's: lag 0
                                let lag = version.saturating_sub(v);
                                (lag as f32 / (lag + 1) as f32).clamp(0.0, 1.0)
                            }
                        })
                        .collect();
                    let alpha = tensor(alpha, &device);
                    behaviour_t.clone() + alpha * (current.clone().detach() - behaviour_t.clone())
                }
            };
            let reference_t = reference.map(|_| {
                ReferenceLogprobs(tensor(gather(&|_, i| reference_lp[i].clone()), &device))
            });
            let critic = if needs.values {
                let values = policy
                    .values(&mb.batch)
                    .map_err(|e| EngineError::plugin("computing values", e))?;
                Some(CriticInput {
                    values: checked(values, &mb.batch, policy)?,
                    old_values: tensor(gather(&|_, i| old_values[i].clone()), &device),
                    returns: tensor(gather(&|s, _| s.returns.clone()), &device),
                })
            } else {
                None
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
                reference: reference_t,
                critic,
            };
            let out = algorithm
                .loss(&input)
                .map_err(|e| EngineError::plugin("computing the loss", e))?;
            if out.loss.dims() != [1] {
                return Err(EngineError::internal(format!(
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
            report.packed_tokens += n;
        }
        if k == 0 {
            let trainer_lp = if mode == ProximalMode::Recompute {
                &proximal
            } else {
                &first_pass
            };
            let measured = off_policy::measure(&seqs, trainer_lp, version);
            report.on_policy_logprob_gap = measured.mismatch.abs_mean;
            report.off_policy = Some(measured);
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
