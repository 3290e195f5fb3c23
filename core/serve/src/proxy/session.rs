//! One session's turns in its episode: the client's messages made into the episode's one
//! token sequence, exactly.
//!
//! A request whose messages extend what the client has seen so far (the last request's
//! messages and the answer to it, compared as messages) and whose tools are the same adds only
//! the new messages: [`EpisodeContext::append_messages`] writes them in the chat template's
//! markup after the tokens so far, and the policy's earlier tokens stay as sampled. A request
//! that does not (the client rewrote the history: Qwen3's template drops earlier `<think>`
//! blocks, an agent retried a turn, changed its tools) cannot continue that sequence: the
//! sample so far is split off ([`EpisodeContext::split`]) and the request starts a new one.

use areal_sdk::tool_calls::ToolCallFormat;
use areal_sdk::{
    ChatMessage, EpisodeContext, FinishReason, PluginError, Reward, ToolSchema, TurnOptions,
    mix_seed,
};

use super::hub::Refusal;
use super::openai::{Answer, Asked, Choice, assistant_message, finish_reason};

/// What a session has done, for the episode's reward and the run's metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Tally {
    /// Turns answered.
    pub(crate) turns: usize,
    /// Times a request did not extend the history and the sample was split.
    pub(crate) splits: usize,
}

/// The state of one session over its episode's context.
pub(crate) struct Session {
    format: ToolCallFormat,
    max_turns: usize,
    /// The messages the client has seen: the last request's and the answer to it.
    seen: Option<Vec<ChatMessage>>,
    /// The tools of the requests of the current sample.
    tools: Vec<ToolSchema>,
    /// The interactions of the current sample, in order (their ids).
    interactions: Vec<String>,
    /// Those of each sample split off, in order.
    parts: Vec<Vec<String>>,
    /// The reward set on the last interaction, not yet given to its turn.
    pending: Option<f64>,
    /// The last answer's content (what `without_reward = "grade"` grades).
    last_content: String,
    session_id: String,
    pub(crate) tally: Tally,
    /// Why the session cannot go on (the policy failed to generate after the request's
    /// messages were appended): the episode ends with it.
    pub(crate) broken: Option<PluginError>,
}

impl Session {
    pub(crate) fn new(session_id: &str, format: ToolCallFormat, max_turns: usize) -> Self {
        Self {
            format,
            max_turns,
            seen: None,
            tools: Vec::new(),
            interactions: Vec::new(),
            parts: Vec::new(),
            pending: None,
            last_content: String::new(),
            session_id: session_id.to_owned(),
            tally: Tally::default(),
            broken: None,
        }
    }

    /// Answer one request with a turn of the policy (`n` turns: each choice but the one the
    /// session goes on with is a sample of its own, from the same messages).
    pub(crate) async fn chat(
        &mut self,
        ctx: &mut dyn EpisodeContext,
        asked: Asked,
    ) -> Result<Answer, Refusal> {
        if self.tally.turns + asked.n > self.max_turns {
            return Err(Refusal::new(
                429,
                format!(
                    "this session has had {} of its {} turns (the episode's max_turns), and \
                     this request asks for {}",
                    self.tally.turns, self.max_turns, asked.n
                ),
            ));
        }
        let extends = self.seen.as_ref().filter(|seen| {
            asked.tools == self.tools
                && asked.messages.len() > seen.len()
                && asked.messages[..seen.len()] == seen[..]
        });
        let mut new = match extends {
            Some(seen) => asked.messages[seen.len()..].to_vec(),
            None => {
                if self.seen.is_some() {
                    self.split(ctx)?;
                }
                self.start(ctx, &asked);
                asked.messages.clone()
            }
        };
        let id = format!("chatcmpl-{}-{}", self.session_id, self.tally.turns);
        let mut prompt_tokens = 0;
        // the choices in the order sampled: the last stays in the session's sequence
        let mut sampled = Vec::with_capacity(asked.n);
        for k in 0..asked.n {
            if k > 0 {
                // another choice after the same messages: a sample of its own
                self.split(ctx)?;
                self.start(ctx, &asked);
                new = asked.messages.clone();
            }
            self.flush_reward(ctx)?;
            ctx.append_messages(&new).map_err(|e| {
                Refusal::new(
                    400,
                    format!("the messages cannot be rendered with the model's chat template: {e}"),
                )
            })?;
            if k == 0 {
                prompt_tokens = ctx.prompt_ids().len() + ctx.completion().len();
            }
            sampled.push(self.turn(ctx, &asked, k, &format!("{id}_{k}")).await?);
            self.tally.turns += 1;
            self.interactions.push(id.clone());
        }
        // the choice the session goes on with is the first the client reads
        let choices: Vec<Choice> = sampled.into_iter().rev().collect();
        let mut seen = asked.messages;
        seen.push(choices[0].message.clone());
        self.seen = Some(seen);
        self.last_content = choices[0].message.content.clone();
        Ok(Answer {
            id,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: asked.model,
            choices,
            prompt_tokens,
        })
    }

    /// End the current sample: what follows starts a new one, from all its messages (a
    /// request refused after this renders them all again).
    fn split(&mut self, ctx: &mut dyn EpisodeContext) -> Result<(), Refusal> {
        self.flush_reward(ctx)?;
        ctx.split().map_err(internal)?;
        self.tally.splits += 1;
        self.parts.push(std::mem::take(&mut self.interactions));
        self.seen = None;
        Ok(())
    }

    /// A new sample begins with `asked`'s messages and tools.
    fn start(&mut self, ctx: &mut dyn EpisodeContext, asked: &Asked) {
        ctx.set_tools(asked.tools.clone());
        self.tools = asked.tools.clone();
    }

    /// One turn of the policy after the messages appended, as choice `k` whose calls
    /// `call_ids` names.
    async fn turn(
        &mut self,
        ctx: &mut dyn EpisodeContext,
        asked: &Asked,
        k: usize,
        call_ids: &str,
    ) -> Result<Choice, Refusal> {
        let mut options = TurnOptions::default();
        options.max_tokens = asked.max_tokens;
        options.temperature = asked.temperature;
        options.top_p = asked.top_p;
        options.stop = asked.stop.clone();
        // the client's seed: each choice its own draw, the same again for the same seed
        options.seed = asked.seed.map(|seed| mix_seed(seed, k as u64));
        let before = ctx.completion().len();
        let input = ctx.prompt_ids().len() + before;
        let turn = match ctx.generate_with(&options).await {
            Ok(turn) => turn,
            // the request's own fault (its messages past the model's context), and the
            // context took its messages back: the session goes on as before the request (what
            // the session has seen is as it was; a split it made leaves it at a new sample's
            // start)
            Err(e) if e.is_invalid_request() && ctx.completion().len() < before => {
                return Err(refused_turn(&e, input));
            }
            // (otherwise a failure is the policy's side, and the session's tokens now hold
            // messages no turn answers: it ends, as a failed generation ends any episode)
            Err(e) => {
                let refusal = Refusal::new(
                    503,
                    format!("the policy could not generate this turn, and the session ends: {e}"),
                );
                self.broken = Some(e);
                return Err(refusal);
            }
        };
        // a turn ended by a stop text is read up to it (OpenAI leaves the stop text out)
        let text = asked
            .stop
            .iter()
            .filter_map(|s| turn.text.find(s.as_str()))
            .min()
            .map_or(turn.text.as_str(), |at| &turn.text[..at]);
        let message = assistant_message(text, self.format, &asked.callable, call_ids);
        let logprobs = asked.logprobs.then(|| {
            let c = ctx.completion();
            let tokenizer = ctx.tokenizer();
            (before..c.len())
                .map(|i| {
                    let text = tokenizer
                        .decode_verbatim(&c.token_ids[i..=i])
                        .unwrap_or_default();
                    (text, c.behaviour_logprobs[i])
                })
                .collect()
        });
        Ok(Choice {
            finish_reason: finish_reason(turn.finish_reason == FinishReason::Stop, &message),
            message,
            completion_tokens: turn.token_ids.len(),
            logprobs,
        })
    }

    /// `/rl/set_reward`: `reward` for interaction `id` (the last when `None`).
    pub(crate) fn set_reward(&mut self, reward: f64, id: Option<&str>) -> Result<(), Refusal> {
        Reward::check_value(reward).map_err(|e| Refusal::new(400, e.to_string()).on("reward"))?;
        let Some(last) = self.interactions.last() else {
            return Err(Refusal::new(
                400,
                "set_reward before any completion of this session (or of its current sample)",
            ));
        };
        match id {
            None => {}
            Some(id) if id == last => {}
            // (an id of an earlier interaction is stale, not unknown)
            Some(id)
                if self
                    .parts
                    .iter()
                    .flatten()
                    .chain(&self.interactions)
                    .any(|e| e == id) =>
            {
                return Err(Refusal::new(
                    409,
                    format!(
                        "{id} is not the session's last interaction ({last}): a reward is set \
                         on the last one, before the next request"
                    ),
                )
                .on("interaction_id"));
            }
            Some(id) => {
                return Err(
                    Refusal::new(404, format!("this session has no interaction {id}"))
                        .on("interaction_id"),
                );
            }
        }
        self.pending = Some(reward);
        Ok(())
    }

    /// A reward set on the last interaction becomes its turn's reward, once another request
    /// comes.
    fn flush_reward(&mut self, ctx: &mut dyn EpisodeContext) -> Result<(), Refusal> {
        if let Some(value) = self.pending.take() {
            ctx.reward_turn(value).map_err(internal)?;
        }
        Ok(())
    }

    /// The reward set on the session's last interaction, if any.
    pub(crate) fn final_reward(&self) -> Option<f64> {
        self.pending
    }

    /// The last answer's content.
    pub(crate) fn last_content(&self) -> &str {
        &self.last_content
    }

    /// The session's id.
    pub(crate) fn id(&self) -> &str {
        &self.session_id
    }

    /// The interactions (their ids) of each of the episode's samples, in order: those split
    /// off, then the current one.
    pub(crate) fn interactions(&self) -> Vec<Vec<String>> {
        let mut out = self.parts.clone();
        out.push(self.interactions.clone());
        out
    }
}

/// A turn the generator refused as the request's fault, as OpenAI answers it: 400, and for
/// messages past the model's context its `context_length_exceeded`, naming both lengths.
fn refused_turn(e: &PluginError, input: usize) -> Refusal {
    match e.exceeded_context() {
        Some((_, context)) => Refusal {
            code: Some("context_length_exceeded"),
            ..Refusal::new(
                400,
                format!(
                    "This model's maximum context length is {context} tokens. However, your \
                     messages resulted in {input} tokens. Please reduce the length of the \
                     messages."
                ),
            )
            .on("messages")
        },
        None => Refusal::new(400, format!("the policy refused the request: {e}")).on("messages"),
    }
}

fn internal(e: PluginError) -> Refusal {
    Refusal::new(500, e.to_string())
}
