//! Episodes in the engine: the context an [`Episode`] drives, how its turns reach the
//! generator, and how a recorded episode is replayed on a resumed run.
//!
//! Every sample is an episode; the single-turn path is the one-turn episode. The context keeps
//! the sample's one token sequence: the prompt, the turns the policy sampled (each token with
//! its behaviour logprob and version) and the environment's tokens between them. A turn's
//! input is exactly the tokens before it; nothing is decoded and tokenized again.
//!
//! **Turns reach the generator** in one of two ways ([`Sampler`]): at once (the default: a
//! weight update interrupts a turn, which goes on under the new weights), or in rounds
//! (deterministic mode, batched evaluation): every episode at work runs until it waits for a
//! turn or ends, and then the waiting turns go to the generator together, in sample order,
//! at most `chunk` tokens each. What an episode does between turns (tools, rewards) happens
//! inside a round, so nothing depends on timing.
//!
//! **Replay.** A checkpoint holds each sample's tokens so far and where its turns ended, not
//! the episode's own state (a tool's variables). A resumed episode runs again from the start:
//! each turn it asks for is answered from the record, each environment text it appends is
//! checked against the record (an episode whose tools answer differently is refused, naming
//! the token), and generation goes on live where the record ends, in the middle of a turn if
//! that is where it was.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use areal_sdk::{
    ChatMessage, Completion, EpisodeContext, FinishReason, PluginError, Reward, SamplingParams,
    TaskItem, Tokenizer, ToolOutput, ToolSchema, ToolSession, Trajectory, TrajectoryGroup, Turn,
    TurnOptions, TurnReward, mix_seed,
};
use serde_json::{Map, Value};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinSet;

use crate::group_runner::{
    Ask, EpisodeStats, GroupRunner, GroupSpec, NoProgress, Progress, Retokenization,
    SampleProgress, Segment, TurnEnd, assemble,
};

/// How an episode's turns reach the generator.
#[derive(Clone)]
pub(crate) enum Sampler {
    /// Each call as soon as it is made, for the whole budget left.
    Live,
    /// Each call in the next round of `rounds`, at most `chunk` tokens.
    Rounds {
        /// The rounds.
        rounds: Arc<Rounds>,
        /// Tokens per call at most.
        chunk: usize,
    },
}

impl Sampler {
    async fn part(&self, runner: &GroupRunner, ask: Ask) -> Result<Completion, PluginError> {
        match self {
            Sampler::Live => {
                runner
                    .part(ask.sample_id, &ask.input, ask.max_new_tokens, &ask.sampling)
                    .await
            }
            Sampler::Rounds { rounds, .. } => rounds.park(ask).await,
        }
    }

    fn chunk(&self) -> Option<usize> {
        match self {
            Sampler::Live => None,
            Sampler::Rounds { chunk, .. } => Some((*chunk).max(1)),
        }
    }
}

/// One turn: generator calls after `input` until the turn is final (stopped, at `budget`
/// tokens of `completion`, or short of a call's ask), appending each part to `input` and
/// `completion` and showing it to `on_part`. An interrupted part (a weight update) is
/// continued under the new weights.
#[allow(
    clippy::too_many_arguments,
    reason = "one turn's whole state, each part distinct"
)]
pub(crate) async fn sample_turn(
    runner: &GroupRunner,
    sampler: &Sampler,
    sample_id: u64,
    input: &mut Vec<u32>,
    completion: &mut Completion,
    budget: usize,
    sampling: &SamplingParams,
    mut on_part: impl FnMut(&Completion, Option<TurnEnd>) + Send,
) -> Result<(), PluginError> {
    loop {
        let left = budget.saturating_sub(completion.len());
        if left == 0 {
            completion.finish_reason = FinishReason::Length;
            return Ok(());
        }
        let max_new_tokens = sampler.chunk().map_or(left, |chunk| chunk.min(left));
        let ask = Ask {
            sample_id,
            input: input.clone(),
            max_new_tokens,
            sampling: sampling.clone(),
        };
        let part = sampler.part(runner, ask).await?;
        let (reason, n) = (part.finish_reason, part.len());
        // final when stopped, at the budget, or short of what was asked (the context is full)
        let last = match reason {
            FinishReason::Stop => true,
            FinishReason::Interrupted => n >= left,
            FinishReason::Length => n < max_new_tokens || n >= left,
        };
        input.extend(&part.token_ids);
        // the turn's end goes with its last part
        let end = last.then(|| TurnEnd {
            end: completion.len() + n,
            finish_reason: match reason {
                FinishReason::Interrupted => FinishReason::Length,
                reason => reason,
            },
        });
        on_part(&part, end);
        completion.extend(part);
        if reason == FinishReason::Interrupted {
            runner
                .counters
                .interruptions
                .fetch_add(1, Ordering::Relaxed);
        }
        if last {
            if reason == FinishReason::Interrupted {
                completion.finish_reason = FinishReason::Length;
            }
            return Ok(());
        }
        if reason == FinishReason::Interrupted && n == 0 {
            // A generator that returns at once while paused must not make us spin.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Running samples: one turn alone, or a group of episodes.
impl GroupRunner {
    /// Generate one completion of up to `max_new_tokens` for `prompt_ids` (one turn, no
    /// episode).
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
        sample_turn(
            self,
            &Sampler::Live,
            sample_id,
            &mut input,
            &mut completion,
            max_new_tokens,
            sampling,
            |_, _| {},
        )
        .await?;
        Ok(completion)
    }

    /// Run and reward `group_size` episodes for `item`. Samples whose verifier failed are
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
                EpisodeRun::run(
                    &this,
                    &Sampler::Live,
                    &item,
                    &prompt_ids,
                    sample_id,
                    spec.max_new_tokens,
                    &sampling,
                    start,
                    progress.as_ref(),
                    j,
                )
                .await
            });
        }
        let mut done = Vec::with_capacity(spec.group_size);
        while let Some(joined) = samples.join_next().await {
            let result = joined
                .map_err(|e| PluginError::failed("rollout", format!("sample task failed: {e}")))?;
            done.extend(result?);
        }
        assemble(&spec, &item, prompt_ids.to_vec(), done)
    }
}

/// A sample's tokens and turns as a checkpoint recorded them.
struct Record {
    completion: Completion,
    turns: Vec<TurnEnd>,
}

/// Where one episode runs: the [`EpisodeContext`] the engine gives an [`Episode`](areal_sdk::Episode).
pub(crate) struct EpisodeRun<'a> {
    runner: &'a GroupRunner,
    sampler: &'a Sampler,
    item: &'a TaskItem,
    prompt: &'a [u32],
    sample_id: u64,
    budget: usize,
    sampling: &'a SamplingParams,
    progress: &'a dyn Progress,
    j: usize,
    /// Prompt and completion: the next turn's input.
    input: Vec<u32>,
    completion: Completion,
    turns: Vec<TurnEnd>,
    record: Option<Record>,
    sessions: BTreeMap<String, Box<dyn ToolSession>>,
    stats: EpisodeStats,
    /// The conversation as chat messages, while it is known (see
    /// [`EpisodeContext::conversation`]).
    conversation: Option<Vec<ChatMessage>>,
    /// Whether it was known and then lost (text appended bare, a template that failed): the
    /// episode is then not counted as compared.
    conversation_lost: bool,
    /// Rewards given to turns ([`EpisodeContext::reward_turn`]).
    turn_rewards: Vec<TurnReward>,
    /// The tools the conversation is rendered with, where the episode set its own
    /// ([`EpisodeContext::set_tools`]).
    tools: Option<Vec<ToolSchema>>,
    /// The samples split off so far ([`EpisodeContext::split`]).
    segments: Vec<Segment>,
    /// The episode writes its own prompt ([`EpisodeTraits::own_prompt`]): the environment's
    /// tokens before its first turn are that prompt, not counted in the budget.
    ///
    /// [`EpisodeTraits::own_prompt`]: areal_sdk::EpisodeTraits::own_prompt
    own_prompt: bool,
    /// The sample as the last turn (or the sample's start) left it: what a turn the
    /// generator refuses as the caller's fault goes back to.
    settled: Settled,
}

/// Where a sample stood after its last turn: its length and its conversation.
struct Settled {
    len: usize,
    conversation: Option<Vec<ChatMessage>>,
    conversation_lost: bool,
}

/// An episode's context's description of a replay that went another way.
fn diverged(at: usize, what: &str) -> PluginError {
    PluginError::failed(
        "episode",
        format!(
            "the resumed episode went another way than the recorded one at token {at}: {what} \
             (an episode must do the same for the same turns: are its tools deterministic?)"
        ),
    )
}

impl<'a> EpisodeRun<'a> {
    /// Run `runner`'s episode for sample `j` (id `sample_id`) of `item` from `start`, with
    /// turns from `sampler`, telling `progress` of every new token, turn end and the end:
    /// the episode's samples (one, or more where it split), rewarded. A sample `start` has
    /// finished is not run again. One that cannot be replayed (an outside program's, or one
    /// that had split) starts over.
    #[allow(clippy::too_many_arguments, reason = "one sample's whole setting")]
    pub(crate) async fn run(
        runner: &'a GroupRunner,
        sampler: &'a Sampler,
        item: &'a TaskItem,
        prompt: &'a [u32],
        sample_id: u64,
        budget: usize,
        sampling: &'a SamplingParams,
        start: SampleProgress,
        progress: &'a dyn Progress,
        j: usize,
    ) -> Result<Vec<Trajectory>, PluginError> {
        if let (true, Some(reward)) = (start.done, &start.reward) {
            return Ok(start.samples(sample_id, reward));
        }
        let traits = runner.episode().traits();
        let started = !start.completion.is_empty() || !start.segments.is_empty();
        let start = if started && (traits.not_replayable || !start.segments.is_empty()) {
            progress.restarted(j);
            SampleProgress::default()
        } else {
            start
        };
        let record = (!start.completion.is_empty()).then(|| {
            let mut turns = start.turns;
            if start.done && turns.last().is_none_or(|t| t.end < start.completion.len()) {
                // (what a single-turn sample recorded before turns were)
                turns.push(TurnEnd {
                    end: start.completion.len(),
                    finish_reason: start.completion.finish_reason,
                });
            }
            Record {
                completion: start.completion,
                turns,
            }
        });
        let mut run = EpisodeRun {
            runner,
            sampler,
            item,
            prompt,
            sample_id,
            budget,
            sampling,
            progress,
            j,
            input: prompt.to_vec(),
            completion: Completion::empty(FinishReason::Length),
            turns: Vec::new(),
            record,
            sessions: BTreeMap::new(),
            stats: EpisodeStats::default(),
            conversation: runner.prompt_messages(item),
            conversation_lost: false,
            turn_rewards: Vec::new(),
            tools: None,
            segments: Vec::new(),
            own_prompt: traits.own_prompt,
            settled: Settled {
                len: 0,
                conversation: runner.prompt_messages(item),
                conversation_lost: false,
            },
        };
        let reward = runner.episode().run(&mut run).await;
        if reward.is_ok() {
            run.compare_with_template(false);
        }
        if run.conversation_lost && run.stats.retokenization != Retokenization::Mismatch {
            run.stats.retokenization = Retokenization::Unchecked;
        }
        if progress.counted() {
            runner.counters.record_episode(&run.stats);
        }
        let mut reward = reward?;
        reward.turns.append(&mut run.turn_rewards);
        if let Some(record) = &run.record
            && run.completion.len() < record.completion.len()
        {
            return Err(diverged(
                run.completion.len(),
                "the episode ended before the recorded tokens did",
            ));
        }
        progress.finished(j, &reward);
        let mut samples: Vec<Trajectory> = run
            .segments
            .iter()
            .map(|s| s.sample(sample_id, &reward))
            .collect();
        samples.push(Trajectory {
            sample_id,
            completion: run.completion,
            reward,
        });
        Ok(samples)
    }

    /// The recorded turn that starts where the completion is: its end (`None`: the record
    /// ends inside it) after checking that the policy sampled every token of it.
    fn recorded_turn(&self) -> Result<Option<(usize, Option<TurnEnd>)>, PluginError> {
        let Some(record) = &self.record else {
            return Ok(None);
        };
        let at = self.completion.len();
        if at >= record.completion.len() {
            return Ok(None);
        }
        let end = record.turns.iter().find(|t| t.end > at).copied();
        let stop = end.map_or(record.completion.len(), |t| t.end);
        if let Some(i) = (at..stop).find(|&i| !record.completion.is_sampled(i)) {
            return Err(diverged(
                i,
                "the episode asked for a turn where the environment had written",
            ));
        }
        Ok(Some((stop, end)))
    }

    /// Append tokens `at..stop` of the record.
    fn take_recorded(&mut self, stop: usize) {
        let record = self.record.as_ref().expect("a record to take from");
        let at = self.completion.len();
        let c = &record.completion;
        for i in at..stop {
            self.completion
                .push(c.token_ids[i], c.behaviour_logprobs[i], c.versions[i]);
        }
        self.input.extend(&c.token_ids[at..stop]);
    }
}

#[areal_sdk::async_trait]
impl EpisodeContext for EpisodeRun<'_> {
    fn item(&self) -> &TaskItem {
        self.item
    }

    fn prompt_ids(&self) -> &[u32] {
        self.prompt
    }

    fn completion(&self) -> &Completion {
        &self.completion
    }

    fn tokens_left(&self) -> usize {
        self.limit().saturating_sub(self.completion.len())
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        self.runner.tokenizer().as_ref()
    }

    async fn generate_with(&mut self, options: &TurnOptions) -> Result<Turn, PluginError> {
        let sampling = self.turn_sampling(options)?;
        self.compare_with_template(true);
        let turn = match self
            .sample(options.max_tokens, &sampling, &options.stop)
            .await
        {
            Ok(turn) => turn,
            Err(e) if e.is_invalid_request() => {
                self.withdraw();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if self.conversation.is_some() {
            // the assistant's message is the text sampled, every token spelled (a special
            // token the policy sampled inside the turn too), its stop token left to the
            // template
            let mut ids = &turn.token_ids[..];
            if let Some((last, rest)) = ids.split_last()
                && self.runner.stop_token_ids().contains(last)
            {
                ids = rest;
            }
            match self.runner.tokenizer().decode_verbatim(ids) {
                Ok(text) => {
                    let conversation = self.conversation.as_mut().expect("checked above");
                    conversation.push(ChatMessage::new("assistant", &text));
                }
                Err(_) => self.forget_conversation(),
            }
        }
        self.settle();
        Ok(turn)
    }

    fn append(&mut self, text: &str) -> Result<usize, PluginError> {
        let ids = self.runner.tokenizer().encode(text)?;
        self.append_ids(&ids)
    }

    fn append_ids(&mut self, token_ids: &[u32]) -> Result<usize, PluginError> {
        self.forget_conversation();
        self.push_environment(token_ids)
    }

    fn append_messages(&mut self, messages: &[ChatMessage]) -> Result<usize, PluginError> {
        let Some(conversation) = &self.conversation else {
            return Err(PluginError::failed(
                "episode",
                if self.conversation_lost {
                    "append_messages after text was appended bare: the conversation is no \
                     longer known as messages"
                } else {
                    "append_messages needs prompts in the model's chat format \
                     (prompt.format = \"chat\")"
                },
            ));
        };
        let tokenizer = self.runner.tokenizer();
        let mut extended = conversation.clone();
        extended.extend_from_slice(messages);
        let rendered = tokenizer.render_chat(&extended, self.tool_schemas(), true)?;
        let so_far = tokenizer.decode_verbatim(&self.input)?;
        let new = markup_after(&so_far, &rendered);
        let ids = tokenizer.encode(new)?;
        let appended = self.push_environment(&ids)?;
        // (cut by the budget, the tokens are the start of the rendering, which the
        // comparison allows once no budget is left)
        self.conversation = Some(extended);
        Ok(appended)
    }

    fn conversation(&self) -> Option<&[ChatMessage]> {
        self.conversation.as_deref()
    }

    fn tools(&self) -> Vec<ToolSchema> {
        self.runner.tools().iter().map(|t| t.schema()).collect()
    }

    fn set_tools(&mut self, tools: Vec<ToolSchema>) {
        self.tools = Some(tools);
    }

    fn split(&mut self) -> Result<(), PluginError> {
        if self.turns.is_empty() {
            return Err(PluginError::failed(
                "episode",
                "split before any turn was generated: there is no sample to end",
            ));
        }
        // a resumed episode that split where the record goes on went another way
        if let Some(record) = self.record.take()
            && record.completion.len() > self.completion.len()
        {
            return Err(diverged(
                self.completion.len(),
                "the episode split its sample where the record goes on",
            ));
        }
        self.compare_with_template(false);
        self.stats.splits += 1;
        let turn_rewards = std::mem::take(&mut self.turn_rewards);
        self.progress.split(self.j, &turn_rewards);
        self.segments.push(Segment {
            completion: std::mem::replace(
                &mut self.completion,
                Completion::empty(FinishReason::Length),
            ),
            turns: std::mem::take(&mut self.turns),
            turn_rewards,
        });
        self.input = self.prompt.to_vec();
        self.conversation = self.runner.prompt_messages(self.item);
        self.settle();
        Ok(())
    }

    async fn call_tool(&mut self, name: &str, arguments: &Map<String, Value>) -> ToolOutput {
        self.stats.tool_calls += 1;
        let output = self.call(name, arguments).await;
        if output.error {
            self.stats.tool_errors += 1;
        }
        output
    }

    fn count_tool_error(&mut self) {
        self.stats.tool_errors += 1;
    }

    fn reward_turn(&mut self, value: f64) -> Result<(), PluginError> {
        let Some(turn) = self.turns.last() else {
            return Err(PluginError::failed(
                "episode",
                "reward_turn before any turn was generated",
            ));
        };
        Reward::check_value(value)
            .map_err(|e| PluginError::failed("episode", format!("reward_turn: {e}")))?;
        self.turn_rewards.push(TurnReward {
            end: turn.end,
            value,
        });
        Ok(())
    }

    async fn verify(&mut self, completion: &str) -> Result<Reward, PluginError> {
        let verified = self
            .runner
            .reward(self.sample_id, self.item, completion, &self.completion)
            .await?;
        Ok(verified.reward)
    }
}

impl EpisodeRun<'_> {
    /// The completion's length the budget ends at: the budget, after the prompt an episode
    /// wrote itself (the environment's tokens before its first sampled token).
    fn limit(&self) -> usize {
        self.lead().saturating_add(self.budget)
    }

    /// The prompt an episode wrote itself: the environment's tokens before the first sampled
    /// one (all so far, before its first turn); 0 for an episode the engine prompts.
    fn lead(&self) -> usize {
        if !self.own_prompt {
            return 0;
        }
        (0..self.completion.len())
            .find(|&i| self.completion.is_sampled(i))
            .unwrap_or(self.completion.len())
    }

    /// The tools the conversation is rendered with: the episode's own, or the run's.
    fn tool_schemas(&self) -> &[ToolSchema] {
        self.tools.as_deref().unwrap_or(self.runner.tool_schemas())
    }

    /// The run's sampling with `options`' changes, checked.
    fn turn_sampling(&self, options: &TurnOptions) -> Result<SamplingParams, PluginError> {
        if options.max_tokens == Some(0) {
            return Err(PluginError::failed(
                "episode",
                "generate_with: max_tokens must be at least 1",
            ));
        }
        if options.stop.iter().any(String::is_empty) {
            return Err(PluginError::failed(
                "episode",
                "generate_with: a stop text must not be empty",
            ));
        }
        let mut sampling = self.sampling.clone();
        if let Some(t) = options.temperature {
            sampling.temperature = t;
        }
        if let Some(p) = options.top_p {
            sampling.top_p = p;
        }
        // The generator draws from the run's seed, the sample's id and the position: a sample
        // split off and started again from the same tokens (another choice, a retried turn)
        // would draw the same turn again. Each sample of the episode has its stream, and a
        // client's seed is a stream of its own.
        sampling.seed = match options.seed {
            Some(seed) => mix_seed(mix_seed(self.sampling.seed, CLIENT_SEEDS), seed),
            None if self.segments.is_empty() => self.sampling.seed,
            None => mix_seed(self.sampling.seed, self.segments.len() as u64),
        };
        sampling
            .check()
            .map_err(|e| PluginError::failed("episode", format!("generate_with: {e}")))?;
        Ok(sampling)
    }

    /// The next turn, of at most `max_tokens` (counted from the turn's start, a replayed part
    /// included) and within the budget, ended where its text first holds one of `stop`: from
    /// the record on a replay, else sampled with `sampling`.
    async fn sample(
        &mut self,
        max_tokens: Option<usize>,
        sampling: &SamplingParams,
        stop: &[String],
    ) -> Result<Turn, PluginError> {
        let start = self.completion.len();
        let limit = self.limit();
        let cap = max_tokens.map_or(limit, |m| limit.min(start.saturating_add(m)));
        self.stats.turns += 1;
        let recorded = self.recorded_turn()?;
        if let Some((stop, end)) = recorded {
            self.take_recorded(stop);
            if let Some(end) = end {
                self.completion.finish_reason = end.finish_reason;
                self.turns.push(end);
                return self.turn(start);
            }
        }
        if self.tokens_left() == 0 {
            self.completion.finish_reason = FinishReason::Length;
            return self.turn(start);
        }
        let told = if stop.is_empty() {
            let (progress, j) = (self.progress, self.j);
            let mut told = false;
            sample_turn(
                self.runner,
                self.sampler,
                self.sample_id,
                &mut self.input,
                &mut self.completion,
                cap,
                sampling,
                |part, end| {
                    told |= end.is_some();
                    progress.extended(j, part, end);
                },
            )
            .await?;
            told
        } else {
            self.sample_until(start, cap, sampling, stop).await?
        };
        let end = TurnEnd {
            end: self.completion.len(),
            finish_reason: self.completion.finish_reason,
        };
        self.turns.push(end);
        if !told {
            self.progress.turn_ended(self.j, end);
        }
        self.turn(start)
    }

    /// The rest of the turn that started at `start`, up to `cap`, ended where its text first
    /// holds one of `stop`: sampled [`STOP_CHUNK`] tokens at a time, the text checked after
    /// each part, the tokens after the one that completes the stop text dropped (never shown,
    /// never trained). The turn's tokens are recorded for checkpoints once it has ended, with
    /// its end; whether there were any (else the end is still to be told).
    async fn sample_until(
        &mut self,
        start: usize,
        cap: usize,
        sampling: &SamplingParams,
        stop: &[String],
    ) -> Result<bool, PluginError> {
        let recorded = self.completion.len();
        loop {
            let step = cap.min(self.completion.len().saturating_add(STOP_CHUNK));
            sample_turn(
                self.runner,
                self.sampler,
                self.sample_id,
                &mut self.input,
                &mut self.completion,
                step,
                sampling,
                |_, _| {},
            )
            .await?;
            let ids = &self.completion.token_ids[start..];
            if let Some(keep) = stop_end(self.runner.tokenizer().as_ref(), ids, stop)? {
                let dropped = ids.len() - keep;
                let c = &mut self.completion;
                c.truncate(start + keep);
                c.finish_reason = FinishReason::Stop;
                self.input.truncate(self.input.len() - dropped);
                break;
            }
            let n = self.completion.len();
            // a stop token, the cap, or short of the part asked (the context is full)
            if self.completion.finish_reason == FinishReason::Stop || n >= cap || n < step {
                break;
            }
        }
        let c = &self.completion;
        if c.len() == recorded {
            return Ok(false);
        }
        let mut part = Completion::empty(c.finish_reason);
        for i in recorded..c.len() {
            part.push(c.token_ids[i], c.behaviour_logprobs[i], c.versions[i]);
        }
        let end = TurnEnd {
            end: c.len(),
            finish_reason: c.finish_reason,
        };
        self.progress.extended(self.j, &part, Some(end));
        Ok(true)
    }

    /// The sample as it stands is where a refused turn goes back to.
    fn settle(&mut self) {
        self.settled = Settled {
            len: self.completion.len(),
            conversation: self.conversation.clone(),
            conversation_lost: self.conversation_lost,
        };
    }

    /// A turn the generator refused as the caller's fault (an input past the model's
    /// context): the environment's tokens appended since the last turn are taken back, with
    /// their messages, so that the episode can go on as if they had never been sent. (Only
    /// the environment's: a turn refused after it sampled tokens stays as it is.)
    fn withdraw(&mut self) {
        let Settled {
            len,
            conversation,
            conversation_lost,
        } = &self.settled;
        let len = *len;
        if (len..self.completion.len()).any(|i| self.completion.is_sampled(i)) {
            return;
        }
        self.stats.turns = self.stats.turns.saturating_sub(1);
        let dropped = self.completion.len() - len;
        self.completion.truncate(len);
        self.input.truncate(self.input.len() - dropped);
        self.conversation = conversation.clone();
        self.conversation_lost = *conversation_lost;
        self.progress.withdrawn(self.j, len);
    }

    /// Append environment tokens, cut to the budget, checked against the record on a replay.
    fn push_environment(&mut self, token_ids: &[u32]) -> Result<usize, PluginError> {
        // (an episode's own prompt, before its first turn, is not cut)
        let room = if self.own_prompt && self.lead() == self.completion.len() {
            usize::MAX
        } else {
            self.tokens_left()
        };
        let ids = &token_ids[..token_ids.len().min(room)];
        let at = self.completion.len();
        let recorded = match &self.record {
            Some(record) => {
                let c = &record.completion;
                let n = c.len().saturating_sub(at).min(ids.len());
                if let Some(k) =
                    (0..n).find(|&k| c.is_sampled(at + k) || c.token_ids[at + k] != ids[k])
                {
                    let what = if c.is_sampled(at + k) {
                        "the episode appended text where the policy had sampled".to_owned()
                    } else {
                        format!(
                            "the environment wrote token {} where the record has {}",
                            ids[k],
                            c.token_ids[at + k]
                        )
                    };
                    return Err(diverged(at + k, &what));
                }
                n
            }
            None => 0,
        };
        self.completion.push_environment(ids);
        self.input.extend(ids);
        if recorded < ids.len() {
            let mut new = Completion::empty(self.completion.finish_reason);
            new.push_environment(&ids[recorded..]);
            self.progress.extended(self.j, &new, None);
        }
        Ok(ids.len())
    }

    /// The conversation is no longer known as messages.
    fn forget_conversation(&mut self) {
        if self.conversation.take().is_some() {
            self.conversation_lost = true;
        }
    }

    /// Compare the tokens so far with the chat template's rendering of the conversation:
    /// before a turn (`generation`), equal to the rendering with the generation prompt; at
    /// the end, or once the budget is spent, the start of the rendering (which goes on with
    /// the template's markup after the last turn, or what the budget cut). Keeps the worst
    /// comparison in the episode's stats.
    fn compare_with_template(&mut self, generation: bool) {
        let exact = generation && self.tokens_left() > 0;
        let Some(conversation) = &self.conversation else {
            return;
        };
        let tokenizer = self.runner.tokenizer();
        let rendered = tokenizer.render_chat(conversation, self.tool_schemas(), generation);
        let (Ok(rendered), Ok(text)) = (rendered, tokenizer.decode_verbatim(&self.input)) else {
            self.forget_conversation();
            return;
        };
        let found = if exact && text == rendered {
            match tokenizer.encode(&rendered) {
                Ok(ids) if ids == self.input => Retokenization::Agrees,
                _ => Retokenization::Drift,
            }
        } else if !exact && rendered.starts_with(&text) {
            Retokenization::Agrees
        } else {
            Retokenization::Mismatch
        };
        self.stats.retokenization = self.stats.retokenization.max(found);
    }
}

/// The stream of the seeds clients give ([`TurnOptions::seed`]), apart from the samples'.
const CLIENT_SEEDS: u64 = 0x005E_EDC1_1E47;

/// Tokens a turn with stop texts is sampled in at a time, between checks of its text.
const STOP_CHUNK: usize = 16;

/// How many of `ids` (a turn so far) to keep when its text holds one of `stop`: the fewest
/// whose text holds the stop text that comes first. `None` when it holds none.
fn stop_end(
    tokenizer: &dyn Tokenizer,
    ids: &[u32],
    stop: &[String],
) -> Result<Option<usize>, PluginError> {
    let text = tokenizer.decode(ids)?;
    let Some((_, first)) = stop
        .iter()
        .filter_map(|s| text.find(s.as_str()).map(|at| (at, s)))
        .min_by_key(|(at, _)| *at)
    else {
        return Ok(None);
    };
    for k in 1..=ids.len() {
        if tokenizer.decode(&ids[..k])?.contains(first.as_str()) {
            return Ok(Some(k));
        }
    }
    Ok(Some(ids.len()))
}

/// The template's text for messages appended to a conversation: `rendered` (the whole
/// conversation with them, as the template writes it) after `so_far` (what the tokens so far
/// spell). Where the template writes the earlier turns as they were generated, `so_far`
/// starts `rendered` and the rest is the new messages' markup. Where it writes them otherwise
/// (Qwen3's drops earlier `<think>` blocks), the tokens stay as they were and the markup is
/// taken from where the longest end of `so_far` after the two part ways recurs in
/// `rendered` (the last turn's closing text and stop token).
fn markup_after<'r>(so_far: &str, rendered: &'r str) -> &'r str {
    if let Some(rest) = rendered.strip_prefix(so_far) {
        return rest;
    }
    let apart = so_far
        .char_indices()
        .zip(rendered.chars())
        .find(|((_, a), b)| a != b)
        .map_or(so_far.len().min(rendered.len()), |((i, _), _)| i);
    let (tail, rest) = (&so_far[apart..], &rendered[apart..]);
    // the longest end of `tail` that recurs in `rest` (the ends of a recurring end recur
    // too, so the starts that work are all those after the first that does)
    let starts: Vec<usize> = tail.char_indices().map(|(i, _)| i).collect();
    let first_recurring = starts.partition_point(|&i| !rest.contains(&tail[i..]));
    match starts.get(first_recurring) {
        Some(&i) => {
            let at = rest.find(&tail[i..]).expect("found above") + tail.len() - i;
            &rest[at..]
        }
        None => rest,
    }
}

impl EpisodeRun<'_> {
    /// The turn from `start` to the end of the completion.
    fn turn(&self, start: usize) -> Result<Turn, PluginError> {
        let token_ids = self.completion.token_ids[start..].to_vec();
        let text = self.runner.tokenizer().decode(&token_ids)?;
        Ok(Turn {
            token_ids,
            text,
            finish_reason: self.completion.finish_reason,
        })
    }

    async fn call(&mut self, name: &str, arguments: &Map<String, Value>) -> ToolOutput {
        let Some(tool) = self.runner.tool(name) else {
            let known = self.runner.tool_names();
            return ToolOutput::error(if known.is_empty() {
                format!("there is no tool {name:?}: no tools are available")
            } else {
                format!(
                    "there is no tool {name:?}; the tools are: {}",
                    known.join(", ")
                )
            });
        };
        if !self.sessions.contains_key(name) {
            let seed = mix_seed(self.sampling.seed, self.sample_id);
            match tool.open(seed).await {
                Ok(session) => {
                    self.sessions.insert(name.to_owned(), session);
                }
                Err(e) => {
                    tracing::warn!(target: "areal::episode", tool = name, error = %crate::error::chain(&e), "a tool could not start");
                    return ToolOutput::error(format!("the tool {name} could not start: {e}"));
                }
            }
        }
        let session = self.sessions.get_mut(name).expect("opened above");
        match session.call(arguments).await {
            Ok(output) => output,
            Err(e) => {
                // the host's own failure: the session is gone; a later call opens another
                self.sessions.remove(name);
                tracing::warn!(target: "areal::episode", tool = name, error = %crate::error::chain(&e), "a tool failed");
                ToolOutput::error(format!("the tool {name} failed: {e}"))
            }
        }
    }
}

/// Rounds of turns (see the module's documentation): samples at work, and the turns waiting.
#[derive(Default)]
pub(crate) struct Rounds {
    state: Mutex<RoundsState>,
    idle: Notify,
}

#[derive(Default)]
struct RoundsState {
    /// Samples at work (neither waiting for a turn nor ended).
    busy: BTreeSet<u64>,
    /// Turns waiting, by sample id.
    parked: BTreeMap<u64, Parked>,
}

/// A turn waiting for its round.
pub(crate) struct Parked {
    /// What it asks of the generator.
    pub(crate) ask: Ask,
    reply: oneshot::Sender<Result<Completion, PluginError>>,
}

/// A sample at work in [`Rounds`]; dropped when its task ends (or is aborted).
pub(crate) struct Busy {
    rounds: Arc<Rounds>,
    sample_id: u64,
}

impl Drop for Busy {
    fn drop(&mut self) {
        {
            let mut state = self.rounds.lock();
            state.busy.remove(&self.sample_id);
            state.parked.remove(&self.sample_id);
        }
        self.rounds.idle.notify_waiters();
    }
}

impl Rounds {
    fn lock(&self) -> std::sync::MutexGuard<'_, RoundsState> {
        self.state.lock().expect("rounds lock poisoned")
    }

    /// Sample `sample_id` is at work until it waits for a turn or the guard is dropped: make
    /// it before the sample's task starts, and move it in.
    pub(crate) fn enter(self: &Arc<Self>, sample_id: u64) -> Busy {
        self.lock().busy.insert(sample_id);
        Busy {
            rounds: self.clone(),
            sample_id,
        }
    }

    /// Samples `ids` are gone (their tasks aborted): they are neither at work nor waiting.
    pub(crate) fn forget(&self, ids: &[u64]) {
        {
            let mut state = self.lock();
            for id in ids {
                state.busy.remove(id);
                state.parked.remove(id);
            }
        }
        self.idle.notify_waiters();
    }

    /// Wait until no sample is at work: every one waits for a turn or has ended.
    pub(crate) async fn settled(&self) {
        loop {
            let idle = self.idle.notified();
            if self.lock().busy.is_empty() {
                return;
            }
            idle.await;
        }
    }

    /// The turns waiting, in sample order; each must be [`deliver`](Self::deliver)ed.
    pub(crate) fn take_parked(&self) -> Vec<Parked> {
        std::mem::take(&mut self.lock().parked)
            .into_values()
            .collect()
    }

    /// Answer a waiting turn: its sample is at work again.
    pub(crate) fn deliver(&self, parked: Parked, answer: Result<Completion, PluginError>) {
        let id = parked.ask.sample_id;
        self.lock().busy.insert(id);
        if parked.reply.send(answer).is_err() {
            // its task is gone
            self.lock().busy.remove(&id);
            self.idle.notify_waiters();
        }
    }

    async fn park(&self, ask: Ask) -> Result<Completion, PluginError> {
        let (reply, answer) = oneshot::channel();
        {
            let mut state = self.lock();
            state.busy.remove(&ask.sample_id);
            state.parked.insert(ask.sample_id, Parked { ask, reply });
        }
        self.idle.notify_waiters();
        answer.await.unwrap_or_else(|_| {
            Err(PluginError::failed(
                "rollout",
                "the round this turn waited for was abandoned",
            ))
        })
    }

    /// One round: the turns waiting, generated together in one batch (on a task of their own,
    /// so that a panicking generator fails these turns and not the caller), each answered.
    /// Returns how many there were.
    pub(crate) async fn run_round(&self, runner: &Arc<GroupRunner>) -> usize {
        let parked = self.take_parked();
        let asks: Vec<Ask> = parked.iter().map(|p| p.ask.clone()).collect();
        let n = asks.len();
        if n == 0 {
            return 0;
        }
        let owned = runner.clone();
        let parts = match tokio::spawn(async move { owned.parts(&asks).await }).await {
            Ok(parts) => parts,
            Err(e) => {
                let why = format!("the generator's task failed: {e}");
                (0..n)
                    .map(|_| Err(PluginError::failed("rollout", why.clone())))
                    .collect()
            }
        };
        for (parked, part) in parked.into_iter().zip(parts) {
            self.deliver(parked, part);
        }
        n
    }
}
