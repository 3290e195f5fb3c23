//! The `tool-calls` episode: the policy answers, calling tools in the format its chat template
//! declares; each turn's calls are run and their answers appended, in the template's markup,
//! before the next turn; the turn without calls (or the last allowed) is verified.

use std::sync::Arc;

use areal_sdk::tool_calls::{ToolCallFormat, parse_tool_calls};
use areal_sdk::{
    BuildContext, ChatMessage, Episode, EpisodeContext, PluginConfig, PluginError, Reward,
    ToolOutput,
};
use serde::Deserialize;

/// The registered name.
pub const TOOL_CALLS: &str = "tool-calls";

/// What the verifier grades.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Graded {
    /// The last turn's text (the final answer). The default.
    #[default]
    LastTurn,
    /// The whole conversation after the prompt, tool answers included.
    All,
}

/// Options of the `tool-calls` episode (`[episode] kind = "tool-calls"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolCallsOptions {
    /// How the model writes calls: `hermes` (Qwen2.5, Qwen3, Hermes: `<tool_call>{...}
    /// </tool_call>`, the default), `llama3-json`, or `code-block` (each ```` ```python ````
    /// block calls the `python` tool).
    pub format: ToolCallFormat,
    /// Turns the policy takes at most; the last is verified whether it calls or not. By
    /// default 4.
    pub max_turns: usize,
    /// The environment's text after a turn with calls, before the first answer. By default
    /// the format's markup ([`Markup::of`]).
    pub before_answers: Option<String>,
    /// Each call's answer, `{output}` standing for the tool's text. By default the format's.
    pub answer: Option<String>,
    /// The environment's text after the last answer, opening the policy's next turn. By default
    /// the format's.
    pub after_answers: Option<String>,
    /// What the verifier grades: `last-turn` (default) or `all`.
    pub graded: Graded,
}

impl ToolCallsOptions {
    /// Whether the options write the answers' markup themselves.
    fn overrides_markup(&self) -> bool {
        self.before_answers.is_some() || self.answer.is_some() || self.after_answers.is_some()
    }
}

impl Default for ToolCallsOptions {
    fn default() -> Self {
        Self {
            format: ToolCallFormat::Hermes,
            max_turns: 4,
            before_answers: None,
            answer: None,
            after_answers: None,
            graded: Graded::LastTurn,
        }
    }
}

/// How a turn's answers are written between the turn and the next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Markup {
    /// Before the first answer.
    pub before_answers: String,
    /// Each answer, `{output}` standing for the tool's text.
    pub answer: String,
    /// After the last, opening the policy's next turn.
    pub after_answers: String,
}

impl Markup {
    /// The markup the chat templates of `format`'s models write: Qwen's and Hermes' (the
    /// turn ended with `<|im_end|>`; the answers in a `user` turn, each in a
    /// `<tool_response>` block), Llama 3's (the turn ended with `<|eom_id|>` or `<|eot_id|>`;
    /// each answer an `ipython` message), or a code block's (each answer an
    /// ```` ```output ```` block after the turn).
    pub fn of(format: ToolCallFormat) -> Self {
        let (before, answer, after) = match format {
            ToolCallFormat::Hermes => (
                "\n<|im_start|>user",
                "\n<tool_response>\n{output}\n</tool_response>",
                "<|im_end|>\n<|im_start|>assistant\n",
            ),
            ToolCallFormat::Llama3Json => (
                "",
                "<|start_header_id|>ipython<|end_header_id|>\n\n{output}<|eot_id|>",
                "<|start_header_id|>assistant<|end_header_id|>\n\n",
            ),
            ToolCallFormat::CodeBlock => ("", "\n```output\n{output}```\n", ""),
        };
        Self {
            before_answers: before.to_owned(),
            answer: answer.to_owned(),
            after_answers: after.to_owned(),
        }
    }
}

/// The episode (see the module's documentation).
#[derive(Clone, Debug)]
pub struct ToolCalls {
    options: ToolCallsOptions,
    markup: Markup,
}

impl ToolCalls {
    /// The episode with `options`.
    pub fn new(options: ToolCallsOptions) -> Self {
        let default = Markup::of(options.format);
        let markup = Markup {
            before_answers: options
                .before_answers
                .clone()
                .unwrap_or(default.before_answers),
            answer: options.answer.clone().unwrap_or(default.answer),
            after_answers: options
                .after_answers
                .clone()
                .unwrap_or(default.after_answers),
        };
        Self { options, markup }
    }

    /// The environment's text for a turn's answers.
    fn answers(&self, outputs: &[ToolOutput]) -> String {
        let m = &self.markup;
        let mut text = m.before_answers.clone();
        for output in outputs {
            text.push_str(&m.answer.replace("{output}", &output.text));
        }
        text.push_str(&m.after_answers);
        text
    }
}

#[areal_sdk::async_trait]
impl Episode for ToolCalls {
    fn name(&self) -> &str {
        TOOL_CALLS
    }

    async fn run(&self, ctx: &mut dyn EpisodeContext) -> Result<Reward, PluginError> {
        let mut last = String::new();
        for turn_number in 1..=self.options.max_turns {
            let turn = ctx.generate().await?;
            let parsed = parse_tool_calls(&turn.text, self.options.format);
            last = turn.text;
            let done = !parsed.has_calls()
                || turn_number == self.options.max_turns
                || ctx.tokens_left() == 0;
            if done {
                break;
            }
            let mut outputs = Vec::with_capacity(parsed.calls.len());
            for call in parsed.calls {
                let output = match call {
                    Ok(call) => ctx.call_tool(&call.name, &call.arguments).await,
                    Err(malformed) => {
                        ctx.count_tool_error();
                        ToolOutput::error(malformed.to_string())
                    }
                };
                outputs.push(output);
            }
            match ctx.conversation() {
                // the chat template's own markup for the answers, as `tool` messages
                Some(_) if !self.options.overrides_markup() => {
                    let messages: Vec<ChatMessage> = outputs
                        .iter()
                        .map(|o| ChatMessage::new("tool", &o.text))
                        .collect();
                    ctx.append_messages(&messages)?
                }
                _ => ctx.append(&self.answers(&outputs))?,
            };
        }
        let graded = match self.options.graded {
            Graded::LastTurn => last,
            Graded::All => ctx.tokenizer().decode(&ctx.completion().token_ids)?,
        };
        ctx.verify(&graded).await
    }
}

pub(crate) fn build(
    config: &PluginConfig,
    _: &BuildContext,
) -> Result<Arc<dyn Episode>, PluginError> {
    let options: ToolCallsOptions = config.parse()?;
    if options.max_turns == 0 {
        return Err(config.invalid("max_turns", "must be at least 1, found 0"));
    }
    if let Some(answer) = &options.answer
        && !answer.contains("{output}")
    {
        return Err(config.invalid(
            "answer",
            format!("must contain {{output}}, where the tool's text goes; found {answer:?}"),
        ));
    }
    Ok(Arc::new(ToolCalls::new(options)))
}
