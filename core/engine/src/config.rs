//! The run configuration: one serde tree, built-in defaults, a TOML file on top, then
//! `--set key=value` overrides; every error names the key, where it came from and the value.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use areal_sdk::PluginConfig;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The plugin sections of the config, in the order they are built.
pub const PLUGIN_SECTIONS: [&str; 5] = ["policy", "generator", "task", "reward", "algorithm"];

/// The whole run configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Seed of everything random in the run. By default 1.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// The trainable model (`kind` = a policy plugin). By default a fresh 2-layer
    /// `transformer` with a character tokenizer.
    pub policy: Value,
    /// Rollout generation (`kind` = a generator plugin). By default `burn`.
    pub generator: Value,
    /// The prompts (`kind` = a task plugin). By default `chain-sum`.
    pub task: Value,
    /// The reward verifier (`kind` = a reward plugin). By default `chain-sum`.
    pub reward: Value,
    /// The policy-gradient algorithm (`kind` = an algorithm plugin). By default
    /// `decoupled-ppo`.
    pub algorithm: Value,
    /// Rollout generation and admission control.
    #[serde(default)]
    pub rollout: RolloutConfig,
    /// The reward service.
    #[serde(default)]
    pub reward_service: RewardServiceConfig,
    /// The trainer.
    #[serde(default)]
    pub train: TrainConfig,
    /// Held-out evaluation.
    #[serde(default)]
    pub eval: EvalConfig,
    /// Supervised warm-up before RL.
    #[serde(default)]
    pub warmup: crate::warmup::WarmupConfig,
    /// The checkpoint at the end of a run.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
}

/// `[checkpoint]`: how the final checkpoint is saved (into `checkpoint/` of the run folder,
/// atomically: a failed save leaves nothing half-written).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// When saving fails (a full disk, say), try again every 10 s for this many seconds
    /// before giving up, so that freeing space saves the trained model; a stop signal gives
    /// up at once. 0 tries once. By default 600.
    pub retry_s: f64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self { retry_s: 600.0 }
    }
}

fn default_seed() -> u64 {
    1
}

fn plugin(kind: &str) -> Value {
    serde_json::json!({ "kind": kind })
}

/// Characters of the built-in task (`chain-sum`), for the default model's tokenizer.
const CHAIN_SUM_ALPHABET: &str = "0123456789=,>abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN";

/// The built-in job: a small transformer learns to add chains of digits step by step —
/// supervised warm-up on imperfect demonstrations to its plateau, then asynchronous RL.
impl Default for Config {
    fn default() -> Self {
        Self {
            seed: default_seed(),
            policy: serde_json::json!({
                "kind": "transformer",
                "alphabet": CHAIN_SUM_ALPHABET,
                "hidden_size": 64,
                "layers": 2,
                "heads": 4,
                "kv_heads": 2,
                "max_positions": 128,
            }),
            // One thread per side: generation and training overlap on the 2 cores of a small
            // machine without queueing behind each other, and this model gains nothing from a
            // second thread (docs/benchmarks.md).
            generator: serde_json::json!({ "kind": "burn", "max_batch": 64, "threads": 1 }),
            task: plugin("chain-sum"),
            reward: plugin("chain-sum"),
            algorithm: plugin("decoupled-ppo"),
            rollout: RolloutConfig::default(),
            reward_service: RewardServiceConfig::default(),
            train: TrainConfig {
                threads: 1,
                ..TrainConfig::default()
            },
            eval: EvalConfig::default(),
            warmup: crate::warmup::WarmupConfig {
                enabled: true,
                ..Default::default()
            },
            checkpoint: CheckpointConfig::default(),
        }
    }
}

/// `[rollout]`: what is generated and how far generation may run ahead of training.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// B: prompts (groups) per training step. By default 8.
    pub batch_size: usize,
    /// n: samples generated per prompt. By default 8.
    pub group_size: usize,
    /// η: how many policy versions generation may run ahead of training; 0 is synchronous RL.
    /// A rollout starts only while `accepted + running + 1 ≤ (η + version + 1) · B`. By
    /// default 4.
    pub max_staleness: u64,
    /// Most groups generating at once. By default 16.
    pub max_concurrent: usize,
    /// Most tokens generated per sample. By default 80.
    pub max_new_tokens: usize,
    /// Sampling temperature (must be positive: the loss needs the sampling distribution). By
    /// default 1.
    pub temperature: f32,
    /// Nucleus sampling threshold in (0, 1]. By default 1.
    pub top_p: f32,
    /// Abort the run after this many groups in a row fail to generate. By default 32.
    pub max_consecutive_failures: usize,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            batch_size: 8,
            group_size: 8,
            max_staleness: 4,
            max_concurrent: 16,
            max_new_tokens: 80,
            temperature: 1.0,
            top_p: 1.0,
            max_consecutive_failures: 32,
        }
    }
}

/// `[reward_service]`: the threads verifiers run on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardServiceConfig {
    /// Verifier threads. By default 2.
    pub threads: usize,
    /// Per-sample deadline in milliseconds; a verifier that has not answered by then costs
    /// that sample (verdict `verifier_timeout`). By default 10000.
    pub deadline_ms: u64,
}

impl Default for RewardServiceConfig {
    fn default() -> Self {
        Self {
            threads: 2,
            deadline_ms: 10_000,
        }
    }
}

/// `[train]`: the trainer loop and optimizer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Training steps; each consumes `rollout.batch_size` groups and produces one policy
    /// version. By default 300.
    pub steps: u64,
    /// Stop after the step that ends past this many seconds of RL (warm-up and the baseline
    /// evaluation not counted), with the final evaluation and checkpoint as usual; 0 means no
    /// limit. By default 0.
    pub max_seconds: f64,
    /// AdamW learning rate. By default 0.0002.
    pub lr: f64,
    /// AdamW weight decay. By default 0.
    pub weight_decay: f64,
    /// AdamW β1. By default 0.9.
    pub beta1: f64,
    /// AdamW β2. By default 0.999.
    pub beta2: f64,
    /// Clip the gradient to this global L2 norm; 0 disables clipping. By default 1.
    pub max_grad_norm: f64,
    /// Optimizer steps per training batch (PPO mini-batches); the policy version advances
    /// once per batch, after all of them, and π_prox is the weights before the first. By
    /// default 1.
    pub minibatches: usize,
    /// Token budget of one packed micro-batch (forward/backward pass). By default 4096.
    pub token_budget: usize,
    /// At least this many micro-batches per mini-batch. By default 1.
    pub min_microbatches: usize,
    /// Device: `cpu`, or `cuda:N` when built with the `cuda` feature. By default `cpu`.
    pub device: String,
    /// Threads the trainer computes on (CPU), in a pool of its own, so that training and
    /// generation do not fight over the same cores; 0 shares the process-wide pool (as many
    /// threads as cores). 0 by default; 1 in the built-in job.
    pub threads: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            steps: 300,
            max_seconds: 0.0,
            lr: 2e-4,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            max_grad_norm: 1.0,
            minibatches: 1,
            token_budget: 4096,
            min_microbatches: 1,
            device: "cpu".into(),
            threads: 0,
        }
    }
}

/// `[eval]`: greedy evaluation on the task's held-out split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Evaluate before training, every `every` steps and after the last; 0 evaluates only
    /// before and after. By default 50.
    pub every: u64,
    /// Evaluate at most this many held-out items; 0 means all. By default 0.
    pub max_items: usize,
    /// Whether to evaluate at all. By default true.
    pub enabled: bool,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            every: 50,
            max_items: 0,
            enabled: true,
        }
    }
}

/// Bounds of the engine's settings, checked by [`Config::problems`]: generous for real runs,
/// finite so that no product wraps and no setting asks for more than a machine has.
pub mod bounds {
    /// Most prompts per training step (`rollout.batch_size`).
    pub const MAX_BATCH_SIZE: usize = 1 << 20;
    /// Most samples per prompt (`rollout.group_size`).
    pub const MAX_GROUP_SIZE: usize = 1 << 16;
    /// Most samples per step, `rollout.batch_size × rollout.group_size`.
    pub const MAX_SAMPLES_PER_STEP: u128 = 1 << 24;
    /// Most groups generating at once (`rollout.max_concurrent`).
    pub const MAX_CONCURRENT: usize = 1 << 20;
    /// Most tokens generated per sample (`rollout.max_new_tokens`).
    pub const MAX_NEW_TOKENS: usize = 1 << 20;
    /// Most verifier threads (`reward_service.threads`).
    pub const MAX_REWARD_THREADS: usize = 1024;
    /// Longest per-sample verification deadline (`reward_service.deadline_ms`): a day.
    pub const MAX_DEADLINE_MS: u64 = 86_400_000;
    /// Largest packed micro-batch (`train.token_budget`), in tokens.
    pub const MAX_TOKEN_BUDGET: usize = 1 << 24;
    /// Largest warm-up batch (`warmup.batch_size`), in demonstrations.
    pub const MAX_WARMUP_BATCH: usize = 1 << 16;
    /// Largest seed: config files are TOML, whose integers are 64-bit signed.
    pub const MAX_SEED: u64 = i64::MAX as u64;
    /// Bytes held per generated token, for the memory estimate: its id, behaviour logprob and
    /// policy version while it waits, and the trainer's per-token arrays (current, proximal
    /// and behaviour logprobs, advantages, masks) while it is trained on.
    pub const BYTES_PER_TOKEN: u128 = 64;
}

impl Config {
    /// The most rollout data a run holds at once, in bytes: [`Config::rollout_groups_held`]
    /// groups of `group_size` samples of up to `max_new_tokens` tokens, at
    /// [`bounds::BYTES_PER_TOKEN`] each. Saturates instead of wrapping.
    pub fn rollout_memory_estimate(&self) -> u128 {
        let r = &self.rollout;
        self.rollout_groups_held()
            .saturating_mul(r.group_size as u128)
            .saturating_mul(r.max_new_tokens as u128)
            .saturating_mul(bounds::BYTES_PER_TOKEN)
    }

    /// The most groups a run holds at once: `(min(η, steps) + 2) · B + max_concurrent` (up to
    /// `min(η, steps) + 1` batches accepted ahead of training, the batch being trained, and
    /// the groups generating).
    pub fn rollout_groups_held(&self) -> u128 {
        let r = &self.rollout;
        (u128::from(r.max_staleness.min(self.train.steps)) + 2)
            .saturating_mul(r.batch_size as u128)
            .saturating_add(r.max_concurrent as u128)
    }

    /// The plugin section `name` (one of [`PLUGIN_SECTIONS`]).
    pub fn plugin(&self, name: &str) -> Result<PluginConfig, areal_sdk::PluginError> {
        let value = match name {
            "policy" => &self.policy,
            "generator" => &self.generator,
            "task" => &self.task,
            "reward" => &self.reward,
            "algorithm" => &self.algorithm,
            other => panic!("{other} is not a plugin section"),
        };
        PluginConfig::from_value(name, value.clone())
    }

    /// Check the engine's own settings; returns every problem as (key, message).
    pub fn problems(&self) -> Vec<(String, String)> {
        use bounds::*;
        let mut p = Problems::default();
        p.check(self.seed <= MAX_SEED, "seed", || {
            format!(
                "{} is past the largest seed, {MAX_SEED} (2^63 − 1: config files are TOML, whose integers are 64-bit signed)",
                self.seed
            )
        });
        let r = &self.rollout;
        let before = p.0.len();
        p.in_range("rollout.batch_size", r.batch_size, MAX_BATCH_SIZE);
        p.in_range("rollout.group_size", r.group_size, MAX_GROUP_SIZE);
        p.in_range("rollout.max_concurrent", r.max_concurrent, MAX_CONCURRENT);
        p.in_range("rollout.max_new_tokens", r.max_new_tokens, MAX_NEW_TOKENS);
        let per_step = r.batch_size as u128 * r.group_size as u128;
        // Products and the memory estimate only once each size is within its own bound (a
        // size past it is reported once, above).
        let sizes_ok = p.0.len() == before;
        p.check(
            !sizes_ok || per_step <= MAX_SAMPLES_PER_STEP,
            "rollout.group_size",
            || {
                format!(
                    "{} prompts (rollout.batch_size) × {} samples = {per_step} samples per step is past the most, {MAX_SAMPLES_PER_STEP}",
                    r.batch_size, r.group_size
                )
            },
        );
        let fits = || {
            areal_sdk::resources::check_memory(
                &format!(
                    "rollout data (up to {} groups of {} samples of up to {} tokens held at once: (min(rollout.max_staleness, train.steps) + 2) × rollout.batch_size + rollout.max_concurrent)",
                    self.rollout_groups_held(),
                    r.group_size,
                    r.max_new_tokens
                ),
                self.rollout_memory_estimate(),
            )
        };
        if sizes_ok && let Err(message) = fits() {
            p.0.push(("rollout".into(), message));
        }
        p.at_least_one(
            "rollout.max_consecutive_failures",
            r.max_consecutive_failures as u64,
        );
        p.check(
            r.temperature > 0.0 && r.temperature.is_finite(),
            "rollout.temperature",
            || {
                format!(
                    "must be positive (training needs the sampling distribution), found {}",
                    r.temperature
                )
            },
        );
        p.check(r.top_p > 0.0 && r.top_p <= 1.0, "rollout.top_p", || {
            format!("must be in (0, 1], found {}", r.top_p)
        });
        let s = &self.reward_service;
        p.in_range("reward_service.threads", s.threads, MAX_REWARD_THREADS);
        p.check(
            (1..=MAX_DEADLINE_MS).contains(&s.deadline_ms),
            "reward_service.deadline_ms",
            || {
                format!(
                    "must be between 1 and {MAX_DEADLINE_MS} (a day), found {}",
                    s.deadline_ms
                )
            },
        );
        let t = &self.train;
        p.at_least_one("train.steps", t.steps);
        p.check(t.lr > 0.0 && t.lr.is_finite(), "train.lr", || {
            format!("must be positive, found {}", t.lr)
        });
        p.non_negative("train.weight_decay", t.weight_decay);
        p.non_negative("train.max_grad_norm", t.max_grad_norm);
        p.non_negative("train.max_seconds", t.max_seconds);
        for (key, beta) in [("train.beta1", t.beta1), ("train.beta2", t.beta2)] {
            p.check((0.0..1.0).contains(&beta), key, || {
                format!("must be in [0, 1), found {beta}")
            });
        }
        p.at_least_one("train.minibatches", t.minibatches as u64);
        p.check(
            t.minibatches as u128 <= per_step.max(1),
            "train.minibatches",
            || {
                format!(
                    "{} mini-batches cannot be cut from {per_step} samples (rollout.batch_size × rollout.group_size)",
                    t.minibatches
                )
            },
        );
        p.in_range("train.token_budget", t.token_budget, MAX_TOKEN_BUDGET);
        if let Err(message) = areal_sdk::resources::check_threads(t.threads) {
            p.0.push(("train.threads".into(), message));
        }
        p.at_least_one("train.min_microbatches", t.min_microbatches as u64);
        if let Err(message) = crate::device::parse_device(&t.device) {
            p.0.push(("train.device".into(), message));
        }
        let retry = self.checkpoint.retry_s;
        p.check(
            (0.0..=MAX_DEADLINE_MS as f64 / 1e3).contains(&retry),
            "checkpoint.retry_s",
            || format!("must be between 0 and 86400 seconds, found {retry}"),
        );
        p.0.extend(self.warmup.problems());
        p.0
    }

    /// The config as TOML, as written to a run folder.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a config always serialises to TOML")
    }
}

/// Collects (key, message) problems.
#[derive(Default)]
struct Problems(Vec<(String, String)>);

impl Problems {
    fn check(&mut self, ok: bool, key: &str, message: impl FnOnce() -> String) {
        if !ok {
            self.0.push((key.to_owned(), message()));
        }
    }

    fn at_least_one(&mut self, key: &str, value: u64) {
        self.check(value >= 1, key, || {
            format!("must be at least 1, found {value}")
        });
    }

    fn in_range(&mut self, key: &str, value: usize, max: usize) {
        self.check((1..=max).contains(&value), key, || {
            format!("must be between 1 and {max}, found {value}")
        });
    }

    fn non_negative(&mut self, key: &str, value: f64) {
        self.check(value >= 0.0, key, || {
            format!("must not be negative, found {value}")
        });
    }
}

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

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_through_toml() {
        let config = ConfigLoader::new().load().unwrap();
        assert_eq!(config, Config::default());
        let text = config.to_toml();
        let again = ConfigLoader::new()
            .toml(&text, Path::new("resolved.toml"))
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(again, config);
    }

    #[test]
    fn file_then_overrides() {
        let file =
            "seed = 7\n[rollout]\nmax_staleness = 2\n[algorithm]\nkind = \"ppo\"\neps_clip = 0.3\n";
        let loader = ConfigLoader::new()
            .toml(file, Path::new("run.toml"))
            .unwrap()
            .set_all([
                "rollout.max_staleness=0",
                "rollout.group_size=2",
                "task.max_terms=6",
            ])
            .unwrap();
        let c = loader.load().unwrap();
        assert_eq!(c.seed, 7);
        assert_eq!(c.rollout.max_staleness, 0);
        assert_eq!(c.rollout.group_size, 2);
        assert_eq!(c.rollout.batch_size, 8);
        assert_eq!(
            c.algorithm,
            serde_json::json!({"kind": "ppo", "eps_clip": 0.3})
        );
        assert_eq!(
            c.task,
            serde_json::json!({"kind": "chain-sum", "max_terms": 6})
        );
        assert_eq!(
            loader.origin("rollout.max_staleness"),
            Origin::Override("rollout.max_staleness=0".into())
        );
        assert_eq!(loader.origin("seed"), Origin::File("run.toml".into()));
        assert_eq!(loader.origin("train.lr"), Origin::Default);
        assert_eq!(
            loader.origin("rollout.batch_size"),
            Origin::Default,
            "the file sets another key of [rollout]"
        );
        assert_eq!(
            loader.origin("algorithm.eps_clip"),
            Origin::File("run.toml".into())
        );
    }

    #[test]
    fn changing_a_plugin_kind_drops_the_old_options() {
        let file = "[algorithm]\nkind = \"ppo\"\neps_clip = 0.3\n";
        let c = ConfigLoader::new()
            .toml(file, Path::new("run.toml"))
            .unwrap()
            .set("algorithm.kind=decoupled-ppo")
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(c.algorithm, serde_json::json!({"kind": "decoupled-ppo"}));
        // the default transformer's options do not follow a switch to another model
        let c = ConfigLoader::new()
            .set("policy.kind=testkit-bigram")
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(c.policy, serde_json::json!({"kind": "testkit-bigram"}));
    }

    fn problems(e: ConfigError) -> Vec<ConfigProblem> {
        match e {
            ConfigError::Invalid { problems } => problems,
            other => panic!("expected invalid config, got {other}"),
        }
    }

    #[test]
    fn errors_name_key_origin_and_value() {
        let e = ConfigLoader::new()
            .set("rollout.max_staleness=abc")
            .unwrap()
            .load()
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("`rollout.max_staleness`"), "{text}");
        assert!(text.contains("--set rollout.max_staleness=abc"), "{text}");
        assert!(text.contains("\"abc\""), "{text}");

        let e = ConfigLoader::new()
            .toml("[rollout]\nmax_stalenes = 3\n", Path::new("my.toml"))
            .unwrap()
            .load()
            .unwrap_err();
        let p = problems(e);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].key, "rollout.max_stalenes");
        assert_eq!(p[0].origin, Origin::File("my.toml".into()));
        assert!(p[0].message.contains("unknown field"), "{}", p[0].message);

        let e = ConfigLoader::new()
            .toml("[rollout\n", Path::new("bad.toml"))
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("bad.toml") && text.contains("line 1"),
            "{text}"
        );

        let e = ConfigLoader::new().set("rollout").unwrap_err();
        assert!(e.to_string().contains("key=value"), "{e}");
    }

    #[test]
    fn every_validation_problem_is_reported() {
        let e = ConfigLoader::new()
            .set_all([
                "rollout.batch_size=0",
                "train.lr=-1",
                "rollout.top_p=1.5",
                "train.device=tpu",
            ])
            .unwrap()
            .load()
            .unwrap_err();
        let keys: Vec<String> = problems(e).into_iter().map(|p| p.key).collect();
        for k in [
            "rollout.batch_size",
            "train.lr",
            "rollout.top_p",
            "train.device",
        ] {
            assert!(keys.contains(&k.to_owned()), "{k} missing from {keys:?}");
        }
    }

    #[test]
    fn non_finite_numbers_and_huge_integers_are_named_not_mangled() {
        // nan and inf once became `null` ("invalid type: null"); a seed past 2^63 a "string".
        for value in ["nan", "inf", "-inf", "+nan"] {
            let e = ConfigLoader::new()
                .set(&format!("train.lr={value}"))
                .unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("`train.lr`") && text.contains("not a finite number"),
                "{value}: {text}"
            );
        }
        let e = ConfigLoader::new()
            .toml("[train]\nlr = nan\n", Path::new("nan.toml"))
            .unwrap_err();
        let p = problems(e);
        assert_eq!(p[0].key, "train.lr");
        assert_eq!(p[0].origin, Origin::File("nan.toml".into()));
        let e = ConfigLoader::new()
            .toml(
                "[algorithm]\nkind = \"ppo\"\nweights = [1.0, inf]\n",
                Path::new("a.toml"),
            )
            .unwrap_err();
        assert_eq!(problems(e)[0].key, "algorithm.weights[1]");
        for seed in [
            "9223372036854775808",
            "18446744073709551615",
            "-9223372036854775809",
        ] {
            let text = ConfigLoader::new()
                .set(&format!("seed={seed}"))
                .unwrap_err()
                .to_string();
            assert!(
                text.contains("`seed`")
                    && text.contains("out of range")
                    && !text.contains("string"),
                "{text}"
            );
        }
        let c = ConfigLoader::new()
            .set("seed=9223372036854775807")
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(c.seed, i64::MAX as u64);
        assert!(c.to_toml().contains("seed = 9223372036854775807"));
        let c = Config {
            seed: u64::MAX,
            ..Config::default()
        };
        assert!(
            c.problems()
                .iter()
                .any(|(k, m)| k == "seed" && m.contains("2^63"))
        );
    }

    #[test]
    fn sizes_are_bounded_and_products_never_wrap() {
        let keys = |overrides: &[&str]| -> Vec<String> {
            let loader = ConfigLoader::new().set_all(overrides).unwrap();
            match loader.load() {
                Ok(_) => Vec::new(),
                Err(e) => problems(e).into_iter().map(|p| p.key).collect(),
            }
        };
        // 2^62 samples per prompt once wrapped batch × group and was OOM-killed at 23.8 GB.
        assert!(
            keys(&["rollout.group_size=4611686018427387904"])
                .contains(&"rollout.group_size".to_owned())
        );
        assert!(
            keys(&["rollout.batch_size=1000000000000"]).contains(&"rollout.batch_size".to_owned())
        );
        assert!(
            keys(&["rollout.max_new_tokens=1000000000"])
                .contains(&"rollout.max_new_tokens".to_owned())
        );
        // Each within its own bound, together past what a machine holds: the estimate says so.
        if areal_sdk::resources::total_memory().is_some() {
            let k = keys(&[
                "rollout.batch_size=65536",
                "rollout.group_size=256",
                "rollout.max_new_tokens=65536",
            ]);
            assert_eq!(k, ["rollout"]);
            let e = ConfigLoader::new()
                .set_all([
                    "rollout.batch_size=65536",
                    "rollout.group_size=256",
                    "rollout.max_new_tokens=65536",
                ])
                .unwrap()
                .load()
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("needs about") && e.contains("this machine has"),
                "{e}"
            );
        }
        // The largest staleness is fine: the buffer is bounded by the steps.
        assert!(keys(&["rollout.max_staleness=9223372036854775807"]).is_empty());
        assert!(keys(&["train.threads=100000"]).contains(&"train.threads".to_owned()));
        assert!(
            keys(&["reward_service.deadline_ms=0"])
                .contains(&"reward_service.deadline_ms".to_owned())
        );
        assert!(keys(&[]).is_empty(), "the defaults are within every bound");
    }

    #[test]
    fn plugin_sections_must_be_tables() {
        let e = ConfigLoader::new()
            .toml("reward = \"math\"\n", Path::new("r.toml"))
            .unwrap()
            .load()
            .unwrap_err();
        let p = problems(e);
        assert_eq!(p[0].key, "reward");
        assert_eq!(p[0].origin, Origin::File("r.toml".into()));
        assert!(p[0].message.contains("kind"), "{}", p[0].message);
    }
}
