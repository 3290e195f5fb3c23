//! The group runner: the generator, tokenizer, episode, tools and reward service a run's
//! samples use, and what a group of samples is made of. Running the episodes is
//! the episode module's part.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use areal_sdk::{
    ChatMessage, Completion, Episode, FinishReason, GenerateRequest, Generator, PluginError,
    PolicyVersion, Reward, RewardInput, SamplingParams, SingleTurn, TaskItem, Tokenizer, Tool,
    ToolSchema, Trajectory, TrajectoryGroup, TurnReward,
};
use serde::{Deserialize, Serialize};

use crate::config::PromptConfig;
use crate::reward_service::{RewardService, Verified};

/// Rewards lost to their verifier's failure that the log names, one line each, per run.
const NAMED_REWARD_FAILURES: u64 = 10;

/// Counters the group runner updates and each training step drains.
#[derive(Debug, Default)]
pub struct GroupCounters {
    /// Tokens generated (all samples, whatever became of them).
    pub generated_tokens: AtomicU64,
    /// Generate calls that returned `interrupted`.
    pub interruptions: AtomicU64,
    /// Samples lost to verifier failures.
    pub reward_failures: AtomicU64,
    /// Samples lost to verifier failures over the whole run (never drained): the first few are
    /// named in the log.
    pub reward_failures_seen: AtomicU64,
    /// Reward latencies in milliseconds since last drained.
    pub reward_latencies_ms: Mutex<Vec<f64>>,
    /// Rewards asked for since last drained.
    pub rewards: AtomicU64,
    /// Of which the reward cache answered.
    pub reward_cache_hits: AtomicU64,
    /// Episodes run to their end (or failure).
    pub episodes: AtomicU64,
    /// Turns the episodes generated.
    pub turns: AtomicU64,
    /// Episodes that called a tool at least once.
    pub episodes_calling_tools: AtomicU64,
    /// Tool calls.
    pub tool_calls: AtomicU64,
    /// Tool calls that came back as errors (malformed, unknown tool, a limit, a traceback).
    pub tool_errors: AtomicU64,
    /// Episodes whose tokens were compared with their conversation rendered by the chat
    /// template.
    pub retokenization_checked: AtomicU64,
    /// Of which spelled another text than the rendering.
    pub retokenization_mismatches: AtomicU64,
    /// Of which spelled the rendering in other tokens than tokenizing it gives.
    pub retokenization_drift: AtomicU64,
    /// Times an episode split its sample ([`EpisodeContext::split`]: a client that rewrote
    /// the history its next turn reads).
    ///
    /// [`EpisodeContext::split`]: areal_sdk::EpisodeContext::split
    pub episode_splits: AtomicU64,
}

impl GroupCounters {
    /// Count an episode that ended.
    pub(crate) fn record_episode(&self, stats: &EpisodeStats) {
        self.episodes.fetch_add(1, Ordering::Relaxed);
        self.turns.fetch_add(stats.turns, Ordering::Relaxed);
        self.tool_calls
            .fetch_add(stats.tool_calls, Ordering::Relaxed);
        self.tool_errors
            .fetch_add(stats.tool_errors, Ordering::Relaxed);
        self.episode_splits
            .fetch_add(stats.splits, Ordering::Relaxed);
        if stats.tool_calls > 0 {
            self.episodes_calling_tools.fetch_add(1, Ordering::Relaxed);
        }
        let count = |counter: &AtomicU64| {
            counter.fetch_add(1, Ordering::Relaxed);
        };
        match stats.retokenization {
            Retokenization::Unchecked => {}
            Retokenization::Agrees => count(&self.retokenization_checked),
            Retokenization::Drift => {
                count(&self.retokenization_checked);
                count(&self.retokenization_drift);
            }
            Retokenization::Mismatch => {
                count(&self.retokenization_checked);
                count(&self.retokenization_mismatches);
            }
        }
    }

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

/// Runs groups: generator, tokenizer, episode, tools and reward service together.
pub struct GroupRunner {
    generator: Arc<dyn Generator>,
    tokenizer: Arc<dyn Tokenizer>,
    rewards: RewardService,
    episode: Arc<dyn Episode>,
    tools: Vec<Arc<dyn Tool>>,
    /// Each tool's schema (`tools[i].schema()`), read once.
    tool_schemas: Vec<ToolSchema>,
    /// Each tool's name as the model is told it (`tool_schemas[i].name`).
    tool_names: Vec<String>,
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
            episode: Arc::new(SingleTurn),
            tools: Vec::new(),
            tool_schemas: Vec::new(),
            tool_names: Vec::new(),
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
        prompt
            .render(self.tokenizer.as_ref(), "", &[])
            .map_err(|e| {
                PluginError::failed(
                    "prompt",
                    format!("prompt.format = \"chat\" needs the model's chat template: {e}"),
                )
            })?;
        self.prompt = prompt;
        Ok(self)
    }

    /// Samples run as `episode`, with `tools` (by default one turn, no tools).
    pub fn with_episode(mut self, episode: Arc<dyn Episode>, tools: Vec<Arc<dyn Tool>>) -> Self {
        self.episode = episode;
        self.tool_schemas = tools.iter().map(|t| t.schema()).collect();
        self.tool_names = self.tool_schemas.iter().map(|s| s.name.clone()).collect();
        self.tools = tools;
        self
    }

    /// The episode every sample runs.
    pub fn episode(&self) -> &Arc<dyn Episode> {
        &self.episode
    }

    /// The tools episodes may call.
    pub fn tools(&self) -> &[Arc<dyn Tool>] {
        &self.tools
    }

    /// The tool the model calls `name` (the name its schema tells; a plugin's kind may serve
    /// tools of several names).
    pub fn tool(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        let i = self.tool_names.iter().position(|n| n == name)?;
        Some(&self.tools[i])
    }

    /// The names the model calls the tools by, in the order of `[[tools]]`.
    pub fn tool_names(&self) -> &[String] {
        &self.tool_names
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

    /// Reward `text`, what the verifier grades of `completion` (its decoded text for a
    /// single turn).
    pub async fn reward(
        &self,
        sample_id: u64,
        item: &TaskItem,
        text: &str,
        completion: &Completion,
    ) -> Result<Verified, PluginError> {
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
                completion: text.to_owned(),
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
            // a reward's bug (an exception, a NaN, a string) costs the sample: say which, and
            // why, for the first few; the rest are counted (`reward_failures` of each step)
            let seen = self
                .counters
                .reward_failures_seen
                .fetch_add(1, Ordering::Relaxed);
            if seen < NAMED_REWARD_FAILURES {
                let why: String = failure_message(&verified.reward)
                    .unwrap_or_default()
                    .chars()
                    .take(500)
                    .collect();
                tracing::warn!(
                    target: "areal::reward",
                    sample_id,
                    item = %item.id,
                    verdict = verified.reward.verdict.as_str(),
                    "the sample lost its reward and is not trained on: {why}{}",
                    if seen + 1 == NAMED_REWARD_FAILURES {
                        " (further ones are counted in each step's reward_failures, not named)"
                    } else {
                        ""
                    }
                );
            }
        }
        Ok(verified)
    }

    /// `item`'s prompt as chat messages, when prompts are in the chat format (none yet, for
    /// an episode that writes its own).
    pub(crate) fn prompt_messages(&self, item: &TaskItem) -> Option<Vec<ChatMessage>> {
        if self.episode.traits().own_prompt {
            return Some(Vec::new());
        }
        self.prompt.messages(&item.prompt)
    }

    /// The tokens that end a turn.
    pub(crate) fn stop_token_ids(&self) -> &[u32] {
        &self.stop_token_ids
    }

    /// What the model is told of the tools, in the order of `[[tools]]`.
    pub fn tool_schemas(&self) -> &[ToolSchema] {
        &self.tool_schemas
    }

    /// The prompt of `item` as token ids, in the format of `[prompt]`: never empty, except
    /// for an episode that writes its own ([`EpisodeTraits::own_prompt`]), which has none.
    ///
    /// [`EpisodeTraits::own_prompt`]: areal_sdk::EpisodeTraits::own_prompt
    pub(crate) fn prompt_ids(&self, item: &TaskItem) -> Result<Vec<u32>, PluginError> {
        if self.episode.traits().own_prompt {
            return Ok(Vec::new());
        }
        self.task_prompt_ids(item)
    }

    /// The prompt of `item` as `[prompt]` renders it, whatever the episode (the warm-up's
    /// prompt: for an episode that writes its own, what its program is expected to send).
    pub(crate) fn task_prompt_ids(&self, item: &TaskItem) -> Result<Vec<u32>, PluginError> {
        let text = self
            .prompt
            .render(self.tokenizer.as_ref(), &item.prompt, &self.tool_schemas)?;
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

/// Why a verifier failed, as its failed reward says (`error` or `message` of its details).
fn failure_message(reward: &Reward) -> Option<String> {
    let details = &reward.provenance.details;
    let said = details.get("error").or_else(|| details.get("message"))?;
    Some(
        said.as_str()
            .map_or_else(|| said.to_string(), str::to_owned),
    )
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
        let why = failure_message(first).map_or_else(String::new, |text| format!(": {text}"));
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

/// Where a turn of an episode ended, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TurnEnd {
    /// The completion's length at the end of the turn.
    pub(crate) end: usize,
    /// Why the turn ended.
    pub(crate) finish_reason: FinishReason,
}

/// What an episode did, counted per step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EpisodeStats {
    /// Turns generated (replayed ones included).
    pub(crate) turns: u64,
    /// Tool calls made.
    pub(crate) tool_calls: u64,
    /// Of which came back as errors.
    pub(crate) tool_errors: u64,
    /// Times the episode split its sample.
    pub(crate) splits: u64,
    /// How the episode's tokens compare with its conversation rendered by the chat template.
    pub(crate) retokenization: Retokenization,
}

/// How an episode's tokens compare with what the model's chat template renders for its
/// conversation: at every turn, the tokens before it against the rendering of the
/// conversation so far with the generation prompt (what a system that renders and tokenizes
/// again would feed the model), and at the end, against the rendering of the whole.
/// Ordered from best to worst: an episode keeps its worst comparison.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Retokenization {
    /// Not compared: the prompt is not in the chat format, text was appended bare, or the
    /// template could not render the conversation.
    #[default]
    Unchecked,
    /// The tokens are exactly the rendering's tokens.
    Agrees,
    /// The tokens spell the rendering, but tokenizing it again gives other tokens (the
    /// policy sampled a split of the text the tokenizer would not make): a system that
    /// decodes and tokenizes again would train on tokens the policy never sampled.
    Drift,
    /// The tokens spell another text than the rendering: the template writes the
    /// conversation differently from how it was generated (Qwen3's drops earlier `<think>`
    /// blocks), or the episode's environment text is not the template's.
    Mismatch,
}

/// Where one sample of a group is: its episode's tokens so far, where its turns ended, and
/// once it has ended, its reward.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct SampleProgress {
    /// What the episode has so far, sampled and environment tokens (all of it once `done`).
    pub(crate) completion: Completion,
    /// Where each of its turns ended.
    #[serde(default)]
    pub(crate) turns: Vec<TurnEnd>,
    /// The episode ended: the completion is final and `reward` is its reward.
    pub(crate) done: bool,
    /// Its reward, once the episode ended.
    pub(crate) reward: Option<Reward>,
    /// The samples split off before `completion` ([`EpisodeContext::split`]), in order.
    ///
    /// [`EpisodeContext::split`]: areal_sdk::EpisodeContext::split
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) segments: Vec<Segment>,
}

impl Default for SampleProgress {
    fn default() -> Self {
        Self {
            completion: Completion::empty(FinishReason::Length),
            turns: Vec::new(),
            done: false,
            reward: None,
            segments: Vec::new(),
        }
    }
}

impl SampleProgress {
    /// The current part becomes a segment given `turn_rewards`; the next starts empty.
    pub(crate) fn split(&mut self, turn_rewards: &[TurnReward]) {
        let completion = std::mem::replace(
            &mut self.completion,
            Completion::empty(FinishReason::Length),
        );
        self.segments.push(Segment {
            completion,
            turns: std::mem::take(&mut self.turns),
            turn_rewards: turn_rewards.to_vec(),
        });
    }

    /// The samples of an ended episode: each segment with `reward`'s verdict and value and
    /// its own turn rewards, then the last part with `reward` itself.
    pub(crate) fn samples(&self, sample_id: u64, reward: &Reward) -> Vec<Trajectory> {
        let mut out: Vec<Trajectory> = self
            .segments
            .iter()
            .map(|s| s.sample(sample_id, reward))
            .collect();
        out.push(Trajectory {
            sample_id,
            completion: self.completion.clone(),
            reward: reward.clone(),
        });
        out
    }
}

/// A sample an episode split off ([`SampleProgress::segments`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Segment {
    /// Its tokens after the prompt.
    pub(crate) completion: Completion,
    /// Where its turns ended.
    pub(crate) turns: Vec<TurnEnd>,
    /// The rewards given to its turns.
    #[serde(default)]
    pub(crate) turn_rewards: Vec<TurnReward>,
}

impl Segment {
    /// The segment as a sample of id `sample_id` with the episode's `reward` (its turn
    /// rewards its own).
    pub(crate) fn sample(&self, sample_id: u64, reward: &Reward) -> Trajectory {
        let mut reward = reward.clone();
        reward.turns = self.turn_rewards.clone();
        Trajectory {
            sample_id,
            completion: self.completion.clone(),
            reward,
        }
    }
}

/// Told of each step of a group's samples (the controller records them, so that a checkpoint
/// holds the partial episodes).
pub(crate) trait Progress: Send + Sync {
    /// Sample `j` got `part` (sampled or environment tokens), and `end` when the part ends a
    /// turn (told together, so that a record never holds a turn's last tokens without its
    /// end).
    fn extended(&self, j: usize, part: &Completion, end: Option<TurnEnd>);
    /// A turn of sample `j` ended (one whose end came with no part of its own).
    fn turn_ended(&self, j: usize, end: TurnEnd);
    /// Sample `j`'s episode ended with `reward`.
    fn finished(&self, j: usize, reward: &Reward);
    /// Sample `j`'s tokens so far became a sample of their own (with `turn_rewards`), and the
    /// episode goes on in a new one.
    fn split(&self, j: usize, turn_rewards: &[TurnReward]) {
        let _ = (j, turn_rewards);
    }
    /// Sample `j`'s episode starts over: what it had is dropped.
    fn restarted(&self, j: usize) {
        let _ = j;
    }
    /// Sample `j`'s tokens after its first `len` were taken back (a refused turn's
    /// environment tokens).
    fn withdrawn(&self, j: usize, len: usize) {
        let _ = (j, len);
    }
    /// Whether the episode counts in the step metrics' episodes, turns and tool calls (those
    /// generated for training do; evaluation's do not).
    fn counted(&self) -> bool {
        true
    }
}

pub(crate) struct NoProgress;

impl Progress for NoProgress {
    fn extended(&self, _: usize, _: &Completion, _: Option<TurnEnd>) {}
    fn turn_ended(&self, _: usize, _: TurnEnd) {}
    fn finished(&self, _: usize, _: &Reward) {}
}

/// An evaluation's episodes: nothing recorded, nothing counted in the step metrics.
pub(crate) struct Evaluating;

impl Progress for Evaluating {
    fn extended(&self, _: usize, _: &Completion, _: Option<TurnEnd>) {}
    fn turn_ended(&self, _: usize, _: TurnEnd) {}
    fn finished(&self, _: usize, _: &Reward) {}
    fn counted(&self) -> bool {
        false
    }
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
