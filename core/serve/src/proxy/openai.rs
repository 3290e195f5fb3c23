//! OpenAI's chat completions as the proxy reads and writes them: the request's fields it
//! takes, the answer's shape (`choices[].message.tool_calls`, `finish_reason`, `usage`), the
//! chunks of a streamed answer, and OpenAI's error body.

use areal_sdk::tool_calls::{ParsedTurn, ToolCall, ToolCallFormat, parse_tool_calls};
use areal_sdk::{ChatMessage, ToolSchema};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// `POST /v1/chat/completions`: the fields the proxy reads. Of the rest, those that change
/// nothing sampled (`user`, `metadata`, `store`...) are taken as they come, those at their
/// no-effect value (`presence_penalty: 0`, `response_format: {"type": "text"}`...) too; any
/// other, or any field the proxy does not know, is refused by name by [`ChatRequest::check`]
/// (as OpenAI refuses an unrecognised argument): a field accepted and ignored would be a lie
/// to the client.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct ChatRequest {
    pub(crate) messages: Vec<Value>,
    #[serde(default)]
    pub(crate) tools: Vec<Value>,
    #[serde(default)]
    pub(crate) tool_choice: Option<Value>,
    #[serde(default)]
    pub(crate) temperature: Option<f32>,
    #[serde(default)]
    pub(crate) top_p: Option<f32>,
    #[serde(default)]
    pub(crate) max_tokens: Option<usize>,
    #[serde(default)]
    pub(crate) max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub(crate) stop: Option<Value>,
    #[serde(default)]
    pub(crate) n: Option<usize>,
    #[serde(default)]
    pub(crate) stream: bool,
    #[serde(default)]
    pub(crate) stream_options: Option<Value>,
    #[serde(default)]
    pub(crate) logprobs: Option<bool>,
    #[serde(default)]
    pub(crate) model: Option<String>,
    #[serde(default)]
    pub(crate) seed: Option<Value>,
    /// Every other field, checked by [`check_rest`].
    #[serde(flatten)]
    pub(crate) rest: Map<String, Value>,
}

/// Fields that change nothing the proxy samples or answers: taken with any value.
const NO_EFFECT: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
];

/// Whether `value` of field `name` asks for nothing beyond what the proxy does (the field's
/// default, or null): `None` when the proxy does not know the field.
fn at_default(name: &str, value: &Value) -> Option<bool> {
    let none = value.is_null();
    Some(match name {
        "frequency_penalty" | "presence_penalty" => none || value.as_f64() == Some(0.0),
        "top_logprobs" => none || value.as_u64() == Some(0),
        "logit_bias" => none || value.as_object().is_some_and(Map::is_empty),
        "parallel_tool_calls" => none || value.as_bool() == Some(true),
        "response_format" => none || value == &json!({"type": "text"}),
        "modalities" => none || value == &json!(["text"]),
        "functions" => none || value.as_array().is_some_and(Vec::is_empty),
        "function_call" | "audio" | "prediction" | "web_search_options" | "reasoning_effort"
        | "verbosity" => none,
        _ => return None,
    })
}

/// What is wrong with the fields the proxy does not read, if anything: the first, by name.
fn check_rest(rest: &Map<String, Value>) -> Result<(), BadField> {
    for (name, value) in rest {
        if NO_EFFECT.contains(&name.as_str()) {
            continue;
        }
        match at_default(name, value) {
            Some(true) => {}
            Some(false) => {
                let why = match name.as_str() {
                    "response_format" => {
                        "only {\"type\": \"text\"}: a structured answer would need \
                         constrained decoding"
                    }
                    "functions" | "function_call" => "the deprecated form: use `tools`",
                    "parallel_tool_calls" => "only true: a turn's calls are all the policy writes",
                    "top_logprobs" => "only 0: the policy's alternatives are not kept",
                    _ => "the proxy samples the policy as it is and cannot honour it",
                };
                return Err(BadField::new(
                    name.clone(),
                    format!("{name} = {value}: {why}"),
                ));
            }
            None => {
                return Err(BadField::new(
                    name.clone(),
                    format!("Unrecognized request argument supplied: {name}"),
                ));
            }
        }
    }
    Ok(())
}

/// A request refused: the field, and why (a 400 naming it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BadField {
    pub(crate) param: String,
    pub(crate) message: String,
}

impl BadField {
    pub(crate) fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: param.into(),
            message: message.into(),
        }
    }
}

/// What a request asks of one turn, read and checked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Asked {
    pub(crate) messages: Vec<ChatMessage>,
    pub(crate) tools: Vec<ToolSchema>,
    /// The names of the tools the answer may call: those offered, none when `tool_choice`
    /// is `none`. A call to any other name is text.
    pub(crate) callable: Vec<String>,
    pub(crate) max_tokens: Option<usize>,
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) logprobs: bool,
    pub(crate) model: String,
    /// Choices to sample (`n`).
    pub(crate) n: usize,
    /// Texts that end a turn (`stop`).
    pub(crate) stop: Vec<String>,
    /// The client's `seed`: the same seed and messages sample the same turn.
    pub(crate) seed: Option<u64>,
}

/// The most stop texts a request may give (OpenAI's bound).
pub(crate) const MAX_STOP: usize = 4;

/// The most choices one request may ask for (`n`).
pub(crate) const MAX_CHOICES: usize = 16;

impl ChatRequest {
    /// The request read and checked: every message and tool in the form templates take.
    pub(crate) fn check(self) -> Result<Asked, BadField> {
        if self.messages.is_empty() {
            return Err(BadField::new("messages", "at least one message is needed"));
        }
        check_rest(&self.rest)?;
        let seed = match &self.seed {
            None | Some(Value::Null) => None,
            // (a negative seed is as good a seed: its bits)
            Some(v) => Some(
                v.as_u64()
                    .or_else(|| v.as_i64().map(|s| s as u64))
                    .ok_or_else(|| BadField::new("seed", format!("{v}: an integer")))?,
            ),
        };
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(BadField::new(
                "n",
                format!("n = {n}: from 1 to {MAX_CHOICES} choices"),
            ));
        }
        let stop = match &self.stop {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(list)) => list
                .iter()
                .map(|s| s.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| BadField::new("stop", "a string or a list of strings"))?,
            Some(other) => {
                return Err(BadField::new(
                    "stop",
                    format!("{other}: a string or a list of strings"),
                ));
            }
        };
        if stop.len() > MAX_STOP || stop.iter().any(String::is_empty) {
            return Err(BadField::new(
                "stop",
                format!("at most {MAX_STOP} texts, none empty"),
            ));
        }
        let calls_allowed = match &self.tool_choice {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) if s == "auto" => true,
            Some(Value::String(s)) if s == "none" => false,
            Some(other) => {
                return Err(BadField::new(
                    "tool_choice",
                    format!(
                        "{other}: only \"auto\" and \"none\" (forcing a call would need \
                         constrained decoding)"
                    ),
                ));
            }
        };
        let messages = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| message(m).map_err(|e| BadField::new(format!("messages[{i}]"), e)))
            .collect::<Result<Vec<_>, _>>()?;
        let tools = self
            .tools
            .iter()
            .enumerate()
            .map(|(i, t)| tool(t).map_err(|e| BadField::new(format!("tools[{i}]"), e)))
            .collect::<Result<Vec<_>, _>>()?;
        let callable = if calls_allowed {
            tools.iter().map(|t| t.name.clone()).collect()
        } else {
            Vec::new()
        };
        if let Some(t) = self.temperature
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(BadField::new(
                "temperature",
                format!("{t}: must be finite and ≥ 0"),
            ));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(BadField::new("top_p", format!("{p}: must be in (0, 1]")));
        }
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        if max_tokens == Some(0) {
            return Err(BadField::new("max_tokens", "must be at least 1"));
        }
        let include_usage = self
            .stream_options
            .as_ref()
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(Asked {
            messages,
            tools,
            callable,
            max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            stream: self.stream,
            include_usage,
            logprobs: self.logprobs.unwrap_or(false),
            model: self.model.unwrap_or_else(|| "policy".into()),
            n,
            stop,
            seed,
        })
    }
}

/// One OpenAI message as a [`ChatMessage`]: `content` a string, an array of text parts or
/// null; `tool_calls` with their `arguments` read from JSON text into an object (the form
/// chat templates write); `tool_call_id` and `name` kept.
pub(crate) fn message(value: &Value) -> Result<ChatMessage, String> {
    let Some(object) = value.as_object() else {
        return Err("a message is an object".into());
    };
    let role = object
        .get("role")
        .and_then(Value::as_str)
        .ok_or("a message needs a string `role`")?;
    let content = match object.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(format!(
                            "content part of type {}: only text parts are taken",
                            kind.unwrap_or("(none)")
                        ));
                    }
                }
            }
            text
        }
        Some(other) => return Err(format!("`content` must be a string or parts, not {other}")),
    };
    let mut out = ChatMessage::new(role, &content);
    if let Some(calls) = object.get("tool_calls").filter(|c| !c.is_null()) {
        let Some(calls) = calls.as_array() else {
            return Err("`tool_calls` must be an array".into());
        };
        out.tool_calls = calls
            .iter()
            .enumerate()
            .map(|(k, c)| tool_call(c).map_err(|e| format!("tool_calls[{k}]: {e}")))
            .collect::<Result<_, _>>()?;
    }
    if let Some(id) = object.get("tool_call_id").and_then(Value::as_str) {
        out.tool_call_id = Some(id.into());
    }
    if let Some(name) = object.get("name").and_then(Value::as_str) {
        out.name = Some(name.into());
    }
    Ok(out)
}

/// One call of an assistant message, its `arguments` an object (read from JSON text).
fn tool_call(call: &Value) -> Result<Value, String> {
    let function = call
        .get("function")
        .and_then(Value::as_object)
        .ok_or("a call needs a `function` object")?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or("a call's function needs a string `name`")?;
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => v,
            _ => Value::String(text.clone()),
        },
        Some(v) => v.clone(),
    };
    let mut out = json!({
        "type": "function",
        "function": { "name": name, "arguments": arguments },
    });
    if let Some(id) = call.get("id").and_then(Value::as_str) {
        out["id"] = Value::String(id.into());
    }
    Ok(out)
}

/// One entry of `tools` (`{"type": "function", "function": {name, description, parameters}}`)
/// as a [`ToolSchema`].
fn tool(value: &Value) -> Result<ToolSchema, String> {
    let kind = value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("function");
    if kind != "function" {
        return Err(format!("tools of type {kind}: only functions"));
    }
    let function = value
        .get("function")
        .and_then(Value::as_object)
        .ok_or("a tool needs a `function` object")?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or("a tool's function needs a string `name`")?;
    Ok(ToolSchema {
        name: name.into(),
        description: function
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .into(),
        parameters: function
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
    })
}

/// The assistant's message a turn's text makes: its tool calls read out of it in `format`
/// (each given the id `{id_prefix}_{k}`), the rest its content. A turn with no tool
/// `callable`, with a call that cannot be read, or with a call to a name not callable is all
/// content (as OpenAI and vLLM answer: a client is never handed a call to a tool it did not
/// offer).
pub(crate) fn assistant_message(
    text: &str,
    format: ToolCallFormat,
    callable: &[String],
    id_prefix: &str,
) -> ChatMessage {
    if callable.is_empty() {
        return ChatMessage::new("assistant", text);
    }
    let ParsedTurn { content, calls } = parse_tool_calls(text, format);
    let offered =
        |call: &Result<ToolCall, _>| call.as_ref().is_ok_and(|c| callable.contains(&c.name));
    if calls.is_empty() || !calls.iter().all(offered) {
        return ChatMessage::new("assistant", text);
    }
    let calls = calls
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(k, call)| {
            json!({
                "id": format!("{id_prefix}_{k}"),
                "type": "function",
                "function": { "name": call.name, "arguments": Value::Object(call.arguments) },
            })
        })
        .collect();
    ChatMessage::new("assistant", &content).with_tool_calls(calls)
}

/// `message` as OpenAI writes an assistant's message: `content` null when empty beside calls,
/// each call's `arguments` as JSON text.
pub(crate) fn message_json(message: &ChatMessage) -> Value {
    let mut out = json!({ "role": message.role });
    out["content"] = if message.content.is_empty() && !message.tool_calls.is_empty() {
        Value::Null
    } else {
        Value::String(message.content.clone())
    };
    if !message.tool_calls.is_empty() {
        out["tool_calls"] = Value::Array(message.tool_calls.iter().map(call_json).collect());
    }
    out
}

/// A call with its `arguments` as JSON text.
fn call_json(call: &Value) -> Value {
    let mut call = call.clone();
    if let Some(arguments) = call.pointer_mut("/function/arguments")
        && !arguments.is_string()
    {
        *arguments = Value::String(arguments.to_string());
    }
    call
}

/// Why a turn ended, as OpenAI says it.
pub(crate) fn finish_reason(stopped: bool, message: &ChatMessage) -> &'static str {
    match (stopped, message.tool_calls.is_empty()) {
        (_, false) => "tool_calls",
        (true, true) => "stop",
        (false, true) => "length",
    }
}

/// One choice of an answer: a turn of the policy.
#[derive(Clone, Debug)]
pub(crate) struct Choice {
    pub(crate) message: ChatMessage,
    pub(crate) finish_reason: &'static str,
    pub(crate) completion_tokens: usize,
    /// Each sampled token's text and behaviour logprob, when asked for.
    pub(crate) logprobs: Option<Vec<(String, f32)>>,
}

impl Choice {
    fn logprobs_json(&self) -> Value {
        match &self.logprobs {
            None => Value::Null,
            Some(tokens) => json!({
                "content": tokens
                    .iter()
                    .map(|(t, lp)| json!({
                        "token": t,
                        "logprob": lp,
                        "bytes": t.as_bytes(),
                        "top_logprobs": [],
                    }))
                    .collect::<Vec<_>>(),
            }),
        }
    }
}

/// An answered request, ready to be written as a completion or as chunks.
#[derive(Clone, Debug)]
pub(crate) struct Answer {
    /// `chatcmpl-…`: the interaction's id (what `/rl/set_reward` names).
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    /// Its choices (one but for `n`), by index.
    pub(crate) choices: Vec<Choice>,
    pub(crate) prompt_tokens: usize,
}

impl Answer {
    fn usage(&self) -> Value {
        let completion: usize = self.choices.iter().map(|c| c.completion_tokens).sum();
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        })
    }

    /// The `chat.completion` object.
    pub(crate) fn completion(&self) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": self.choices.iter().enumerate().map(|(index, c)| json!({
                "index": index,
                "message": message_json(&c.message),
                "logprobs": c.logprobs_json(),
                "finish_reason": c.finish_reason,
            })).collect::<Vec<_>>(),
            "usage": self.usage(),
        })
    }

    /// The `chat.completion.chunk` objects of a streamed answer (each a server-sent event's
    /// data, `[DONE]` after them), as OpenAI streams them: for each choice the role (`content`
    /// null when the turn is only calls), the content, each call whole, the finish reason;
    /// then the usage when `include_usage`. Asked for, the turn's logprobs come with the first
    /// chunk after the role, whichever it is, so that a client reading the stream has every
    /// token's logprob the completion would have given it, calls and empty turns included.
    pub(crate) fn chunks(&self, include_usage: bool) -> Vec<Value> {
        let chunk = |index: usize, delta: Value, finish: Value, logprobs: Value| {
            let mut c = json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{
                    "index": index,
                    "delta": delta,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }],
            });
            if include_usage {
                c["usage"] = Value::Null;
            }
            c
        };
        let mut out = Vec::new();
        for (index, choice) in self.choices.iter().enumerate() {
            let message = message_json(&choice.message);
            out.push(chunk(
                index,
                json!({"role": "assistant", "content": message["content"].as_str().map(|_| "")}),
                Value::Null,
                Value::Null,
            ));
            let mut logprobs = Some(choice.logprobs_json());
            let mut next = || logprobs.take().unwrap_or(Value::Null);
            if !choice.message.content.is_empty() {
                out.push(chunk(
                    index,
                    json!({"content": choice.message.content}),
                    Value::Null,
                    next(),
                ));
            }
            for (k, call) in choice.message.tool_calls.iter().enumerate() {
                let mut call = call_json(call);
                call["index"] = json!(k);
                out.push(chunk(
                    index,
                    json!({"tool_calls": [call]}),
                    Value::Null,
                    next(),
                ));
            }
            out.push(chunk(index, json!({}), json!(choice.finish_reason), next()));
        }
        if include_usage {
            out.push(json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": self.usage(),
            }));
        }
        out
    }
}

/// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
pub(crate) fn error_body(
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Value {
    json!({
        "error": {
            "message": message,
            "type": kind,
            "param": param,
            "code": code,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Result<Asked, BadField> {
        serde_json::from_value::<ChatRequest>(body).unwrap().check()
    }

    #[test]
    fn messages_are_read_as_templates_take_them() {
        let asked = request(json!({
            "model": "x",
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "2"},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
            "max_completion_tokens": 7,
        }))
        .unwrap();
        assert_eq!(asked.messages[0].content, "be brief");
        assert_eq!(asked.messages[2].content, "");
        assert_eq!(
            asked.messages[2].tool_calls[0]["function"]["arguments"],
            json!({"a": 1})
        );
        assert_eq!(asked.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(asked.tools[0].name, "f");
        assert_eq!(asked.max_tokens, Some(7));
        assert_eq!(asked.callable, ["f"]);
        // with tool_choice none, or no tools offered, nothing is callable
        let none = |extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f"}}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            request(body).unwrap().callable
        };
        assert!(none(json!({"tool_choice": "none"})).is_empty());
        assert!(none(json!({"tools": []})).is_empty());
        assert_eq!(none(json!({"tool_choice": "auto"})), ["f"]);
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let base = |extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            request(body).unwrap_err().param
        };
        assert_eq!(base(json!({"n": 0})), "n");
        assert_eq!(base(json!({"n": 17})), "n");
        assert_eq!(base(json!({"stop": [""]})), "stop");
        assert_eq!(base(json!({"stop": ["a", "b", "c", "d", "e"]})), "stop");
        assert_eq!(base(json!({"stop": [1]})), "stop");
        assert_eq!(base(json!({"tool_choice": "required"})), "tool_choice");
        assert_eq!(base(json!({"max_tokens": 0})), "max_tokens");
        assert_eq!(base(json!({"temperature": -1.0})), "temperature");
        assert_eq!(base(json!({"top_p": 0.0})), "top_p");
        assert_eq!(base(json!({"seed": "x"})), "seed");
        // fields that would be ignored are refused by name, unknown ones too
        for (field, value) in [
            ("response_format", json!({"type": "json_object"})),
            (
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            ),
            ("presence_penalty", json!(0.5)),
            ("frequency_penalty", json!(-1)),
            ("logit_bias", json!({"12": 5})),
            ("top_logprobs", json!(3)),
            ("parallel_tool_calls", json!(false)),
            ("functions", json!([{"name": "f"}])),
            ("function_call", json!("auto")),
            ("audio", json!({"voice": "alloy"})),
            ("modalities", json!(["text", "audio"])),
            ("prediction", json!({"type": "content", "content": "x"})),
            ("reasoning_effort", json!("high")),
            ("verbosity", json!("low")),
            ("web_search_options", json!({})),
            ("top_k", json!(20)),
            ("chat_template_kwargs", json!({"enable_thinking": false})),
            ("guided_json", json!({})),
        ] {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
            body[field] = value.clone();
            let refused = request(body).unwrap_err();
            assert_eq!(refused.param, field, "{field} = {value}");
            assert!(refused.message.contains(field), "{}", refused.message);
        }
        let unknown = request(json!({"messages": [{"role": "user", "content": "hi"}], "top_k": 2}))
            .unwrap_err();
        assert_eq!(
            unknown.message,
            "Unrecognized request argument supplied: top_k"
        );
        // what changes nothing is taken, at any value or at its no-effect one
        let harmless = request(json!({
            "messages": [{"role": "user", "content": "hi"}],
            "user": "u", "metadata": {"k": "v"}, "store": false, "service_tier": "auto",
            "safety_identifier": "s", "prompt_cache_key": "p",
            "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
            "top_logprobs": 0, "parallel_tool_calls": true, "response_format": {"type": "text"},
            "modalities": ["text"], "functions": [], "function_call": null, "audio": null,
            "prediction": null, "web_search_options": null, "reasoning_effort": null,
            "verbosity": null, "seed": -3,
        }))
        .unwrap();
        assert_eq!(harmless.seed, Some(-3i64 as u64));
        assert_eq!(
            base(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
            "messages[0]"
        );
        assert!(request(json!({"messages": []})).is_err());
        // an empty stop list, a stop text, and n up to 16 are fine
        assert!(
            request(json!({"messages": [{"role": "user", "content": "hi"}], "stop": [], "n": 16}))
                .is_ok()
        );
        let asked = request(json!({"messages": [{"role": "user", "content": "hi"}], "stop": "\n"}))
            .unwrap();
        assert_eq!(asked.stop, ["\n"]);
    }

    #[test]
    fn a_turn_with_calls_becomes_openais_message() {
        let text = "let me compute\n<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"6*7\"}}\n</tool_call>";
        let python = ["python".to_owned()];
        let m = assistant_message(text, ToolCallFormat::Hermes, &python, "call_x");
        assert_eq!(m.content, "let me compute");
        let json = message_json(&m);
        assert_eq!(json["tool_calls"][0]["id"], "call_x_0");
        assert_eq!(
            json["tool_calls"][0]["function"]["arguments"],
            "{\"code\":\"6*7\"}"
        );
        // read back as a client sends it, it is the same message
        assert_eq!(message(&json).unwrap(), m);
        assert_eq!(finish_reason(true, &m), "tool_calls");
        // tool_choice none, or no tools offered: all text
        let plain = assistant_message(text, ToolCallFormat::Hermes, &[], "c");
        assert_eq!(plain.content, text);
        assert_eq!(finish_reason(true, &plain), "stop");
        // a call to a tool not offered: all text (the client could not run it)
        let other = assistant_message(text, ToolCallFormat::Hermes, &["search".into()], "c");
        assert!(other.tool_calls.is_empty());
        assert_eq!(other.content, text);
        assert_eq!(finish_reason(true, &other), "stop");
        // a call that cannot be read leaves the text whole
        let broken = assistant_message(
            "<tool_call>{oops</tool_call>",
            ToolCallFormat::Hermes,
            &python,
            "c",
        );
        assert!(broken.tool_calls.is_empty());
        assert_eq!(finish_reason(false, &broken), "length");
    }
}
