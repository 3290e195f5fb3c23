//! The [`Generator`] trait: token generation with per-token logprobs and versions.

use async_trait::async_trait;

use crate::error::PluginError;
use crate::rollout::{Completion, GenerateRequest, WeightUpdate};

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

    /// Load new weights; subsequent tokens are sampled with them and carry `update.version`.
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
}
