//! Tool calls in a model's turn, in the format its chat template declares: parsed into a name
//! and an object of arguments, or into an error that says what is wrong, which an episode can
//! hand back to the model as the tool's answer (a malformed call costs a turn, not the run).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ToolCallFormat {
    /// Qwen2.5, Qwen3 and Hermes: each call is `<tool_call>{"name": …, "arguments": {…}}
    /// </tool_call>` inside the turn, any number of them, text around them allowed.
    #[default]
    Hermes,
    /// Llama 3.1–3.3's JSON tool calling: the whole turn is one `{"name": …, "parameters":
    /// {…}}` (optionally after `<|python_tag|>`); a turn that does not start with `{` is text.
    Llama3Json,
    /// Tool-integrated reasoning as Qwen2.5-Math and ToRA write it: each fenced
    /// ```` ```python ```` block of the turn is a call of the `python` tool with the block as
    /// its `code`, text around the blocks allowed.
    CodeBlock,
}

/// The tool a [`ToolCallFormat::CodeBlock`] call calls.
pub const CODE_BLOCK_TOOL: &str = "python";

/// One call: which tool, with what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments (an object; one written as a JSON string is parsed).
    pub arguments: Map<String, Value>,
}

/// A call that could not be read: why, and the text of the call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("tool call {index}: {message}")]
pub struct ToolCallError {
    /// Its place among the turn's calls, from 1.
    pub index: usize,
    /// What is wrong, for the model to read.
    pub message: String,
    /// The call's text as written.
    pub text: String,
}

/// A turn split into its text and its calls, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedTurn {
    /// The turn without its calls (trimmed).
    pub content: String,
    /// Each call, read or not.
    pub calls: Vec<Result<ToolCall, ToolCallError>>,
}

impl ParsedTurn {
    /// Whether the turn asks for any tool (well formed or not).
    pub fn has_calls(&self) -> bool {
        !self.calls.is_empty()
    }
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

/// The tool calls of `turn` (a model's decoded output) in `format`.
pub fn parse_tool_calls(turn: &str, format: ToolCallFormat) -> ParsedTurn {
    match format {
        ToolCallFormat::Hermes => hermes(turn),
        ToolCallFormat::Llama3Json => llama3(turn),
        ToolCallFormat::CodeBlock => code_blocks(turn),
    }
}

const FENCE_OPEN: &str = "```python\n";
const FENCE_CLOSE: &str = "```";

fn code_blocks(turn: &str) -> ParsedTurn {
    let unclosed = "the ```python block is not closed by ``` (the turn ended inside it)";
    fenced(turn, FENCE_OPEN, FENCE_CLOSE, unclosed, |_, code| {
        let mut arguments = Map::new();
        arguments.insert("code".into(), Value::String(code.to_owned()));
        Ok(ToolCall {
            name: CODE_BLOCK_TOOL.to_owned(),
            arguments,
        })
    })
}

fn hermes(turn: &str) -> ParsedTurn {
    let unclosed = format!("`{OPEN}` is not closed by `{CLOSE}` (the turn ended inside it)");
    fenced(turn, OPEN, CLOSE, &unclosed, |index, text| {
        call(index, text.trim(), &["arguments"])
    })
}

/// The calls of `turn` written between `open` and `close` (each read by `read`, given its
/// place from 1 and its text), and the text around them; a call the turn ended inside is an
/// error saying `unclosed`.
fn fenced(
    turn: &str,
    open: &str,
    close: &str,
    unclosed: &str,
    read: impl Fn(usize, &str) -> Result<ToolCall, ToolCallError>,
) -> ParsedTurn {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = turn;
    while let Some(start) = rest.find(open) {
        content.push_str(&rest[..start]);
        let after = &rest[start + open.len()..];
        let index = calls.len() + 1;
        match after.find(close) {
            Some(end) => {
                calls.push(read(index, &after[..end]));
                rest = &after[end + close.len()..];
            }
            None => {
                calls.push(Err(ToolCallError {
                    index,
                    message: unclosed.to_owned(),
                    text: after.trim().to_owned(),
                }));
                rest = "";
            }
        }
    }
    content.push_str(rest);
    ParsedTurn {
        content: content.trim().to_owned(),
        calls,
    }
}

fn llama3(turn: &str) -> ParsedTurn {
    let text = turn.trim();
    let text = text.strip_prefix(PYTHON_TAG).unwrap_or(text).trim();
    if !text.starts_with('{') {
        return ParsedTurn {
            content: turn.trim().to_owned(),
            calls: Vec::new(),
        };
    }
    ParsedTurn {
        content: String::new(),
        calls: vec![call(1, text, &["parameters", "arguments"])],
    }
}

/// One call's JSON: an object with a string `name` and an object of arguments under one of
/// `argument_keys` (absent: no arguments; a string: parsed as JSON).
fn call(index: usize, text: &str, argument_keys: &[&str]) -> Result<ToolCall, ToolCallError> {
    let fail = |message: String| ToolCallError {
        index,
        message,
        text: text.to_owned(),
    };
    let value: Value = serde_json::from_str(text).map_err(|e| fail(format!("not JSON ({e})")))?;
    let Value::Object(mut object) = value else {
        return Err(fail(format!(
            "a call is a JSON object with \"name\" and \"{}\", found {}",
            argument_keys[0],
            kind(&value)
        )));
    };
    let name = match object.remove("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name,
        Some(other) => {
            return Err(fail(format!(
                "\"name\" must be the tool's name (a string), found {}",
                kind(&other)
            )));
        }
        None => return Err(fail("no \"name\": which tool?".to_owned())),
    };
    let key = argument_keys.iter().find(|k| object.contains_key(**k));
    let arguments = match key.and_then(|k| object.remove(*k)) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(arguments)) => arguments,
        // some models write the arguments as a JSON string of an object
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(arguments)) => arguments,
            Ok(other) => {
                return Err(fail(format!(
                    "\"{}\" must be an object, found a string holding {}",
                    key.expect("found"),
                    kind(&other)
                )));
            }
            Err(e) => {
                return Err(fail(format!(
                    "\"{}\" is a string that is not a JSON object ({e})",
                    key.expect("found")
                )));
            }
        },
        Some(other) => {
            return Err(fail(format!(
                "\"{}\" must be an object, found {}",
                key.expect("found"),
                kind(&other)
            )));
        }
    };
    Ok(ToolCall { name, arguments })
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ok(call: &Result<ToolCall, ToolCallError>) -> &ToolCall {
        call.as_ref().expect("a well-formed call")
    }

    fn err(call: &Result<ToolCall, ToolCallError>) -> String {
        call.as_ref().expect_err("a malformed call").to_string()
    }

    #[test]
    fn hermes_calls_with_text_around_them() {
        let turn = "I will compute it.\n<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(2**10)\"}}\n</tool_call>\nthen\n<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"x\", \"k\": 3}}</tool_call>";
        let parsed = parse_tool_calls(turn, ToolCallFormat::Hermes);
        assert_eq!(parsed.content, "I will compute it.\n\nthen");
        assert_eq!(parsed.calls.len(), 2);
        assert_eq!(ok(&parsed.calls[0]).name, "python");
        assert_eq!(
            Value::Object(ok(&parsed.calls[0]).arguments.clone()),
            json!({"code": "print(2**10)"})
        );
        assert_eq!(
            Value::Object(ok(&parsed.calls[1]).arguments.clone()),
            json!({"q": "x", "k": 3})
        );
        assert!(parsed.has_calls());
    }

    #[test]
    fn a_turn_without_calls_is_its_text() {
        let parsed = parse_tool_calls("  The answer is 4.\n", ToolCallFormat::Hermes);
        assert_eq!(parsed.content, "The answer is 4.");
        assert!(!parsed.has_calls());
        let parsed = parse_tool_calls("The answer is {4}.", ToolCallFormat::Llama3Json);
        assert_eq!(parsed.content, "The answer is {4}.");
        assert!(parsed.calls.is_empty());
    }

    #[test]
    fn arguments_written_as_a_json_string_are_parsed() {
        let turn =
            r#"<tool_call>{"name": "python", "arguments": "{\"code\": \"1+1\"}"}</tool_call>"#;
        let parsed = parse_tool_calls(turn, ToolCallFormat::Hermes);
        assert_eq!(
            Value::Object(ok(&parsed.calls[0]).arguments.clone()),
            json!({"code": "1+1"})
        );
        let none = parse_tool_calls(
            r#"<tool_call>{"name": "now"}</tool_call>"#,
            ToolCallFormat::Hermes,
        );
        assert!(
            ok(&none.calls[0]).arguments.is_empty(),
            "no arguments is an empty object"
        );
    }

    #[test]
    fn each_malformed_call_says_what_is_wrong() {
        let cases = [
            (
                "<tool_call>{\"name\": \"python\", \"arguments\": {\"code\": }</tool_call>",
                "tool call 1: not JSON",
            ),
            (
                "<tool_call>[1, 2]</tool_call>",
                "a call is a JSON object with \"name\" and \"arguments\", found an array",
            ),
            ("<tool_call>{\"arguments\": {}}</tool_call>", "no \"name\""),
            (
                "<tool_call>{\"name\": 7}</tool_call>",
                "\"name\" must be the tool's name (a string), found a number",
            ),
            (
                "<tool_call>{\"name\": \"python\", \"arguments\": [1]}</tool_call>",
                "\"arguments\" must be an object, found an array",
            ),
            (
                "<tool_call>{\"name\": \"python\", \"arguments\": \"[1]\"}</tool_call>",
                "found a string holding an array",
            ),
            (
                "<tool_call>{\"name\": \"python\", \"arguments\": \"code=1\"}</tool_call>",
                "is a string that is not a JSON object",
            ),
            (
                "<tool_call>{\"name\": \"python\", \"arguments\": {\"code\": \"while True",
                "`<tool_call>` is not closed",
            ),
        ];
        for (turn, want) in cases {
            let parsed = parse_tool_calls(turn, ToolCallFormat::Hermes);
            assert_eq!(parsed.calls.len(), 1, "{turn}");
            let message = err(&parsed.calls[0]);
            assert!(message.contains(want), "{turn}: {message}");
        }
    }

    #[test]
    fn a_bad_call_does_not_hide_the_good_ones() {
        let turn = "<tool_call>{oops}</tool_call><tool_call>{\"name\": \"python\", \"arguments\": {}}</tool_call>";
        let parsed = parse_tool_calls(turn, ToolCallFormat::Hermes);
        let first = parsed.calls[0].as_ref().unwrap_err();
        assert_eq!((first.index, first.text.as_str()), (1, "{oops}"));
        assert_eq!(ok(&parsed.calls[1]).name, "python");
    }

    #[test]
    fn llama3_json_calls() {
        let parsed = parse_tool_calls(
            "<|python_tag|>{\"name\": \"python\", \"parameters\": {\"code\": \"x = 1\"}}",
            ToolCallFormat::Llama3Json,
        );
        assert_eq!(parsed.content, "");
        assert_eq!(ok(&parsed.calls[0]).name, "python");
        assert_eq!(
            Value::Object(ok(&parsed.calls[0]).arguments.clone()),
            json!({"code": "x = 1"})
        );
        let arguments = parse_tool_calls(
            "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}",
            ToolCallFormat::Llama3Json,
        );
        assert_eq!(
            Value::Object(ok(&arguments.calls[0]).arguments.clone()),
            json!({"a": 1})
        );
        let broken = parse_tool_calls("{\"name\": \"f\", ", ToolCallFormat::Llama3Json);
        assert!(err(&broken.calls[0]).contains("not JSON"));
    }

    #[test]
    fn code_blocks_are_python_calls() {
        let turn = parse_tool_calls(
            "Compute it.\n```python\nx = 37*48\nprint(x)\n```\nthen ```python\nx\n```",
            ToolCallFormat::CodeBlock,
        );
        assert_eq!(turn.content, "Compute it.\n\nthen");
        assert_eq!(turn.calls.len(), 2);
        assert_eq!(ok(&turn.calls[0]).name, "python");
        assert_eq!(
            ok(&turn.calls[0]).arguments["code"],
            json!("x = 37*48\nprint(x)\n")
        );
        assert_eq!(ok(&turn.calls[1]).arguments["code"], json!("x\n"));
        let open = parse_tool_calls("```python\n1 +", ToolCallFormat::CodeBlock);
        assert!(
            err(&open.calls[0]).contains("not closed"),
            "{:?}",
            open.calls
        );
        let text = parse_tool_calls("=1776", ToolCallFormat::CodeBlock);
        assert!(!text.has_calls());
        assert_eq!(text.content, "=1776");
    }

    #[test]
    fn formats_are_named_in_configs() {
        let f: ToolCallFormat = serde_json::from_value(json!("llama3-json")).unwrap();
        assert_eq!(f, ToolCallFormat::Llama3Json);
        assert_eq!(
            serde_json::to_value(ToolCallFormat::Hermes).unwrap(),
            json!("hermes")
        );
    }
}
