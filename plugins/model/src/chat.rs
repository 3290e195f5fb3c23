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
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| failed(format!("the chat template does not parse: {e:#}")))?;
        Ok(Self { env, special })
    }

    /// The chat template of the checkpoint folder `dir`, if it has one, with the special
    /// tokens of its `tokenizer_config.json`. The template is `chat_template.jinja` (where
    /// recent transformers save it), else `tokenizer_config.json`'s `chat_template`: a string,
    /// or the entry named `default` of a list of named templates.
    pub fn from_folder(dir: &Path) -> Result<Option<Self>, PluginError> {
        let read = |name: &str| {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(failed(format!("cannot read {}: {e}", path.display()))),
            }
        };
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
        Self::new(&source, special_tokens(&config))
            .map(Some)
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
        template
            .render(Value::from_iter(context))
            .map_err(|e| failed(format!("rendering the chat template: {e:#}")))
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
}
