//! The [`Generator`] trait: token generation with per-token logprobs and versions.

use async_trait::async_trait;

use crate::error::PluginError;
use crate::task::Tokenizer;
use crate::trajectory::{Completion, GenerateRequest, WeightUpdate};

/// Generates completions; a plugin wraps an in-process model or a remote inference server.
///
/// The engine drives it with many concurrent [`generate`](Generator::generate) calls and,
/// after every optimizer step, the interruption protocol:
///
/// 1. [`pause`](Generator::pause): in-flight calls return promptly with what they have and
///    [`FinishReason::Interrupted`](crate::FinishReason::Interrupted), and `pause` itself
///    returns once none is running; calls made while paused wait for `resume`.
/// 2. [`update_weights`](Generator::update_weights): KV caches computed with the old weights
///    are dropped; tokens sampled from now on carry the new version.
/// 3. [`resume`](Generator::resume): the engine resubmits each interrupted sample as prompt +
///    partial output, so every token keeps the logprob and version of the policy that
///    sampled it.
///
/// A generator that cannot pause keeps the defaults (`Unsupported`); the engine then updates
/// its weights while requests are in flight, which is correct as long as each token still
/// records the version that sampled it.
#[async_trait]
pub trait Generator: Send + Sync + 'static {
    /// Registered name.
    fn name(&self) -> &str;

    /// Generate one completion for `request`.
    async fn generate(&self, request: GenerateRequest) -> Result<Completion, PluginError>;

    /// Generate a completion for each of `requests`, answers in their order. The engine's
    /// deterministic mode hands each round's requests over together this way, so that a
    /// generator whose numbers depend on what it batches together (a batched model's
    /// rounding) can batch them the same way every time. By default they run concurrently
    /// through [`generate`](Generator::generate).
    async fn generate_batch(
        &self,
        requests: Vec<GenerateRequest>,
    ) -> Vec<Result<Completion, PluginError>> {
        futures_util::future::join_all(requests.into_iter().map(|r| self.generate(r))).await
    }

    /// Load new weights; subsequent tokens are sampled with them and carry `update.version`.
    /// With [`WeightUpdate::adapter`] set, the weights are its base with the adapter applied: a
    /// generator that cannot apply one must refuse the update (sampling the base instead would
    /// train on another policy than the one that sampled).
    async fn update_weights(&self, update: WeightUpdate) -> Result<(), PluginError>;

    /// Interrupt in-flight requests and hold new ones until [`resume`](Generator::resume);
    /// returns once no request is running.
    async fn pause(&self) -> Result<(), PluginError> {
        Err(PluginError::unsupported(self.name(), "pause"))
    }

    /// Let held and future requests run again.
    async fn resume(&self) -> Result<(), PluginError> {
        Err(PluginError::unsupported(self.name(), "resume"))
    }

    /// Check, before the run starts, that the model this generator samples from reads and
    /// writes tokens as `tokenizer` (the trainer's) does, so that a mismatch stops the run
    /// with a clear error instead of training on tokens that mean something else. A generator
    /// that decodes with the trainer's own weights and ids has nothing to check (the default).
    async fn check_tokenizer(&self, tokenizer: &dyn Tokenizer) -> Result<(), PluginError> {
        let _ = tokenizer;
        Ok(())
    }

    /// Counters since the generator started, for the engine's metrics (how busy generation
    /// is, what an interruption costs). A generator that measures nothing keeps the default.
    fn stats(&self) -> GeneratorStats {
        GeneratorStats::default()
    }
}

/// What a generator reports of its own work, cumulative since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct GeneratorStats {
    /// Seconds spent computing (prefill and decoding) — not waiting for requests or while
    /// paused. `None` when not measured.
    pub busy_seconds: Option<f64>,
    /// Tokens sampled.
    pub tokens: u64,
    /// Weight updates loaded.
    pub weight_loads: u64,
    /// Seconds from each interruption of running work for new weights (at `pause`, or at the
    /// update) to the end of the first forward pass after it (loading the weights, dropping
    /// caches, prefilling again what was interrupted), summed over `resumes`.
    pub resume_seconds: f64,
    /// Weight updates that interrupted running work, after which decoding ran again.
    pub resumes: u64,
    /// Samples and servers lost on the way, for a generator that calls servers.
    pub faults: FaultStats,
}

/// What a plugin that calls servers (the `remote` generator and reward) lost on the way,
/// cumulative since it started; zero for one that computes in process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultStats {
    /// Samples whose server failed while it had them, sent again to another server (each
    /// at most once).
    pub reissued_samples: u64,
    /// Calls that found their server dead, unreachable or out of time.
    pub endpoint_failures: u64,
}

impl FaultStats {
    /// These counters.
    pub fn new(reissued_samples: u64, endpoint_failures: u64) -> Self {
        Self {
            reissued_samples,
            endpoint_failures,
        }
    }
}

impl std::ops::Add for FaultStats {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            reissued_samples: self.reissued_samples + other.reissued_samples,
            endpoint_failures: self.endpoint_failures + other.endpoint_failures,
        }
    }
}

impl GeneratorStats {
    /// Counters with the busy time measured.
    pub fn new(busy_seconds: f64, tokens: u64) -> Self {
        Self {
            busy_seconds: Some(busy_seconds),
            tokens,
            ..Self::default()
        }
    }

    /// With the weight-update counters.
    pub fn with_resumes(mut self, weight_loads: u64, resumes: u64, resume_seconds: f64) -> Self {
        self.weight_loads = weight_loads;
        self.resumes = resumes;
        self.resume_seconds = resume_seconds;
        self
    }

    /// With the fault counters.
    pub fn with_faults(mut self, faults: FaultStats) -> Self {
        self.faults = faults;
        self
    }
}
