//! Plugin config sections and the context plugins are built with.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::PluginError;

/// One plugin section of the run config: a table `{ kind = "name", ... }`.
///
/// The plugin deserialises the rest of the table itself with [`PluginConfig::parse`]; errors
/// name the full key (`generator.top_p`), so a plugin's options read like the engine's own.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginConfig {
    path: String,
    kind: String,
    params: Map<String, Value>,
}

impl PluginConfig {
    /// A section found at `path` (e.g. `"reward"`) whose value is `value`.
    pub fn from_value(path: &str, value: Value) -> Result<Self, PluginError> {
        let Value::Object(mut params) = value else {
            return Err(PluginError::config(
                path,
                format!("expected a table like {{ kind = \"...\" }}, found {value}"),
            ));
        };
        let kind = match params.remove("kind") {
            Some(Value::String(kind)) => kind,
            Some(other) => {
                return Err(PluginError::config(
                    format!("{path}.kind"),
                    format!("expected a plugin name (a string), found {other}"),
                ));
            }
            None => {
                return Err(PluginError::config(
                    format!("{path}.kind"),
                    "missing: every plugin section names its plugin with `kind`",
                ));
            }
        };
        Ok(Self {
            path: path.to_owned(),
            kind,
            params,
        })
    }

    /// A section with `kind` and no options, at `path`.
    pub fn new(path: &str, kind: &str) -> Self {
        Self {
            path: path.to_owned(),
            kind: kind.to_owned(),
            params: Map::new(),
        }
    }

    /// Set an option (builder style, for tests and programmatic configs).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.params.insert(key.to_owned(), value.into());
        self
    }

    /// The registered plugin name this section asks for.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Dotted path of the section in the run config.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// An error for option `name` of this section: the key is named in full
    /// (`generator.jitter`), so `message` only says what is wrong with the value.
    pub fn invalid(&self, name: &str, message: impl Into<String>) -> PluginError {
        PluginError::config(format!("{}.{name}", self.path), message)
    }

    /// The options, without `kind`.
    pub fn params(&self) -> &Map<String, Value> {
        &self.params
    }

    /// The whole section as a value, `kind` included.
    pub fn to_value(&self) -> Value {
        let mut table = Map::new();
        table.insert("kind".into(), Value::String(self.kind.clone()));
        table.extend(self.params.clone());
        Value::Object(table)
    }

    /// Check that the section has no options besides `kind` (for plugins that take none): an
    /// option given anyway is an error naming its key.
    pub fn no_options(&self) -> Result<(), PluginError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct NoOptions {}
        self.parse::<NoOptions>().map(|_| ())
    }

    /// Deserialise the options into the plugin's own config type.
    ///
    /// Use `#[serde(deny_unknown_fields)]` on `T` so a misspelt option is an error, and
    /// `#[serde(default)]` for options that have one.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, PluginError> {
        let value = Value::Object(self.params.clone());
        serde_path_to_error::deserialize(value).map_err(|error| {
            let mut key = self.path.clone();
            for segment in error.path().iter() {
                key.push('.');
                key.push_str(&segment.to_string());
            }
            PluginError::config(key, error.inner().to_string())
        })
    }
}

/// What the engine tells a plugin when it builds it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct BuildContext {
    /// Seed of the run; a plugin derives its own random streams from it.
    pub seed: u64,
    /// Threads the plugin may use for its own work.
    pub threads: usize,
    /// The most tokens a rollout may generate (`rollout.max_new_tokens`), when the engine
    /// knows it: algorithms derive length-based defaults from it (DAPO's overlong penalty,
    /// Dr. GRPO's normaliser).
    pub max_new_tokens: Option<usize>,
}

impl BuildContext {
    /// A context with `seed` and `threads`.
    pub fn new(seed: u64, threads: usize) -> Self {
        Self {
            seed,
            threads: threads.max(1),
            max_new_tokens: None,
        }
    }

    /// With the generation length limit.
    pub fn with_max_new_tokens(mut self, max_new_tokens: usize) -> Self {
        self.max_new_tokens = Some(max_new_tokens);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "the fields are read only by serde")]
    struct Opts {
        #[serde(default)]
        top_p: f32,
        inner: Option<Inner>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "the fields are read only by serde")]
    struct Inner {
        depth: u32,
    }

    #[test]
    fn errors_name_the_full_key_and_value() {
        let cfg =
            PluginConfig::from_value("generator", json!({"kind": "x", "top_p": "high"})).unwrap();
        let err = cfg.parse::<Opts>().unwrap_err().to_string();
        assert!(err.contains("`generator.top_p`"), "{err}");
        assert!(err.contains("\"high\""), "{err}");

        let cfg = PluginConfig::from_value("generator", json!({"kind": "x", "inner": {"dpth": 3}}))
            .unwrap();
        let err = cfg.parse::<Opts>().unwrap_err().to_string();
        assert!(err.contains("`generator.inner.dpth`"), "{err}");

        let cfg = PluginConfig::from_value("generator", json!({"kind": "x", "topp": 1})).unwrap();
        let err = cfg.parse::<Opts>().unwrap_err().to_string();
        assert!(err.contains("`generator.topp`"), "{err}");

        let cfg =
            PluginConfig::from_value("generator", json!({"kind": "x", "inner": {"depth": -3}}))
                .unwrap();
        let err = cfg.parse::<Opts>().unwrap_err().to_string();
        assert!(
            err.contains("`generator.inner.depth`") && err.contains("-3"),
            "{err}"
        );
    }

    #[test]
    fn kind_is_required_and_a_string() {
        let err = PluginConfig::from_value("reward", json!({"threads": 2})).unwrap_err();
        assert!(err.to_string().contains("`reward.kind`"), "{err}");
        let err = PluginConfig::from_value("reward", json!({"kind": 3})).unwrap_err();
        assert!(err.to_string().contains("found 3"), "{err}");
        let err = PluginConfig::from_value("reward", json!("math")).unwrap_err();
        assert!(err.to_string().contains("`reward`"), "{err}");
    }
}
