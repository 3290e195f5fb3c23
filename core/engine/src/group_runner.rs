//! The group runner: generate a sample (resubmitting after interruptions), reward it, and
//! assemble a group of samples for one prompt.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use areal_sdk::{
    Completion, FinishReason, GenerateRequest, Generator, PluginError, PolicyVersion, RewardInput,
    SamplingParams, TaskItem, Tokenizer, Trajectory, TrajectoryGroup,
};
use tokio::task::JoinSet;

use crate::reward_service::{RewardService, Verified};

/// Counters the group runner updates and each training step drains.
#[derive(Debug, Default)]
pub struct GroupCounters {
    /// Tokens generated (all samples, whatever became of them).
    pub generated_tokens: AtomicU64,
    /// Generate calls that returned `interrupted`.
    pub interruptions: AtomicU64,
    /// Samples lost to verifier failures.
    pub reward_failures: AtomicU64,
    /// Reward latencies in milliseconds since last drained.
    pub reward_latencies_ms: Mutex<Vec<f64>>,
}

impl GroupCounters {
    /// Take the latencies recorded since the last call.
    pub fn drain_latencies(&self) -> Vec<f64> {
        std::mem::take(
            &mut *self
                .reward_latencies_ms
                .lock()
                .expect("latency lock poisoned"),
        )
    }
}

/// Runs groups: generator, tokenizer and reward service together.
pub struct GroupRunner {
    generator: Arc<dyn Generator>,
    tokenizer: Arc<dyn Tokenizer>,
    rewards: RewardService,
    stop_token_ids: Vec<u32>,
    /// Counters for metrics.
    pub counters: GroupCounters,
}

impl GroupRunner {
    /// A group runner on `generator`, decoding with `tokenizer`, rewarding with `rewards`.
    pub fn new(
        generator: Arc<dyn Generator>,
        tokenizer: Arc<dyn Tokenizer>,
        rewards: RewardService,
    ) -> Self {
        let stop_token_ids = tokenizer.stop_token_ids();
        Self {
            generator,
            tokenizer,
            rewards,
            stop_token_ids,
            counters: GroupCounters::default(),
        }
    }

    /// The generator.
    pub fn generator(&self) -> &Arc<dyn Generator> {
        &self.generator
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        &self.tokenizer
    }

    /// The reward service.
    pub fn rewards(&self) -> &RewardService {
        &self.rewards
    }

    /// Generate one completion of up to `max_new_tokens` for `prompt_ids`.
    ///
    /// When the generator is interrupted by a weight update the sample is resubmitted as
    /// prompt + partial output with the remaining budget, so every token keeps the logprob and
    /// version of the policy that sampled it.
    pub async fn generate(
        &self,
        sample_id: u64,
        prompt_ids: &[u32],
        max_new_tokens: usize,
        sampling: &SamplingParams,
    ) -> Result<Completion, PluginError> {
        let mut completion = Completion::empty(FinishReason::Length);
        let mut input = prompt_ids.to_vec();
        loop {
            let remaining = max_new_tokens - completion.len();
            let request = GenerateRequest {
                sample_id,
                input_ids: input.clone(),
                max_new_tokens: remaining,
                sampling: sampling.clone(),
                stop_token_ids: self.stop_token_ids.clone(),
            };
            let part = self.generator.generate(request).await?;
            part.check().map_err(|e| {
                PluginError::failed(self.generator.name(), format!("malformed completion: {e}"))
            })?;
            if part.len() > remaining {
                return Err(PluginError::failed(
                    self.generator.name(),
                    format!("returned {} tokens for a budget of {remaining}", part.len()),
                ));
            }
            self.counters
                .generated_tokens
                .fetch_add(part.len() as u64, Ordering::Relaxed);
            let interrupted = part.finish_reason == FinishReason::Interrupted;
            let empty = part.is_empty();
            input.extend(&part.token_ids);
            completion.extend(part);
            if !interrupted {
                return Ok(completion);
            }
            self.counters.interruptions.fetch_add(1, Ordering::Relaxed);
            if completion.len() >= max_new_tokens {
                completion.finish_reason = FinishReason::Length;
                return Ok(completion);
            }
            if empty {
                // A generator that returns at once while paused must not make us spin.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    /// Reward one completion.
    pub async fn reward(
        &self,
        sample_id: u64,
        item: &TaskItem,
        completion: &Completion,
    ) -> Result<Verified, PluginError> {
        let text = self.tokenizer.decode(&completion.token_ids)?;
        let verified = self
            .rewards
            .verify(RewardInput {
                sample_id,
                item_id: item.id.clone(),
                prompt: item.prompt.clone(),
                completion: text,
                completion_ids: completion.token_ids.clone(),
                finish_reason: completion.finish_reason,
                reference: item.reference.clone(),
            })
            .await;
        self.counters
            .reward_latencies_ms
            .lock()
            .expect("latency lock poisoned")
            .push(verified.latency.as_secs_f64() * 1e3);
        if verified.reward.verdict.is_failure() {
            self.counters
                .reward_failures
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(verified)
    }

    /// Generate and reward `group_size` samples for `item`. Samples whose verifier failed are
    /// left out of the group; generation errors fail the whole group, and so does a verifier
    /// that failed on every sample (a group with nothing to train on is a failure, counted by
    /// `rollout.max_consecutive_failures`, not a quiet rejection).
    pub async fn run_group(
        self: &Arc<Self>,
        spec: GroupSpec,
        item: TaskItem,
    ) -> Result<TrajectoryGroup, PluginError> {
        let prompt_ids = Arc::new(self.tokenizer.encode(&item.prompt)?);
        if prompt_ids.is_empty() {
            return Err(PluginError::failed(
                "rollout",
                format!("prompt of item {} encodes to no tokens", item.id),
            ));
        }
        let item = Arc::new(item);
        let mut samples = JoinSet::new();
        for j in 0..spec.group_size {
            let this = self.clone();
            let (item, prompt_ids, sampling) =
                (item.clone(), prompt_ids.clone(), spec.sampling.clone());
            let sample_id = spec.group_id * spec.group_size as u64 + j as u64;
            samples.spawn(async move {
                let completion = this
                    .generate(sample_id, &prompt_ids, spec.max_new_tokens, &sampling)
                    .await?;
                let verified = this.reward(sample_id, &item, &completion).await?;
                Ok::<_, PluginError>((
                    j,
                    Trajectory {
                        sample_id,
                        completion,
                        reward: verified.reward,
                    },
                ))
            });
        }
        let mut done = Vec::with_capacity(spec.group_size);
        while let Some(joined) = samples.join_next().await {
            let result = joined
                .map_err(|e| PluginError::failed("rollout", format!("sample task failed: {e}")))?;
            done.push(result?);
        }
        done.sort_by_key(|(j, _)| *j);
        let failed = done
            .iter()
            .filter(|(_, t)| t.reward.verdict.is_failure())
            .count();
        if failed > 0 && failed == done.len() {
            let first = &done[0].1.reward;
            let why = first
                .provenance
                .details
                .get("error")
                .or_else(|| first.provenance.details.get("message"))
                .map_or_else(String::new, |m| match m.as_str() {
                    Some(text) => format!(": {text}"),
                    None => format!(": {m}"),
                });
            return Err(PluginError::failed(
                first.provenance.verifier.clone(),
                format!(
                    "every one of the {failed} samples of item {} lost its reward (the first: {}{why})",
                    item.id,
                    first.verdict.as_str()
                ),
            ));
        }
        Ok(TrajectoryGroup {
            group_id: spec.group_id,
            item_id: item.id.clone(),
            prompt_ids: prompt_ids.to_vec(),
            admitted_at: spec.admitted_at,
            samples: done
                .into_iter()
                .map(|(_, t)| t)
                .filter(|t| !t.reward.verdict.is_failure())
                .collect(),
        })
    }
}

/// What a group rollout is asked to do.
#[derive(Clone, Debug)]
pub struct GroupSpec {
    /// Submission order.
    pub group_id: u64,
    /// Samples to generate.
    pub group_size: usize,
    /// Token budget per sample.
    pub max_new_tokens: usize,
    /// Sampling settings (the seed is the run's; generators mix in the sample id).
    pub sampling: SamplingParams,
    /// Generators' version at admission.
    pub admitted_at: PolicyVersion,
}
