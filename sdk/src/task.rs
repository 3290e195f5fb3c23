//! Tasks (prompt sources) and tokenizers.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::PluginError;
use crate::tool::ToolSchema;

/// Which part of a task's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Prompts to train on.
    Train,
    /// Held-out prompts, disjoint from `Train`, for evaluation.
    Eval,
    /// Held-out prompts, disjoint from `Train` and `Eval`, for model selection and early
    /// stopping (so that `Eval` stays untouched until it is reported).
    Validation,
}

impl Split {
    /// `"train"` or `"eval"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Eval => "eval",
            Split::Validation => "validation",
        }
    }
}

/// One prompt with what its verifier needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskItem {
    /// Stable id, unique within its split.
    pub id: String,
    /// The prompt text given to the model.
    pub prompt: String,
    /// What the verifier checks against (an answer, unit tests...); opaque to the engine.
    pub reference: Value,
}

/// One message of a conversation, as chat templates read them: OpenAI's message, whose
/// optional fields a template sees only when they are set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The text.
    pub content: String,
    /// The calls an assistant message made, in OpenAI's form (`[{"id", "type": "function",
    /// "function": {"name", "arguments"}}]`, `arguments` an object or its JSON text), for
    /// templates that write them (Qwen's, Llama 3's). None by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<Value>,
    /// The call a `tool` message answers (OpenAI's `tool_call_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The name of the tool a `tool` message comes from, where a template writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    /// With the tool calls `calls` (OpenAI's form).
    pub fn with_tool_calls(mut self, calls: Vec<Value>) -> Self {
        self.tool_calls = calls;
        self
    }

    /// Answering the call `id`.
    pub fn with_tool_call_id(mut self, id: &str) -> Self {
        self.tool_call_id = Some(id.into());
        self
    }

    /// From the tool `name`.
    pub fn with_name(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }
}

/// A source of prompts: a dataset file or a procedural generator.
pub trait Task: Send + Sync + 'static {
    /// Registered name.
    fn name(&self) -> &str;

    /// Number of items in `split`, or `None` for an unbounded procedural split. The eval split
    /// must be finite.
    fn len(&self, split: Split) -> Option<usize>;

    /// The item at `index` of `split`: the same index always gives the same item.
    fn item(&self, split: Split, index: u64) -> Result<TaskItem, PluginError>;

    /// A demonstration (a whole response) for `item`, for supervised warm-up; `None` when the
    /// task has none (the default).
    fn demonstration(&self, item: &TaskItem) -> Result<Option<String>, PluginError> {
        let _ = item;
        Ok(None)
    }

    /// A demonstration of an episode of several turns for `item`: the policy's turns and the
    /// environment's text between them, in order, written as the run's episode writes them.
    /// The warm-up trains on the policy's turns (each ended with the stop token) and only reads
    /// the rest. By default the one-turn [`demonstration`](Self::demonstration).
    fn demonstration_turns(&self, item: &TaskItem) -> Result<Option<Vec<DemoTurn>>, PluginError> {
        Ok(self.demonstration(item)?.map(|d| vec![DemoTurn::Policy(d)]))
    }
}

/// One part of a demonstration of an episode ([`Task::demonstration_turns`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DemoTurn {
    /// A turn of the policy: trained on, ended with the stop token.
    Policy(String),
    /// The environment's text (a tool's answer, a template's markers): read, not trained on.
    Environment(String),
}

/// Text to token ids and back; provided by the model so prompts and outputs agree with it.
pub trait Tokenizer: Send + Sync + 'static {
    /// Encode a prompt.
    fn encode(&self, text: &str) -> Result<Vec<u32>, PluginError>;

    /// Decode generated ids (stop tokens may be included and are dropped from the text).
    fn decode(&self, ids: &[u32]) -> Result<String, PluginError>;

    /// Tokens that end a generation.
    fn stop_token_ids(&self) -> Vec<u32>;

    /// Size of the vocabulary.
    fn vocab_size(&self) -> usize;

    /// The text of `ids` with every token spelled, special ones included (`<|im_end|>`...):
    /// what a chat template writes. By default [`decode`](Self::decode).
    fn decode_verbatim(&self, ids: &[u32]) -> Result<String, PluginError> {
        self.decode(ids)
    }

    /// `messages` in the model's chat format (its chat template, as Hugging Face's
    /// `apply_chat_template` renders it), told of `tools`, ending with the opening of the
    /// assistant's turn when `add_generation_prompt`. By default the model has none, and this
    /// is an error.
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSchema],
        add_generation_prompt: bool,
    ) -> Result<String, PluginError> {
        let _ = (messages, tools, add_generation_prompt);
        Err(PluginError::failed(
            "tokenizer",
            "the model has no chat template (a Hugging Face checkpoint keeps it in \
             tokenizer_config.json or chat_template.jinja)",
        ))
    }

    /// `messages` in the model's chat format, ending with the opening of the assistant's turn:
    /// the text a chat model completes ([`render_chat`](Self::render_chat) without tools).
    fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, PluginError> {
        self.render_chat(messages, &[], true)
    }
}
