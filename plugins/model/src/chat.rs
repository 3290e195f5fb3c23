//! Chat templates: the Jinja template of a model's `tokenizer_config.json`, rendered as
//! transformers' `apply_chat_template` renders it, so that tasks can put prompts in a model's
//! chat format.
//!
//! transformers renders in a sandboxed Jinja environment with `trim_blocks` and
//! `lstrip_blocks`, loop controls, a `raise_exception` function, a `tojson` filter that is
//! Python's `json.dumps` (no HTML escaping, `", "` and `": "` separators), Python's string
//! methods (`strip`, `startswith`, `split`...), and the tokenizer's special tokens
//! (`bos_token`, `eos_token`...) as variables. The same environment is built here with
//! minijinja.

use std::collections::BTreeMap;
use std::path::Path;

use areal_sdk::{ChatMessage, PluginError, ToolSchema};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

/// The tokenizer's settings in a checkpoint folder (special tokens, the chat template).
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// The chat template, where recent transformers save it.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

fn failed(message: impl Into<String>) -> PluginError {
    PluginError::failed(crate::NAME, message)
}

/// A model's chat template with the special tokens it may name.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    special: BTreeMap<String, String>,
    /// Where it came from, for its errors.
    origin: String,
}

/// The instructions one rendering may run (minijinja's fuel): a real template spends a few
/// hundred a message, so this renders conversations of 10^5 messages, and stops a template
/// that loops without end in a second or so.
pub(crate) const RENDER_FUEL: u64 = 50_000_000;

/// The most bytes one rendering may write (past the longest context a model reads).
pub(crate) const RENDER_BYTES: usize = 32 << 20;

/// Writes into a string up to [`RENDER_BYTES`], then fails.
struct Bounded(Vec<u8>);

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > RENDER_BYTES {
            return Err(std::io::Error::other("too long"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A special token of `tokenizer_config.json`: a string, or an `AddedToken` object.
fn token_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// The special tokens a template may name (`bos_token`, `eos_token`...), from the settings of
/// a `tokenizer_config.json`.
pub(crate) fn special_tokens(config: &serde_json::Value) -> BTreeMap<String, String> {
    [
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "sep_token",
        "cls_token",
        "mask_token",
    ]
    .into_iter()
    .filter_map(|key| Some((key.to_owned(), token_text(config.get(key)?)?)))
    .collect()
}

/// Python's `json.dumps(value, ensure_ascii=False)` with its default separators, or with
/// `indent`: keys in their order, no HTML escaping, floats written as Python writes them.
fn python_json(
    value: &Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let separator = |out: &mut String| {
        out.push(',');
        if indent.is_none() {
            out.push(' ');
        }
    };
    let string = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match value.as_i64() {
            Some(i) if value.is_integer() => out.push_str(&i.to_string()),
            _ => {
                let f = f64::try_from(value.clone())?;
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
                    out.push_str(&format!("{f:.1}"));
                } else {
                    out.push_str(&serde_json::Value::from(f).to_string());
                }
            }
        },
        ValueKind::String => out.push_str(&string(value.as_str().unwrap_or_default())),
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    separator(out);
                }
                newline(out, depth + 1);
                out.push_str(&string(&key.to_string()));
                out.push_str(": ");
                python_json(&value.get_item(key)?, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    separator(out);
                }
                newline(out, depth + 1);
                python_json(item, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
    }
    Ok(())
}

fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    python_json(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    /// The template `source` (Jinja), with the special tokens `special` (`bos_token` →
    /// its text...) as variables.
    pub fn new(source: &str, special: BTreeMap<String, String>) -> Result<Self, PluginError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.set_fuel(Some(RENDER_FUEL));
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| failed(format!("the chat template does not parse: {e:#}")))?;
        Ok(Self {
            env,
            special,
            origin: "the chat template".into(),
        })
    }

    /// The same, its errors naming it as `origin` (its file).
    pub fn named(mut self, origin: impl Into<String>) -> Self {
        self.origin = origin.into();
        self
    }

    /// The chat template of the checkpoint folder `dir`, if it has one, with the special
    /// tokens of its `tokenizer_config.json`. The template is `chat_template.jinja` (where
    /// recent transformers save it), else `tokenizer_config.json`'s `chat_template`: a string,
    /// or the entry named `default` of a list of named templates.
    pub fn from_folder(dir: &Path) -> Result<Option<Self>, PluginError> {
        let read = |name: &str| read_side_file(&dir.join(name));
        Self::from_files(
            dir,
            read(TOKENIZER_CONFIG_FILE)?.as_deref(),
            read(CHAT_TEMPLATE_FILE)?.as_deref(),
        )
    }

    /// [`ChatTemplate::from_folder`] on the texts of the folder's `tokenizer_config.json` and
    /// `chat_template.jinja` (`None` where it has none), already read.
    pub fn from_files(
        dir: &Path,
        tokenizer_config: Option<&str>,
        jinja: Option<&str>,
    ) -> Result<Option<Self>, PluginError> {
        let path = dir.join(TOKENIZER_CONFIG_FILE);
        let config: serde_json::Value = match tokenizer_config {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| failed(format!("{}: {e}", path.display())))?,
            None => serde_json::json!({}),
        };
        let source = match (jinja, config.get("chat_template")) {
            (Some(text), _) => text.to_owned(),
            (None, None | Some(serde_json::Value::Null)) => return Ok(None),
            (None, Some(serde_json::Value::String(s))) => s.clone(),
            (None, Some(serde_json::Value::Array(named))) => named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
                .ok_or_else(|| {
                    failed(format!(
                        "{}: `chat_template` is a list without a template named \"default\"",
                        path.display()
                    ))
                })?,
            (None, Some(_)) => {
                return Err(failed(format!(
                    "{}: `chat_template` is neither a string nor a list of named templates",
                    path.display()
                )));
            }
        };
        let origin = match jinja {
            Some(_) => format!(
                "the chat template {}",
                dir.join(CHAT_TEMPLATE_FILE).display()
            ),
            None => format!("the chat template of {}", path.display()),
        };
        Self::new(&source, special_tokens(&config))
            .map(|t| Some(t.named(origin)))
            .map_err(|e| failed(format!("{}: {e}", path.display())))
    }

    /// `messages` in the model's chat format, told of `tools` (none: `tools` is `None`, as
    /// transformers passes it without tools), ending with the assistant's header when
    /// `add_generation_prompt` (the prompt a model completes). Each tool is given in OpenAI's
    /// function form with its keys in transformers' order (`type`, `function`: `name`,
    /// `description`, `parameters` as written), so a template's `tools | tojson` writes what
    /// transformers writes.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSchema],
        add_generation_prompt: bool,
    ) -> Result<String, PluginError> {
        let template = self
            .env
            .get_template("chat")
            .expect("added at construction");
        let mut context: BTreeMap<String, Value> = self
            .special
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        context.insert("messages".into(), Value::from_serialize(messages));
        context.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        let tools = if tools.is_empty() {
            Value::from(())
        } else {
            Value::from_serialize(
                tools
                    .iter()
                    .map(ToolSchema::to_function)
                    .collect::<Vec<_>>(),
            )
        };
        context.insert("tools".into(), tools);
        context.insert("documents".into(), Value::from(()));
        // bounded: in instructions (fuel) and in what it writes
        let mut out = Bounded(Vec::new());
        match template.render_captured_to(Value::from_iter(context), &mut out) {
            Ok(_) => String::from_utf8(out.0)
                .map_err(|_| failed(format!("rendering {}: not UTF-8", self.origin))),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(failed(format!(
                "rendering {}: it ran {RENDER_FUEL} instructions without ending (a loop \
                 without end?)",
                self.origin
            ))),
            Err(e) if e.kind() == ErrorKind::WriteFailure => Err(failed(format!(
                "rendering {}: it wrote past {} MiB",
                self.origin,
                RENDER_BYTES >> 20
            ))),
            Err(e) => Err(failed(format!("rendering {}: {e:#}", self.origin))),
        }
    }
}

/// The text of a checkpoint's side file at `path` (`tokenizer_config.json`, the chat
/// template...), `None` where there is none: a regular file within
/// [`MAX_JSON_FILE_BYTES`](areal_sdk::resources::MAX_JSON_FILE_BYTES), checked before it is
/// read.
pub(crate) fn read_side_file(path: &Path) -> Result<Option<String>, PluginError> {
    let cannot = |e: &dyn std::fmt::Display| {
        PluginError::failed(crate::NAME, format!("cannot read {}: {e}", path.display()))
    };
    match areal_sdk::resources::read_file(path, areal_sdk::resources::MAX_JSON_FILE_BYTES) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|e| cannot(&e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(cannot(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str) -> String {
        ChatTemplate::new(source, BTreeMap::new())
            .unwrap()
            .render(&[], &[], false)
            .unwrap()
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        // keys in their order, as Python keeps them; no HTML escaping; 2.0 stays a float
        assert_eq!(
            render(r#"{{ {"z": [1, 2.0, "é<>&"], "b": {}, "c": none, "d": true} | tojson }}"#),
            r#"{"z": [1, 2.0, "é<>&"], "b": {}, "c": null, "d": true}"#
        );
        assert_eq!(
            render(r#"{{ {"k": [1]} | tojson(indent=2) }}"#),
            "{\n  \"k\": [\n    1\n  ]\n}"
        );
        // Python's string methods
        assert_eq!(
            render(r#"{{ "  a b  ".strip().split(" ") | tojson }}"#),
            r#"["a", "b"]"#
        );
    }

    #[test]
    fn a_template_that_raises_names_its_message() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}",
            BTreeMap::new(),
        )
        .unwrap();
        let e = t
            .render(&[ChatMessage::new("assistant", "hi")], &[], false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("first must be user"), "{e}");
    }

    /// Rendering is bounded: a template that loops without end, recurses, or writes without
    /// end stops with an error naming it, well within a second's work.
    #[test]
    fn a_template_that_would_not_end_is_stopped_naming_it() {
        let fails = |source: &str| {
            ChatTemplate::new(source, BTreeMap::new())
                .unwrap()
                .named("the chat template /m/chat_template.jinja")
                .render(&[ChatMessage::new("user", "hi")], &[], true)
                .unwrap_err()
                .to_string()
        };
        for looping in [
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% for j in range(100000) %}{% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}",
        ] {
            let e = fails(looping);
            assert!(
                e.contains("the chat template /m/chat_template.jinja")
                    && e.contains("instructions without ending"),
                "{looping}: {e}"
            );
        }
        let e = fails("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
        assert!(e.contains("/m/chat_template.jinja"), "{e}");
        for writing in [
            "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
            "{% for i in range(10) %}{{ 'x' * 10000000 }}{% endfor %}",
        ] {
            let e = fails(writing);
            assert!(e.contains("wrote past 32 MiB"), "{writing}: {e}");
        }
        // a real conversation of many messages is far within the bound
        let long: Vec<ChatMessage> = (0..20_000)
            .map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, "some words"))
            .collect();
        let t = ChatTemplate::new(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}",
            BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(
            t.render(&long, &[], false).unwrap().len(),
            10_000 * (38 + 43)
        );
    }
}
