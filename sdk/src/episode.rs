//! Episodes: what the policy does for one task item, from one answer to a conversation of
//! turns with tools in between.
//!
//! An [`Episode`] drives an [`EpisodeContext`] the engine owns. The context holds the one token
//! sequence the episode trains on: the prompt, then each turn the policy samples
//! ([`EpisodeContext::generate`], tokens kept with their behaviour logprobs and versions), and
//! what the environment says in between ([`EpisodeContext::append`]: tool results, a user's
//! reply, a chat template's turn markers), tokenized alone and never trained on. Each turn's
//! prompt is exactly the tokens before it: nothing is decoded and tokenized again, so what is
//! trained is what was sampled.
//!
//! The single-turn path is the one-turn episode ([`SingleTurn`]): generate once, verify the
//! text.
//!
//! ```
//! use areal_sdk::{Episode, EpisodeContext, PluginError, Reward};
//!
//! /// Answer, hear "check it", answer again; the second answer is graded.
//! struct TwoTries;
//!
//! #[areal_sdk::async_trait]
//! impl Episode for TwoTries {
//!     fn name(&self) -> &str {
//!         "two-tries"
//!     }
//!
//!     async fn run(&self, ctx: &mut dyn EpisodeContext) -> Result<Reward, PluginError> {
//!         ctx.generate().await?;
//!         ctx.append("\ncheck it: ")?;
//!         let second = ctx.generate().await?;
//!         ctx.verify(&second.text).await
//!     }
//! }
//! ```

use serde_json::{Map, Value};

use crate::error::PluginError;
use crate::reward::Reward;
use crate::task::{ChatMessage, TaskItem, Tokenizer};
use crate::tool::{ToolOutput, ToolSchema};
use crate::trajectory::{Completion, FinishReason};

/// One turn the policy generated.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// Its tokens, as sampled (stop token included when it stopped on one).
    pub token_ids: Vec<u32>,
    /// Its text (stop tokens dropped).
    pub text: String,
    /// Why it ended: `stop`, or `length` when the episode's token budget ran out (then
    /// [`EpisodeContext::tokens_left`] is 0 and generating again gives an empty turn).
    pub finish_reason: FinishReason,
}

/// How one turn is sampled, where it differs from the run's settings
/// ([`EpisodeContext::generate_with`]).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct TurnOptions {
    /// The most tokens the turn may have (within the episode's budget). At least 1.
    pub max_tokens: Option<usize>,
    /// Softmax temperature of this turn (0: greedy).
    pub temperature: Option<f32>,
    /// Nucleus sampling of this turn, in (0, 1].
    pub top_p: Option<f32>,
    /// Texts that end the turn where it first writes one (OpenAI's `stop`): the turn keeps
    /// its tokens up to the one that completes it (its text then holds the stop text; what
    /// was sampled after it is dropped, never shown nor trained) and ends for `stop`. Not
    /// empty strings.
    pub stop: Vec<String>,
    /// The turn's own random stream (OpenAI's `seed`): the same seed after the same tokens of
    /// one sample draws the same turn. Without it, each sample of an episode draws its own.
    pub seed: Option<u64>,
}

impl TurnOptions {
    /// At most `max_tokens` tokens.
    pub fn with_max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// At temperature `temperature`.
    pub fn with_temperature(mut self, temperature: f32) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// With nucleus `top_p`.
    pub fn with_top_p(mut self, top_p: f32) -> Self {
        self.top_p = Some(top_p);
        self
    }

    /// Ending where the turn first writes one of `stop`.
    pub fn with_stop(mut self, stop: Vec<String>) -> Self {
        self.stop = stop;
        self
    }

    /// Drawn from the random stream `seed`.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
}

/// What an episode sees of the engine: the item, its conversation as tokens, the policy, the
/// tools and the verifier.
#[async_trait::async_trait]
pub trait EpisodeContext: Send {
    /// The task item the episode is for.
    fn item(&self) -> &TaskItem;

    /// The prompt's tokens (rendered by the engine as `[prompt]` says).
    fn prompt_ids(&self) -> &[u32];

    /// Everything after the prompt so far: sampled tokens and environment tokens (those of
    /// version [`PROMPT_VERSION`](crate::PROMPT_VERSION)).
    fn completion(&self) -> &Completion;

    /// Tokens the episode may still add (sampled or appended) before its budget,
    /// `rollout.max_new_tokens`, is spent.
    fn tokens_left(&self) -> usize;

    /// The model's tokenizer.
    fn tokenizer(&self) -> &dyn Tokenizer;

    /// The policy's next turn after everything so far, up to the budget left. A weight update
    /// in the middle interrupts it and it goes on under the new weights, each token keeping
    /// the version that sampled it.
    async fn generate(&mut self) -> Result<Turn, PluginError> {
        self.generate_with(&TurnOptions::default()).await
    }

    /// [`generate`](Self::generate) with `options` for this turn: at most `max_tokens` of it
    /// (the turn then ends for `length`, and the episode may go on), another temperature or
    /// `top_p` than the run's, or stop texts. An error for options the generator cannot take.
    /// A turn the generator refuses as the caller's fault ([`PluginError::InvalidRequest`]:
    /// an input past the model's context) takes back what was appended since the last turn,
    /// messages included, so that the episode can go on as if it had not been sent.
    async fn generate_with(&mut self, options: &TurnOptions) -> Result<Turn, PluginError>;

    /// Append `text`, tokenized alone, as environment tokens (read by the policy, never
    /// trained on). What does not fit in the budget is cut; returns the tokens appended.
    fn append(&mut self, text: &str) -> Result<usize, PluginError>;

    /// Append token ids as environment tokens (a template's special tokens, which text would
    /// not encode to); cut to the budget like [`append`](Self::append).
    fn append_ids(&mut self, token_ids: &[u32]) -> Result<usize, PluginError>;

    /// Append `messages` (tool answers, a user's reply) as the model's chat template writes
    /// them after the conversation so far, tokenized alone as environment tokens; cut to the
    /// budget like [`append`](Self::append). The template's markup between the last turn and
    /// the next (`<|im_end|>`, `<|im_start|>user`, `<tool_response>`...) comes with them.
    /// Only where the conversation is known ([`conversation`](Self::conversation)); an error
    /// otherwise.
    fn append_messages(&mut self, messages: &[ChatMessage]) -> Result<usize, PluginError> {
        let _ = messages;
        Err(PluginError::failed(
            "episode",
            "this episode's conversation is not known as chat messages",
        ))
    }

    /// The conversation so far as chat messages: the prompt's, then each turn as the
    /// assistant's message and what [`append_messages`](Self::append_messages) added, when the
    /// prompt is in the model's chat format (`prompt.format = "chat"`) and nothing was
    /// appended as bare text. `None` otherwise.
    fn conversation(&self) -> Option<&[ChatMessage]> {
        None
    }

    /// The tools this run gives episodes (`[[tools]]`), as the model is told of them.
    fn tools(&self) -> Vec<ToolSchema>;

    /// Tell the model of `tools` in place of the run's `[[tools]]` from here on: the chat
    /// template renders the conversation with them ([`append_messages`](Self::append_messages)
    /// and the check of every episode). For an episode whose tools are not the run's (an agent
    /// program's own, declared in its requests); [`call_tool`](Self::call_tool) still calls
    /// the run's.
    fn set_tools(&mut self, tools: Vec<ToolSchema>) {
        let _ = tools;
    }

    /// End this episode's sample here and go on in a new one, empty after the prompt (what a
    /// client that rewrote the history its next turn reads needs: no token sequence holds
    /// both). The tokens so far become a sample of their own in the group, trained with the
    /// reward [`Episode::run`] returns and the turn rewards given while it lasted; the
    /// conversation starts again from the prompt's messages. An error where the engine
    /// cannot split (the default), and before any turn.
    fn split(&mut self) -> Result<(), PluginError> {
        Err(PluginError::failed(
            "episode",
            "this engine cannot split an episode into samples",
        ))
    }

    /// Call tool `name` with `arguments`, in this episode's session of it (opened at the
    /// first call; state persists across the episode's calls and never leaks to another
    /// episode). An unknown tool, a call that fails, or a tool that breaks comes back as
    /// [`ToolOutput::error`] for the model to read: a bad call costs a turn, not the run.
    async fn call_tool(&mut self, name: &str, arguments: &Map<String, Value>) -> ToolOutput;

    /// Count a call the episode could not make (a malformed one) with the tool errors of the
    /// step's metrics; [`call_tool`](Self::call_tool) counts its own.
    fn count_tool_error(&mut self);

    /// Give the turn just generated a reward of `value` (a step of the task done, a tool call
    /// that ran), at its last token, beside the reward [`Episode::run`] returns at the end:
    /// the sample's return is their sum ([`Reward::total`]), and algorithms that credit
    /// tokens by what follows them (returns-to-go, GAE) see each turn's reward where it was
    /// earned. An error before any turn, or for a value the engine does not train on
    /// ([`Reward::check_value`]).
    fn reward_turn(&mut self, value: f64) -> Result<(), PluginError>;

    /// The task's reward for `completion` (the text the verifier grades: the whole
    /// conversation's text, or only the final answer, as the episode decides).
    async fn verify(&mut self, completion: &str) -> Result<Reward, PluginError>;
}

/// What the engine must know of an episode before it runs one ([`Episode::traits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EpisodeTraits {
    /// The episode writes the whole conversation itself (an agent program sends its own
    /// messages): the engine renders no prompt, the sample starts empty, and the conversation
    /// is known as chat messages from the start (none yet), so that
    /// [`append_messages`](EpisodeContext::append_messages) writes the first ones. The
    /// model needs a chat template.
    pub own_prompt: bool,
    /// The episode cannot run again the same way (it drives an outside program): a resumed
    /// run starts its unfinished samples over instead of replaying them.
    pub not_replayable: bool,
}

impl EpisodeTraits {
    /// An episode that drives an outside program writing its own conversation.
    pub const OUTSIDE_PROGRAM: Self = Self {
        own_prompt: true,
        not_replayable: true,
    };

    /// With [`own_prompt`](Self::own_prompt).
    pub fn with_own_prompt(mut self) -> Self {
        self.own_prompt = true;
        self
    }

    /// With [`not_replayable`](Self::not_replayable).
    pub fn without_replay(mut self) -> Self {
        self.not_replayable = true;
        self
    }
}

/// A workflow for one task item: several generations and environment steps, one reward.
#[async_trait::async_trait]
pub trait Episode: Send + Sync + 'static {
    /// Registered name.
    fn name(&self) -> &str;

    /// What the engine must know of it before it runs (by default: the engine writes the
    /// prompt, and the episode can be replayed).
    fn traits(&self) -> EpisodeTraits {
        EpisodeTraits::default()
    }

    /// Run the episode in `ctx` and return its reward. The engine may run it again from the
    /// start on a resumed run, answering each [`generate`](EpisodeContext::generate) with the
    /// turn recorded before and checking that what is appended is what was appended then: an
    /// episode must do the same for the same turns (tools that are deterministic, randomness
    /// seeded from the item).
    async fn run(&self, ctx: &mut dyn EpisodeContext) -> Result<Reward, PluginError>;
}

/// The name of the one-turn episode (`[episode] kind = "single-turn"`, the default).
pub const SINGLE_TURN: &str = "single-turn";

/// The one-turn episode: one generation after the prompt, its text verified.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleTurn;

#[async_trait::async_trait]
impl Episode for SingleTurn {
    fn name(&self) -> &str {
        SINGLE_TURN
    }

    async fn run(&self, ctx: &mut dyn EpisodeContext) -> Result<Reward, PluginError> {
        let turn = ctx.generate().await?;
        ctx.verify(&turn.text).await
    }
}
