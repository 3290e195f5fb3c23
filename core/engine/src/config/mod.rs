//! The run configuration: one serde tree, built-in defaults, a TOML file on top, then
//! `--set key=value` overrides; every error names the key, where it came from and the value.

use areal_sdk::PluginConfig;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod bounds;
mod diff;
mod loader;
#[cfg(test)]
mod tests;
mod validate;

pub use diff::{ConfigChange, FIXED_ON_RESUME, ResumeRefusal, config_changes, resume_changes};
pub use loader::{ConfigError, ConfigLoader, ConfigProblem, Origin};

/// The folder a cache setting names: a leading `~/` is the home folder (`$HOME`; without
/// one, the system's temporary folder), anything else as written. The defaults live under
/// `~/.cache/areal-rs/`, anchored there rather than in whatever folder a run starts from, so
/// that no run (a test run from a crate's folder, say) leaves a cache inside a checkout.
pub fn cache_path(dir: &str) -> std::path::PathBuf {
    match dir.strip_prefix("~/") {
        Some(rest) => std::env::var_os("HOME")
            .map_or_else(std::env::temp_dir, std::path::PathBuf::from)
            .join(rest),
        None => std::path::PathBuf::from(dir),
    }
}

/// The plugin sections of the config, in the order they are built.
pub const PLUGIN_SECTIONS: [&str; 6] = [
    "policy",
    "generator",
    "task",
    "reward",
    "algorithm",
    "episode",
];

/// The whole run configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Seed of everything random in the run. By default 1.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Deterministic mode: the same config and seed give the same trained samples and the same
    /// weights, bit for bit, however often the run is killed and resumed. Generation then runs
    /// in rounds of at most `rollout.chunk_tokens` tokens per sample, and the weights change
    /// only between rounds, so that when each token is sampled depends on no clock; nothing is
    /// read from the wall clock (`train.max_seconds` must be 0). Slower than the default,
    /// where generation and training overlap freely. By default false.
    #[serde(default)]
    pub deterministic: bool,
    /// The trainable model (`kind` = a policy plugin). By default a fresh 2-layer
    /// `transformer` with a character tokenizer.
    pub policy: Value,
    /// Sample generation (`kind` = a generator plugin). By default `burn`.
    pub generator: Value,
    /// The prompts (`kind` = a task plugin). By default `chain-sum`.
    pub task: Value,
    /// The reward verifier (`kind` = a reward plugin). By default `chain-sum`.
    pub reward: Value,
    /// The policy-gradient algorithm (`kind` = an algorithm plugin). By default
    /// `decoupled-ppo`.
    pub algorithm: Value,
    /// What the policy does with one prompt (`kind` = an episode plugin): one answer
    /// (`single-turn`, the default) or turns with tools in between (docs/agents.md).
    #[serde(default = "default_episode")]
    pub episode: Value,
    /// The tools episodes may call, each a `[[tools]]` table (`kind` = a tool plugin, with
    /// its options). By default none.
    #[serde(default)]
    pub tools: Vec<Value>,
    /// Sample generation and admission control (the `[rollout]` section).
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
    pub warmup: WarmupConfig,
    /// How a task's prompt becomes the model's input.
    #[serde(default)]
    pub prompt: PromptConfig,
    /// The checkpoint at the end of a run.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
}

/// `[checkpoint]`: the checkpoints a run can be resumed from (`checkpoints/step-N/` of the run
/// folder) and the final model (`checkpoint/`), each written atomically: a crash while one is
/// written leaves the previous one whole.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Write a resume checkpoint every this many RL steps (and at every warm-up evaluation,
    /// when RL starts, and when the run is stopped by a signal); 0 writes none, and such a run
    /// resumes from its start. By default 10.
    pub every: u64,
    /// Keep the newest this many resume checkpoints (at least 1; a damaged newest one falls
    /// back to the one before). By default 3.
    pub keep: usize,
    /// When saving the final model fails (a full disk, say), try again every 10 s for this
    /// many seconds before giving up, so that freeing space saves the trained model; a stop
    /// signal gives up at once. 0 tries once. By default 600.
    pub retry_s: f64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            every: 10,
            keep: 3,
            retry_s: 600.0,
        }
    }
}

fn default_seed() -> u64 {
    1
}

fn plugin(kind: &str) -> Value {
    serde_json::json!({ "kind": kind })
}

fn default_episode() -> Value {
    plugin(areal_sdk::SINGLE_TURN)
}

/// Characters of the built-in task (`chain-sum`), for the default model's tokenizer.
const CHAIN_SUM_ALPHABET: &str = "0123456789=,>abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN";

/// The built-in job: a small transformer learns to add chains of digits step by step —
/// supervised warm-up on imperfect demonstrations to its plateau, then asynchronous RL.
impl Default for Config {
    fn default() -> Self {
        Self {
            seed: default_seed(),
            deterministic: false,
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
            // Naive PPO, the clip anchored at the policy that sampled each token: on this job's
            // stale data it keeps synchronous accuracy where decoupled PPO loses 2.7 points,
            // and it skips the proximal pass (docs/architecture.md, "Where the build departs
            // from DESIGN.md").
            algorithm: plugin("ppo"),
            episode: default_episode(),
            tools: Vec::new(),
            rollout: RolloutConfig::default(),
            reward_service: RewardServiceConfig::default(),
            prompt: PromptConfig::default(),
            train: TrainConfig {
                threads: 1,
                ..TrainConfig::default()
            },
            eval: EvalConfig::default(),
            warmup: WarmupConfig {
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
    /// default 4. This bounds admission, not the lag of what is trained: a group much slower
    /// than its peers (a long tail) is still trained when it ends, and its oldest tokens can
    /// then lag by more than η (η + 1 through remote generators, η + 2 in process were
    /// measured, as in AReaL, whose rule this is). `max_lag` bounds the lag itself.
    pub max_staleness: u64,
    /// A hard bound on the lag of every token trained (the trainer's version minus the
    /// version that sampled it), enforced when the trainer takes its batch; none by default.
    /// What happens to a group past it is `max_lag_policy`'s.
    pub max_lag: Option<u64>,
    /// What `max_lag` does with a group that would be past it: `drop` (the default) leaves
    /// it out of training (its samples count as dropped, another group takes its place, and
    /// generation keeps its pace); `wait` slows generation down instead: it runs at most
    /// `max_lag` versions ahead (η is lowered to it), and the trainer waits for a group
    /// still generating that would otherwise be trained too late, so that it is trained in
    /// this step; what is past the bound all the same is dropped. (verl's
    /// `max_off_policy_threshold` offers the same two.) `withhold` trains the group but
    /// none of the tokens of its samples past the bound: their rewards stay in the group's
    /// baseline (prime-rl's choice), and they count as withheld, not dropped.
    pub max_lag_policy: LagPolicy,
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
    /// In deterministic mode, each round of generation gives every running sample at most
    /// this many tokens; new weights reach the samples between rounds. By default 16.
    pub chunk_tokens: usize,
    /// In deterministic mode, generate everything the staleness rule admits, to its end,
    /// before each batch is taken, as a generator infinitely faster than the trainer would:
    /// in steady state every sample is `max_staleness` versions old. By default false
    /// (generation runs only while a batch is missing: samples about one version old).
    pub generate_ahead: bool,
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
            chunk_tokens: 16,
            generate_ahead: false,
            max_lag: None,
            max_lag_policy: LagPolicy::Drop,
        }
    }
}

/// What `rollout.max_lag` does with a group past it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LagPolicy {
    /// Leave it out of training.
    #[default]
    Drop,
    /// Wait for groups still generating that would otherwise be trained too late.
    Wait,
    /// Train the group, but no token of its samples past the bound (their rewards stay in
    /// the group's baseline).
    Withhold,
}

/// `[reward_service]`: the threads (or processes) verifiers run on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardServiceConfig {
    /// Verifier threads. By default 2.
    pub threads: usize,
    /// Worker processes to verify in (the engine starts them as `areal serve reward` on
    /// loopback, one verifier thread each, and verifies through them as the `remote` reward
    /// does): each has an address space of its own, so sandboxes on different cores do not
    /// slow each other down as threads of one process do; a worker that dies is started again
    /// and its sample sent once more. One per core is the usual choice for code rewards. 0
    /// verifies on `threads` threads of this process. By default 0.
    pub workers: usize,
    /// The program that runs a reward worker, and its first arguments (`serve reward ...` is
    /// appended): by default this program, which must then be `areal` or a binary built on
    /// `areal_cli::main_with`. By default empty.
    pub worker_command: Vec<String>,
    /// Per-sample deadline in milliseconds, which the verifier is told; one that has not
    /// answered a grace after it (a quarter of it, at most a second) costs that sample
    /// (verdict `verifier_timeout`). The `lcb` reward ends a program's tests at the deadline
    /// with that program's `time_limit`. By default 10000.
    pub deadline_ms: u64,
    /// Keep rewards by content (the verifier's identity, the completion, the reference): a
    /// completion graded once is not graded again. Only for verifiers that name their
    /// identity (every built-in and run-time plugin does). By default false.
    pub cache: bool,
    /// Where the cache keeps deterministic rewards across runs (all but time limits measured
    /// in time); `""` keeps them for the run only; a leading `~/` is the home folder
    /// ([`cache_path`]). By default `~/.cache/areal-rs/rewards`.
    pub cache_dir: String,
}

impl Default for RewardServiceConfig {
    fn default() -> Self {
        Self {
            threads: 2,
            workers: 0,
            worker_command: Vec::new(),
            deadline_ms: 10_000,
            cache: false,
            cache_dir: "~/.cache/areal-rs/rewards".into(),
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

/// `[prompt]`: how a task's prompt text becomes the model's input: the same in RL, warm-up
/// and evaluation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PromptConfig {
    /// `text`: the prompt as the task wrote it. `chat`: the prompt as the user's message in
    /// the model's chat format (the chat template of its checkpoint), ending with the opening
    /// of the assistant's turn. By default `text`.
    pub format: PromptFormat,
    /// With `chat`: a system message before the user's. By default none (a template may add
    /// its own, as Qwen2.5's does).
    pub system: Option<String>,
}

/// How a prompt is put to the model (`prompt.format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptFormat {
    /// The task's text as it is.
    #[default]
    Text,
    /// The task's text as a user message in the model's chat format.
    Chat,
}

impl PromptConfig {
    /// The task's `prompt` as chat messages (the system message, then the user's), when
    /// prompts are in the chat format.
    pub fn messages(&self, prompt: &str) -> Option<Vec<areal_sdk::ChatMessage>> {
        match self.format {
            PromptFormat::Text => None,
            PromptFormat::Chat => {
                let mut messages = Vec::with_capacity(2);
                if let Some(system) = &self.system {
                    messages.push(areal_sdk::ChatMessage::new("system", system));
                }
                messages.push(areal_sdk::ChatMessage::new("user", prompt));
                Some(messages)
            }
        }
    }

    /// The text `tokenizer` encodes for the task's `prompt`, the model told of `tools` (which
    /// a chat template renders; the text format does not).
    pub fn render(
        &self,
        tokenizer: &dyn areal_sdk::Tokenizer,
        prompt: &str,
        tools: &[areal_sdk::ToolSchema],
    ) -> Result<String, areal_sdk::PluginError> {
        match self.messages(prompt) {
            None => Ok(prompt.to_owned()),
            Some(messages) => tokenizer.render_chat(&messages, tools, true),
        }
    }
}

/// `[warmup]`: supervised training on the task's demonstrations before RL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmupConfig {
    /// Whether to warm up. By default false (the task must provide demonstrations).
    pub enabled: bool,
    /// Demonstrations per step. By default 32.
    pub batch_size: usize,
    /// AdamW learning rate. By default 0.003.
    pub lr: f64,
    /// Evaluate greedy accuracy on the validation split every this many steps. By default 100.
    pub eval_every: u64,
    /// Stop after this many evaluations in a row that improve neither the validation accuracy
    /// by `min_delta` nor the validation loss by `min_loss_improvement` over the best so far:
    /// the plateau. (Accuracy alone stays flat at 0 while a small model is still learning to
    /// read its prompt; the loss shows that learning goes on.) By default 3.
    pub patience: u32,
    /// Smallest accuracy improvement that counts. By default 0.01.
    pub min_delta: f64,
    /// Smallest relative decrease of the validation loss that counts. By default 0.02.
    pub min_loss_improvement: f64,
    /// Stop here even without a plateau. By default 5000.
    pub max_steps: u64,
    /// Folder of cached warm-ups (one sub-folder per settings hash); empty disables caching;
    /// a leading `~/` is the home folder ([`cache_path`]). By default
    /// `~/.cache/areal-rs/warmup`.
    pub cache_dir: String,
}

impl Default for WarmupConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            batch_size: 32,
            lr: 3e-3,
            eval_every: 100,
            patience: 3,
            min_delta: 0.01,
            min_loss_improvement: 0.02,
            max_steps: 5000,
            cache_dir: "~/.cache/areal-rs/warmup".into(),
        }
    }
}

impl Config {
    /// The plugin section `name` (one of [`PLUGIN_SECTIONS`]; any other name is a config
    /// error naming it and the sections there are).
    pub fn plugin(&self, name: &str) -> Result<PluginConfig, areal_sdk::PluginError> {
        let value = match name {
            "policy" => &self.policy,
            "generator" => &self.generator,
            "task" => &self.task,
            "reward" => &self.reward,
            "algorithm" => &self.algorithm,
            "episode" => &self.episode,
            other => {
                return Err(areal_sdk::PluginError::config(
                    other,
                    format!(
                        "not a plugin section (the plugin sections are {})",
                        PLUGIN_SECTIONS.join(", ")
                    ),
                ));
            }
        };
        PluginConfig::from_value(name, value.clone())
    }

    /// Each `[[tools]]` table as a plugin config (`tools[0]`, `tools[1]`, ...).
    pub fn tool_sections(&self) -> Result<Vec<PluginConfig>, areal_sdk::PluginError> {
        self.tools
            .iter()
            .enumerate()
            .map(|(i, value)| PluginConfig::from_value(&format!("tools[{i}]"), value.clone()))
            .collect()
    }

    /// The config as TOML, as written to a run folder.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a config always serialises to TOML")
    }
}
