//! Loading a config: the defaults, a TOML file on top, then `--set key=value` overrides,
//! remembering where each value came from so that every error names it.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{Config, PLUGIN_SECTIONS};

/// Where a config value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default.
    Default,
    /// A config file.
    File(PathBuf),
    /// A `--set key=value` argument.
    Override(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => write!(f, "built-in default"),
            Origin::File(path) => write!(f, "config file {}", path.display()),
            Origin::Override(arg) => write!(f, "--set {arg}"),
        }
    }
}

/// One problem in a config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Dotted key, e.g. `rollout.max_staleness`.
    pub key: String,
    /// Where the offending value came from.
    pub origin: Origin,
    /// What is wrong, naming the value.
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` ({}): {}", self.key, self.origin, self.message)
    }
}

/// Why a config could not be loaded: always the user's to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("config file {} is not valid TOML: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A `--set` argument is malformed.
    #[error("--set {arg}: {message}")]
    Override {
        /// The argument as given.
        arg: String,
        /// What is wrong.
        message: String,
    },
    /// Values are wrong; every problem found is listed.
    #[error("invalid config:\n{}", problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        /// The problems.
        problems: Vec<ConfigProblem>,
    },
}

/// Builds a [`Config`] from the defaults, an optional file and overrides, remembering where
/// each value came from.
#[derive(Clone, Debug)]
pub struct ConfigLoader {
    tree: Value,
    file: Option<(PathBuf, BTreeSet<String>)>,
    overrides: Vec<(String, String)>,
}

impl Default for ConfigLoader {
    fn default() -> Self {
        Self::new()
    }
}

impl ConfigLoader {
    /// Start from the built-in defaults.
    pub fn new() -> Self {
        Self {
            tree: serde_json::to_value(Config::default()).expect("the default config serialises"),
            file: None,
            overrides: Vec::new(),
        }
    }

    /// Merge a TOML file over the current values.
    pub fn file(mut self, path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        self = self.toml(&text, path)?;
        Ok(self)
    }

    /// Merge TOML text over the current values; `path` names it in errors.
    pub fn toml(mut self, text: &str, path: &Path) -> Result<Self, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let value = json_of(toml::Value::Table(table), "").map_err(|(key, message)| {
            ConfigError::Invalid {
                problems: vec![ConfigProblem {
                    key,
                    origin: Origin::File(path.to_owned()),
                    message,
                }],
            }
        })?;
        let mut keys = BTreeSet::new();
        collect_keys(&value, "", &mut keys);
        merge(&mut self.tree, value, "");
        self.file = Some((path.to_owned(), keys));
        Ok(self)
    }

    /// Apply one `key=value` override. The value is read as TOML (`3`, `true`, `"x"`,
    /// `[1, 2]`), and as a plain string if it is not valid TOML.
    pub fn set(mut self, arg: &str) -> Result<Self, ConfigError> {
        let (key, raw) = arg.split_once('=').ok_or_else(|| ConfigError::Override {
            arg: arg.to_owned(),
            message: "expected key=value".into(),
        })?;
        let key = key.trim();
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(ConfigError::Override {
                arg: arg.to_owned(),
                message: format!("`{key}` is not a dotted key like rollout.max_staleness"),
            });
        }
        let value =
            parse_override_value(key, raw.trim()).map_err(|message| ConfigError::Override {
                arg: arg.to_owned(),
                message,
            })?;
        let mut overlay = value;
        for segment in key.rsplit('.') {
            let mut table = Map::new();
            table.insert(segment.to_owned(), overlay);
            overlay = Value::Object(table);
        }
        let mut node = &self.tree;
        for segment in key.split('.').take(key.split('.').count() - 1) {
            match node.get(segment) {
                Some(next) if next.is_object() => node = next,
                Some(other) => {
                    return Err(ConfigError::Override {
                        arg: arg.to_owned(),
                        message: format!("`{segment}` is {other}, not a table"),
                    });
                }
                None => break,
            }
        }
        merge(&mut self.tree, overlay, "");
        self.overrides.push((key.to_owned(), arg.to_owned()));
        Ok(self)
    }

    /// Apply several overrides in order.
    pub fn set_all<I, S>(mut self, args: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for arg in args {
            self = self.set(arg.as_ref())?;
        }
        Ok(self)
    }

    /// Where the value at `key` came from: the last override that covers it, else the file
    /// if it has it, else the defaults.
    pub fn origin(&self, key: &str) -> Origin {
        let covers = |k: &str| {
            key == k || key.starts_with(&format!("{k}.")) || k.starts_with(&format!("{key}."))
        };
        if let Some((_, arg)) = self.overrides.iter().rev().find(|(k, _)| covers(k)) {
            return Origin::Override(arg.clone());
        }
        if let Some((path, keys)) = &self.file
            && keys.iter().any(|k| covers(k))
        {
            return Origin::File(path.clone());
        }
        Origin::Default
    }

    /// Deserialise and validate, reporting every problem with its key and origin.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let config = self.load_unchecked()?;
        let problems = self.problems(&config);
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid { problems })
        }
    }

    /// Deserialise without validating values (types and key names are still checked).
    pub fn load_unchecked(&self) -> Result<Config, ConfigError> {
        serde_path_to_error::deserialize(self.tree.clone()).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Invalid {
                problems: vec![ConfigProblem {
                    origin: self.origin(&key),
                    key,
                    message: e.inner().to_string(),
                }],
            }
        })
    }

    /// Every problem of the engine's own settings in `config`, with origins. Plugin options
    /// are checked when the plugins are built (see
    /// [`problem_from_plugin_error`](Self::problem_from_plugin_error)).
    pub fn problems(&self, config: &Config) -> Vec<ConfigProblem> {
        let mut problems: Vec<ConfigProblem> = config
            .problems()
            .into_iter()
            .map(|(key, message)| ConfigProblem {
                origin: self.origin(&key),
                key,
                message,
            })
            .collect();
        for section in PLUGIN_SECTIONS {
            if let Err(e) = config.plugin(section) {
                problems.push(self.problem_from_plugin_error(&e));
            }
        }
        problems
    }

    /// Turn a plugin's config error into a problem with an origin.
    pub fn problem_from_plugin_error(&self, error: &areal_sdk::PluginError) -> ConfigProblem {
        let key = match error {
            areal_sdk::PluginError::Config { key, .. } => key.clone(),
            areal_sdk::PluginError::UnknownPlugin { key, .. } => key.clone(),
            _ => String::new(),
        };
        let message = match error {
            areal_sdk::PluginError::Config { message, .. } => message.clone(),
            other => other.to_string(),
        };
        ConfigProblem {
            origin: self.origin(&key),
            key,
            message,
        }
    }
}

/// An override's value: TOML if it reads as TOML, else a plain string. An integer past what
/// TOML holds (64-bit signed) is refused, not taken as a string.
fn parse_override_value(key: &str, raw: &str) -> Result<Value, String> {
    match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut table) => json_of(table.remove("v").expect("parsed key"), key)
            .map_err(|(key, message)| format!("`{key}`: {message}")),
        Err(_) => {
            let digits = raw.strip_prefix(['+', '-']).unwrap_or(raw).replace('_', "");
            let integer = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
            let fits = || {
                raw.replace('_', "")
                    .parse::<i128>()
                    .is_ok_and(|v| i64::try_from(v).is_ok())
            };
            if integer && !fits() {
                return Err(format!(
                    "`{key}`: {raw} is out of range: config integers are 64-bit signed, from {} to {}",
                    i64::MIN,
                    i64::MAX
                ));
            }
            Ok(Value::String(raw.to_owned()))
        }
    }
}

/// A TOML value as JSON. A float that is not finite (`nan`, `inf`) has no JSON form and no
/// place in a config: it is refused with its key (`(key, message)`), never turned into null.
fn json_of(value: toml::Value, key: &str) -> Result<Value, (String, String)> {
    Ok(match value {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => match serde_json::Number::from_f64(f) {
            Some(n) => Value::Number(n),
            None => {
                return Err((
                    key.to_owned(),
                    format!("{f} is not a finite number (nan and inf are not allowed)"),
                ));
            }
        },
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| json_of(v, &format!("{key}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(table) => Value::Object(
            table
                .into_iter()
                .map(|(k, v)| {
                    let sub = if key.is_empty() {
                        k.clone()
                    } else {
                        format!("{key}.{k}")
                    };
                    json_of(v, &sub).map(|v| (k, v))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// The dotted keys of the leaves (non-table values) of `value`.
fn collect_keys(value: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                collect_keys(v, &key, out);
            }
        }
        _ => {
            out.insert(prefix.to_owned());
        }
    }
}

/// Merge `overlay` into `base`. Tables merge key by key, except that a plugin section whose
/// `kind` changes is replaced whole (the old plugin's options mean nothing to the new one).
fn merge(base: &mut Value, overlay: Value, path: &str) {
    match (base, overlay) {
        (Value::Object(base), Value::Object(overlay)) => {
            for (k, v) in overlay {
                let key = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let is_plugin = PLUGIN_SECTIONS.contains(&key.as_str());
                match base.get_mut(&k) {
                    Some(existing) if is_plugin && kind_changes(existing, &v) => {
                        *existing = v;
                    }
                    Some(existing) => merge(existing, v, &key),
                    None => {
                        base.insert(k, v);
                    }
                }
            }
        }
        (base, overlay) => *base = overlay,
    }
}

fn kind_changes(existing: &Value, overlay: &Value) -> bool {
    match (existing.get("kind"), overlay.get("kind")) {
        (Some(old), Some(new)) => old != new,
        _ => false,
    }
}
