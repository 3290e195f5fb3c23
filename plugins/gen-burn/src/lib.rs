//! The in-process generator of areal-rs on the burn transformer (`areal-model`).
//!
//! One decoding thread owns the model and a key/value cache with a row per sequence.
//! Continuous batching: every step feeds one token of every running sequence; a finished
//! sequence leaves at once and a waiting one is prefilled into the freed row. Interruptible:
//! `pause` (and any weight update) returns every running sequence with what it has and
//! [`FinishReason::Interrupted`](areal_sdk::FinishReason::Interrupted); the engine resubmits
//! them as prompt + partial output, recomputing the prefix with the new weights, so every
//! token keeps the logprob and version of the policy that sampled it.
//!
//! Registered as the `burn` generator:
//!
//! ```toml
//! [generator]
//! kind = "burn"
//! max_batch = 32   # sequences decoded together
//! threads = 1      # cores it computes on (0: share the process-wide pool)
//! ```

mod worker;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use areal_sdk::{
    BuildContext, Completion, GenerateRequest, Generator, GeneratorStats, PluginConfig,
    PluginError, WeightUpdate, register_generator,
};
use burn::tensor::Device;
use serde::Deserialize;
use tokio::sync::oneshot;

pub use crate::worker::AdapterMode;
use crate::worker::{Command, Stats, Worker};

/// Options of the `burn` generator.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BurnGeneratorOptions {
    /// Sequences decoded together (rows of the cache). By default 32.
    pub max_batch: usize,
    /// Context length of the cache; by default the model's `max_position_embeddings`.
    pub max_len: Option<usize>,
    /// Where to decode: `cpu` (burn's flex backend) or `cuda:N` (a build with the `cuda`
    /// feature). By default `cpu`.
    pub device: String,
    /// Threads the CPU backend computes on, in a pool of the generator's own, so that
    /// generation and training do not fight over the same cores. 0 shares the process-wide
    /// pool (as many threads as cores). By default 0.
    pub threads: usize,
    /// How an adapter the policy trains (`[policy.lora]`) is applied: `merged` into the
    /// weights once per version, or `unmerged`, beside them at every step. By default
    /// `merged` (faster here: `docs/benchmarks.md`).
    pub adapters: AdapterMode,
}

impl Default for BurnGeneratorOptions {
    fn default() -> Self {
        Self {
            max_batch: 32,
            max_len: None,
            device: "cpu".into(),
            threads: 0,
            adapters: AdapterMode::Merged,
        }
    }
}

/// Decoding statistics since the generator started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Batched decoding steps.
    pub steps: u64,
    /// Tokens generated (prefill samples included).
    pub tokens: u64,
    /// Most sequences decoded in one step.
    pub max_active: usize,
}

/// The generator: a handle to its decoding thread.
pub struct BurnGenerator {
    commands: Mutex<mpsc::Sender<Command>>,
    stats: Arc<Mutex<Stats>>,
}

fn failed_to_start(e: &std::io::Error) -> PluginError {
    PluginError::failed(NAME, format!("cannot start the decoding thread: {e}"))
}

fn gone() -> PluginError {
    PluginError::failed(
        NAME,
        "the decoding thread dropped the request: it has stopped, or a forward pass failed (its log says why)",
    )
}

impl BurnGenerator {
    /// Start a generator on `device` (a plain device: no autodiff).
    pub fn new(options: &BurnGeneratorOptions, device: Device) -> Result<Self, PluginError> {
        let worker = Worker::new(
            device,
            options.adapters,
            options.max_batch.max(1),
            options.max_len,
        );
        let stats = worker.stats.clone();
        let (tx, rx) = mpsc::channel();
        let spawned = if options.threads == 0 {
            std::thread::Builder::new()
                .name("areal-gen-burn".into())
                .spawn(move || worker.run(rx))
                .map(drop)
        } else {
            // The decoding loop runs on one of the pool's threads, so the backend's parallel
            // work stays inside the pool; the pool ends when the loop does.
            rayon::ThreadPoolBuilder::new()
                .num_threads(options.threads)
                .thread_name(|i| format!("areal-gen-burn-{i}"))
                // a panic ends the decoding loop (callers then see "stopped"), not the process
                .panic_handler(
                    |_| tracing::error!(target: "areal::gen_burn", "the decoding thread panicked"),
                )
                .build()
                .map(|pool| pool.spawn(move || worker.run(rx)))
                .map_err(std::io::Error::other)
        };
        spawned.map_err(|e| failed_to_start(&e))?;
        Ok(Self {
            commands: Mutex::new(tx),
            stats,
        })
    }

    fn send(&self, command: Command) -> Result<(), PluginError> {
        self.commands
            .lock()
            .expect("command lock")
            .send(command)
            .map_err(|_| gone())
    }

    /// Decoding statistics so far.
    pub fn decode_stats(&self) -> DecodeStats {
        let s = self.stats.lock().expect("stats lock");
        DecodeStats {
            steps: s.steps,
            tokens: s.tokens,
            max_active: s.max_active,
        }
    }
}

#[areal_sdk::async_trait]
impl Generator for BurnGenerator {
    fn name(&self) -> &str {
        NAME
    }

    async fn generate(&self, request: GenerateRequest) -> Result<Completion, PluginError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Generate(request, tx))?;
        rx.await.map_err(|_| gone())?
    }

    /// All in one command: the decoding thread sees them at once, in order, and (with nothing
    /// else running) batches them the same way every time, so their tokens and logprobs are
    /// the same bit for bit.
    async fn generate_batch(
        &self,
        requests: Vec<GenerateRequest>,
    ) -> Vec<Result<Completion, PluginError>> {
        let (sent, answers): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .map(|request| {
                let (tx, rx) = oneshot::channel();
                ((request, tx), rx)
            })
            .unzip();
        if self.send(Command::GenerateMany(sent)).is_err() {
            return answers.iter().map(|_| Err(gone())).collect();
        }
        let mut out = Vec::with_capacity(answers.len());
        for answer in answers {
            out.push(answer.await.map_err(|_| gone()).and_then(|r| r));
        }
        out
    }

    async fn update_weights(&self, update: WeightUpdate) -> Result<(), PluginError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Update(update, tx))?;
        rx.await.map_err(|_| gone())?
    }

    async fn pause(&self) -> Result<(), PluginError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Pause(tx))?;
        rx.await.map_err(|_| gone())
    }

    async fn resume(&self) -> Result<(), PluginError> {
        self.send(Command::Resume)
    }

    fn stats(&self) -> GeneratorStats {
        let s = self.stats.lock().expect("stats lock");
        GeneratorStats::new(s.busy.as_secs_f64(), s.tokens).with_resumes(
            s.weight_loads,
            s.resumes,
            s.resume.as_secs_f64(),
        )
    }
}

fn build(config: &PluginConfig, _ctx: &BuildContext) -> Result<Arc<dyn Generator>, PluginError> {
    let options: BurnGeneratorOptions = config.parse()?;
    const MAX_BATCH: usize = 1 << 16;
    if !(1..=MAX_BATCH).contains(&options.max_batch) {
        return Err(config.invalid(
            "max_batch",
            format!(
                "must be between 1 and {MAX_BATCH}, found {}",
                options.max_batch
            ),
        ));
    }
    areal_sdk::resources::check_threads(options.threads)
        .map_err(|message| config.invalid("threads", message))?;
    let device = areal_sdk_train::parse_device(&options.device)
        .map_err(|message| config.invalid("device", message))?;
    Ok(Arc::new(BurnGenerator::new(&options, device)?))
}

/// The name the generator is registered under (`[generator] kind = "burn"`).
pub const NAME: &str = "burn";

register_generator!(
    NAME,
    "in-process generator on the burn transformer: batched, continuous, interruptible",
    build
);
