//! The `testkit-relay` episode and the `testkit-shift` tool: a multi-turn episode over letters,
//! with a stateful tool between turns, to test episodes end to end in seconds.
//!
//! Each turn of `testkit-relay` but the last is handed to `testkit-shift`, whose answer (the
//! turn's letters moved on by the number of calls the session has had) is appended as the
//! environment's text before the next turn. The whole conversation's text is verified.

use std::sync::Arc;

use areal_sdk::{
    BuildContext, Episode, EpisodeContext, PluginConfig, PluginError, Reward, Tool, ToolOutput,
    ToolSchema, ToolSession,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::tokenizer::LetterTokenizer;

/// The name of the episode.
pub(crate) const RELAY: &str = "testkit-relay";
/// The name of the tool.
pub(crate) const SHIFT: &str = "testkit-shift";

/// Options of the `testkit-relay` episode.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayOptions {
    /// Turns the policy takes. By default 3.
    pub turns: usize,
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self { turns: 3 }
    }
}

/// `turns` turns, each but the last handed to `testkit-shift`, its answer appended.
#[derive(Clone, Debug)]
pub struct Relay {
    options: RelayOptions,
}

impl Relay {
    /// The episode with `options`.
    pub fn new(options: RelayOptions) -> Self {
        Self { options }
    }
}

#[areal_sdk::async_trait]
impl Episode for Relay {
    fn name(&self) -> &str {
        RELAY
    }

    async fn run(&self, ctx: &mut dyn EpisodeContext) -> Result<Reward, PluginError> {
        for turn in 1..=self.options.turns {
            let said = ctx.generate().await?;
            if turn == self.options.turns || ctx.tokens_left() == 0 {
                break;
            }
            let mut arguments = Map::new();
            arguments.insert("text".into(), Value::String(said.text));
            let answer = ctx.call_tool(SHIFT, &arguments).await;
            // an error's text is not letters: the environment says `a` instead
            ctx.append(if answer.error { "a" } else { &answer.text })?;
        }
        let text = ctx.tokenizer().decode(&ctx.completion().token_ids)?;
        ctx.verify(&text).await
    }
}

pub(crate) fn build_relay(
    config: &PluginConfig,
    _: &BuildContext,
) -> Result<Arc<dyn Episode>, PluginError> {
    let options: RelayOptions = config.parse()?;
    if options.turns == 0 {
        return Err(config.invalid("turns", "must be at least 1, found 0"));
    }
    Ok(Arc::new(Relay::new(options)))
}

/// Options of the `testkit-shift` tool.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShiftOptions {
    /// Letters in the alphabet; must match the policy's. By default 8.
    pub letters: u32,
}

impl Default for ShiftOptions {
    fn default() -> Self {
        Self { letters: 8 }
    }
}

/// Moves each letter of `text` on by the number of calls its session has had (1 for the
/// first): state that lives as long as one episode.
#[derive(Clone, Debug)]
pub struct Shift {
    letters: u32,
}

impl Shift {
    /// The tool over the first `letters` letters.
    pub fn new(options: ShiftOptions) -> Self {
        Self {
            letters: options.letters,
        }
    }
}

#[areal_sdk::async_trait]
impl Tool for Shift {
    fn name(&self) -> &str {
        SHIFT
    }

    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: SHIFT.into(),
            description: "Move each letter on by the number of calls so far".into(),
            parameters: json!({
                "type": "object",
                "properties": { "text": { "type": "string" } },
                "required": ["text"],
            }),
        }
    }

    async fn open(&self, _seed: u64) -> Result<Box<dyn ToolSession>, PluginError> {
        Ok(Box::new(ShiftSession {
            tokenizer: LetterTokenizer::new(self.letters),
            calls: 0,
        }))
    }
}

struct ShiftSession {
    tokenizer: LetterTokenizer,
    calls: u32,
}

#[areal_sdk::async_trait]
impl ToolSession for ShiftSession {
    async fn call(&mut self, arguments: &Map<String, Value>) -> Result<ToolOutput, PluginError> {
        use areal_sdk::Tokenizer as _;
        let Some(text) = arguments.get("text").and_then(Value::as_str) else {
            return Ok(ToolOutput::error("`text` (a string) is required"));
        };
        self.calls += 1;
        let letters = self.tokenizer.letters();
        let ids = match self.tokenizer.encode(text) {
            Ok(ids) => ids,
            Err(e) => return Ok(ToolOutput::error(e.to_string())),
        };
        let moved: Vec<u32> = ids.iter().map(|&id| (id + self.calls) % letters).collect();
        if moved.is_empty() {
            return Ok(ToolOutput::error("nothing to move"));
        }
        Ok(ToolOutput::ok(self.tokenizer.decode(&moved)?))
    }
}

pub(crate) fn build_shift(
    config: &PluginConfig,
    _: &BuildContext,
) -> Result<Arc<dyn Tool>, PluginError> {
    let options: ShiftOptions = config.parse()?;
    LetterTokenizer::check_letters(config, options.letters)?;
    Ok(Arc::new(Shift::new(options)))
}
