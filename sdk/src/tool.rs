//! Tools an episode's policy calls: what the model is told about one (its schema, which the
//! chat template renders into the prompt), and the state one episode keeps with it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::PluginError;

/// What a model is told about a tool, as chat templates take it in `tools` (OpenAI's function
/// form, which Qwen's, Hermes' and Llama 3's templates read).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    /// The name a call gives.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments (an object).
    pub parameters: Value,
}

impl ToolSchema {
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`: one entry of
    /// a chat template's `tools`.
    pub fn to_function(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }
}

/// What a call gave back: the text the model reads next, and whether it is an error (a
/// traceback, a limit, a malformed call), which episodes count per step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The text appended to the conversation as the tool's answer.
    pub text: String,
    /// Whether the call failed (the text says how).
    pub error: bool,
}

impl ToolOutput {
    /// A successful call's answer.
    pub fn ok(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            error: false,
        }
    }

    /// A failed call's answer (what the model reads about the failure).
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            error: true,
        }
    }
}

/// A tool: its schema, and a session per episode.
#[async_trait::async_trait]
pub trait Tool: Send + Sync + 'static {
    /// Registered name (the name calls give, and the schema's).
    fn name(&self) -> &str;

    /// What the model is told about it.
    fn schema(&self) -> ToolSchema;

    /// State for one episode: its calls share it, other episodes never see it. `seed`
    /// differs per episode and is fixed for a run (deterministic tools seed from it).
    async fn open(&self, seed: u64) -> Result<Box<dyn ToolSession>, PluginError>;
}

/// One episode's use of a tool.
#[async_trait::async_trait]
pub trait ToolSession: Send {
    /// Run one call. What the call itself does wrong (bad arguments, an exception, a limit)
    /// is an [`ToolOutput::error`] for the model to read; `Err` is the host's own failure,
    /// which ends the episode's use of the tool.
    async fn call(&mut self, arguments: &Map<String, Value>) -> Result<ToolOutput, PluginError>;
}
