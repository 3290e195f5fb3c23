//! The group runner: generate a sample (resubmitting after interruptions), reward it, and
//! assemble a group of samples for one prompt.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use areal_sdk::{
    Completion, FinishReason, GenerateRequest, Generator, PluginError, PolicyVersion, Reward,
    RewardInput, SamplingParams, TaskItem, Tokenizer, Trajectory, TrajectoryGroup,
};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::config::PromptConfig;
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
    /// Rewards asked for since last drained.
    pub rewards: AtomicU64,
    /// Of which the reward cache answered.
    pub reward_cache_hits: AtomicU64,
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
    /// The task's name, the `data_source` of every reward input's metadata.
    data_source: String,
    /// Counters for metrics.
    pub counters: GroupCounters,
    /// How prompts are put to the model.
    prompt: PromptConfig,
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
            data_source: String::new(),
            counters: GroupCounters::default(),
            prompt: PromptConfig::default(),
        }
    }

    /// Prompts put to the model as `prompt` says (by default the task's text as it is). A
    /// chat format is tried at once, so that a model without a chat template is refused
    /// before anything runs.
    pub fn with_prompt(mut self, prompt: PromptConfig) -> Result<Self, PluginError> {
        prompt.render(self.tokenizer.as_ref(), "").map_err(|e| {
            PluginError::failed(
                "prompt",
                format!("prompt.format = \"chat\" needs the model's chat template: {e}"),
            )
        })?;
        self.prompt = prompt;
        Ok(self)
    }

    /// With the task's name, given to rewards as `metadata.data_source`.
    pub fn with_data_source(mut self, name: &str) -> Self {
        self.data_source = name.to_owned();
        self
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
        let empty = Completion::empty(FinishReason::Length);
        self.generate_from(
            sample_id,
            prompt_ids,
            empty,
            max_new_tokens,
            sampling,
            |_, _| {},
        )
        .await
    }

    /// [`generate`](Self::generate) continuing `completion` (what the sample had when it was
    /// last interrupted: a resumed run's partial sample). `on_part` sees every part the
    /// generator returns, with whether the completion is final after it.
    pub(crate) async fn generate_from(
        &self,
        sample_id: u64,
        prompt_ids: &[u32],
        mut completion: Completion,
        max_new_tokens: usize,
        sampling: &SamplingParams,
        mut on_part: impl FnMut(&Completion, bool) + Send,
    ) -> Result<Completion, PluginError> {
        let mut input = prompt_ids.to_vec();
        input.extend(&completion.token_ids);
        loop {
            if completion.len() >= max_new_tokens {
                completion.finish_reason = FinishReason::Length;
                return Ok(completion);
            }
            let part = self
                .part(
                    sample_id,
                    &input,
                    max_new_tokens - completion.len(),
                    sampling,
                )
                .await?;
            let interrupted = part.finish_reason == FinishReason::Interrupted;
            let empty = part.is_empty();
            input.extend(&part.token_ids);
            let done = !interrupted || completion.len() + part.len() >= max_new_tokens;
            on_part(&part, done);
            completion.extend(part);
            if !interrupted {
                return Ok(completion);
            }
            self.counters.interruptions.fetch_add(1, Ordering::Relaxed);
            if empty {
                // A generator that returns at once while paused must not make us spin.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    /// One call to the generator: up to `max_new_tokens` tokens after `input`, checked.
    pub(crate) async fn part(
        &self,
        sample_id: u64,
        input: &[u32],
        max_new_tokens: usize,
        sampling: &SamplingParams,
    ) -> Result<Completion, PluginError> {
        let request = self.request(sample_id, input.to_vec(), max_new_tokens, sampling);
        let part = self.generator.generate(request).await;
        self.checked(part, max_new_tokens)
    }

    /// Every one of `asks` in one call to the generator ([`Generator::generate_batch`]),
    /// checked; answers in their order.
    pub(crate) async fn parts(&self, asks: &[Ask]) -> Vec<Result<Completion, PluginError>> {
        let requests = asks
            .iter()
            .map(|a| self.request(a.sample_id, a.input.clone(), a.max_new_tokens, &a.sampling))
            .collect();
        let parts = self.generator.generate_batch(requests).await;
        if parts.len() != asks.len() {
            let message = format!(
                "answered {} of a batch of {} requests",
                parts.len(),
                asks.len()
            );
            return asks
                .iter()
                .map(|_| Err(PluginError::failed(self.generator.name(), message.clone())))
                .collect();
        }
        parts
            .into_iter()
            .zip(asks)
            .map(|(part, ask)| self.checked(part, ask.max_new_tokens))
            .collect()
    }

    fn request(
        &self,
        sample_id: u64,
        input_ids: Vec<u32>,
        max_new_tokens: usize,
        sampling: &SamplingParams,
    ) -> GenerateRequest {
        GenerateRequest {
            sample_id,
            input_ids,
            max_new_tokens,
            sampling: sampling.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
        }
    }

    /// A generator's answer, refused if malformed or over its budget; counted.
    fn checked(
        &self,
        part: Result<Completion, PluginError>,
        max_new_tokens: usize,
    ) -> Result<Completion, PluginError> {
        let part = part?;
        part.check().map_err(|e| {
            PluginError::failed(self.generator.name(), format!("malformed completion: {e}"))
        })?;
        if part.len() > max_new_tokens {
            return Err(PluginError::failed(
                self.generator.name(),
                format!(
                    "returned {} tokens for a budget of {max_new_tokens}",
                    part.len()
                ),
            ));
        }
        self.counters
            .generated_tokens
            .fetch_add(part.len() as u64, Ordering::Relaxed);
        Ok(part)
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
                metadata: if self.data_source.is_empty() {
                    Default::default()
                } else {
                    let mut m = serde_json::Map::new();
                    m.insert("data_source".into(), self.data_source.clone().into());
                    m
                },
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
        self.counters.rewards.fetch_add(1, Ordering::Relaxed);
        if verified.cached {
            self.counters
                .reward_cache_hits
                .fetch_add(1, Ordering::Relaxed);
        }
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
        let start = vec![SampleProgress::default(); spec.group_size];
        self.run_group_from(spec, Arc::new(item), start, Arc::new(NoProgress))
            .await
    }

    /// [`run_group`](Self::run_group) from where each sample was (`start`: a resumed run's
    /// partial samples, or nothing yet), telling `progress` of every step.
    pub(crate) async fn run_group_from(
        self: &Arc<Self>,
        spec: GroupSpec,
        item: Arc<TaskItem>,
        start: Vec<SampleProgress>,
        progress: Arc<dyn Progress>,
    ) -> Result<TrajectoryGroup, PluginError> {
        let prompt_ids = Arc::new(self.prompt_ids(&item)?);
        let mut samples = JoinSet::new();
        for (j, start) in start.into_iter().enumerate() {
            let this = self.clone();
            let (item, prompt_ids, sampling, progress) = (
                item.clone(),
                prompt_ids.clone(),
                spec.sampling.clone(),
                progress.clone(),
            );
            let sample_id = spec.sample_id(j);
            samples.spawn(async move {
                let completion = if start.done {
                    start.completion
                } else {
                    this.generate_from(
                        sample_id,
                        &prompt_ids,
                        start.completion,
                        spec.max_new_tokens,
                        &sampling,
                        |part, done| progress.generated(j, part, done),
                    )
                    .await?
                };
                let reward = match start.reward {
                    Some(reward) => reward,
                    None => {
                        let reward = this.reward(sample_id, &item, &completion).await?.reward;
                        progress.rewarded(j, &reward);
                        reward
                    }
                };
                Ok::<_, PluginError>(Trajectory {
                    sample_id,
                    completion,
                    reward,
                })
            });
        }
        let mut done = Vec::with_capacity(spec.group_size);
        while let Some(joined) = samples.join_next().await {
            let result = joined
                .map_err(|e| PluginError::failed("rollout", format!("sample task failed: {e}")))?;
            done.push(result?);
        }
        assemble(&spec, &item, prompt_ids.to_vec(), done)
    }

    /// The prompt of `item` as token ids (never empty), in the format of `[prompt]`.
    pub(crate) fn prompt_ids(&self, item: &TaskItem) -> Result<Vec<u32>, PluginError> {
        let text = self.prompt.render(self.tokenizer.as_ref(), &item.prompt)?;
        let prompt_ids = self.tokenizer.encode(&text)?;
        if prompt_ids.is_empty() {
            return Err(PluginError::failed(
                "rollout",
                format!("prompt of item {} encodes to no tokens", item.id),
            ));
        }
        Ok(prompt_ids)
    }
}

/// The group of `spec` from its rewarded samples (in any order): those whose verifier failed
/// are left out; an error if every one did.
pub(crate) fn assemble(
    spec: &GroupSpec,
    item: &TaskItem,
    prompt_ids: Vec<u32>,
    mut done: Vec<Trajectory>,
) -> Result<TrajectoryGroup, PluginError> {
    done.sort_by_key(|t| t.sample_id);
    let failed = done
        .iter()
        .filter(|t| t.reward.verdict.is_failure())
        .count();
    if failed > 0 && failed == done.len() {
        let first = &done[0].reward;
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
        prompt_ids,
        admitted_at: spec.admitted_at,
        samples: done
            .into_iter()
            .filter(|t| !t.reward.verdict.is_failure())
            .collect(),
    })
}

/// One generator call to make: up to `max_new_tokens` tokens after `input`.
#[derive(Clone, Debug)]
pub(crate) struct Ask {
    pub(crate) sample_id: u64,
    pub(crate) input: Vec<u32>,
    pub(crate) max_new_tokens: usize,
    pub(crate) sampling: SamplingParams,
}

/// Where one sample of a group is: the tokens it has, whether they are final, its reward.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct SampleProgress {
    /// What was generated so far (all of it once `done`).
    pub(crate) completion: Completion,
    /// The completion is final (stopped or at its budget).
    pub(crate) done: bool,
    /// Its reward, once verified.
    pub(crate) reward: Option<Reward>,
}

impl Default for SampleProgress {
    fn default() -> Self {
        Self {
            completion: Completion::empty(FinishReason::Length),
            done: false,
            reward: None,
        }
    }
}

/// Told of each step of a group's samples (the controller records them, so that a checkpoint
/// holds the partial samples).
pub(crate) trait Progress: Send + Sync {
    /// Sample `j` got `part`; `done`: its completion is final.
    fn generated(&self, j: usize, part: &Completion, done: bool);
    /// Sample `j` was rewarded.
    fn rewarded(&self, j: usize, reward: &Reward);
}

struct NoProgress;

impl Progress for NoProgress {
    fn generated(&self, _: usize, _: &Completion, _: bool) {}
    fn rewarded(&self, _: usize, _: &Reward) {}
}

/// What a group rollout is asked to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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

impl GroupSpec {
    /// The id of sample `j` of the group: `group_id · group_size + j`, unique in the run.
    pub fn sample_id(&self, j: usize) -> u64 {
        self.group_id * self.group_size as u64 + j as u64
    }
}
