//! The [`Policy`] trait: the model as the trainer sees it.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use areal_sdk::{NamedTensor, PluginError, PolicyVersion, Tokenizer, WeightUpdate};
use burn::optim::ModuleOptimizer;
use burn::tensor::{Device, Tensor};

/// Sequences concatenated without padding, delimited by cumulative lengths.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackedBatch {
    /// All tokens of all sequences, back to back.
    pub tokens: Vec<u32>,
    /// `cu_seqlens[i]..cu_seqlens[i + 1]` is sequence `i`; starts with 0, ends with
    /// `tokens.len()`.
    pub cu_seqlens: Vec<usize>,
    /// Logits are divided by this before the softmax, as the generator did when sampling.
    pub temperature: f32,
}

impl PackedBatch {
    /// An empty batch at `temperature`.
    pub fn new(temperature: f32) -> Self {
        Self {
            tokens: Vec::new(),
            cu_seqlens: vec![0],
            temperature,
        }
    }

    /// Append one sequence.
    pub fn push(&mut self, sequence: &[u32]) {
        self.tokens.extend_from_slice(sequence);
        self.cu_seqlens.push(self.tokens.len());
    }

    /// Number of sequences.
    pub fn num_sequences(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    /// Number of tokens.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Token range of each sequence.
    pub fn ranges(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.cu_seqlens.windows(2).map(|w| w[0]..w[1])
    }

    /// Length of the longest sequence.
    pub fn max_len(&self) -> usize {
        self.ranges().map(|r| r.len()).max().unwrap_or(0)
    }
}

/// What an optimizer step reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepStats {
    /// Global L2 norm of the gradient before clipping.
    pub grad_norm: f64,
    /// Whether the gradient was scaled down to the clipping norm.
    pub clipped: bool,
}

/// A trainable language model.
///
/// `logprobs` returns one value per input token: entry `t` is
/// `log softmax(logits(tokens[..t]) / temperature)[tokens[t]]` within its sequence, and the
/// first token of every sequence gets 0. Gradients of successive [`backward`](Policy::backward)
/// calls accumulate until [`step`](Policy::step) applies them.
///
/// [`TrainableModule`](crate::TrainableModule) implements the backward/step/weights part for
/// any burn module, so a model usually only writes the forward pass.
pub trait Policy: Send + 'static {
    /// Registered name.
    fn name(&self) -> &str;

    /// Device the model lives on (with autodiff enabled).
    fn device(&self) -> Device;

    /// The tokenizer that matches the model's vocabulary.
    fn tokenizer(&self) -> Arc<dyn Tokenizer>;

    /// Per-token logprobs, tracked for gradients.
    fn logprobs(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError>;

    /// Per-token logprobs without building a graph (proximal recompute, evaluation).
    fn logprobs_no_grad(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError>;

    /// Give the model a value head (a critic sharing the trunk), for algorithms that ask for
    /// values; called once, before training, when
    /// [`Requirements::values`](crate::Requirements::values) is set. By default unsupported.
    fn enable_values(&mut self) -> Result<(), PluginError> {
        Err(PluginError::unsupported(
            self.name(),
            "a value head (enable_values)",
        ))
    }

    /// Per-token values V(tokens[..t]) from the value head, tracked for gradients; entry `t`
    /// estimates the return of generating from position `t` on. By default unsupported.
    fn values(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError> {
        let _ = batch;
        Err(PluginError::unsupported(self.name(), "values"))
    }

    /// Per-token values without building a graph. By default unsupported.
    fn values_no_grad(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError> {
        let _ = batch;
        Err(PluginError::unsupported(self.name(), "values"))
    }

    /// A frozen copy of the current weights, for a reference policy: the engine only calls
    /// [`logprobs_no_grad`](Policy::logprobs_no_grad) on it. By default unsupported.
    fn snapshot(&self) -> Result<Box<dyn Policy>, PluginError> {
        Err(PluginError::unsupported(
            self.name(),
            "a reference copy (snapshot)",
        ))
    }

    /// Accumulate the gradient of `loss` (a one-element tensor).
    fn backward(&mut self, loss: Tensor<1>) -> Result<(), PluginError>;

    /// Apply the accumulated gradient with `optimizer` at learning rate `lr`, after scaling it
    /// to a global L2 norm of at most `max_grad_norm`; clears the accumulated gradient.
    fn step(
        &mut self,
        optimizer: &mut ModuleOptimizer,
        lr: f64,
        max_grad_norm: Option<f64>,
    ) -> Result<StepStats, PluginError>;

    /// Current weights as plain data, for the generators.
    fn weights(&self) -> Vec<NamedTensor>;

    /// The current weights as version `version`, as generators are sent them: by default
    /// [`weights`](Policy::weights) with the [`architecture`](Policy::architecture). A policy
    /// that trains an adapter over frozen weights sends the frozen weights (the same `Arc`
    /// every time) and the adapter ([`WeightUpdate::adapted`]).
    fn weight_update(&self, version: PolicyVersion) -> WeightUpdate {
        WeightUpdate::new(version, self.weights()).with_architecture(self.architecture())
    }

    /// Called once when reinforcement learning starts, after any warm-up (which trains every
    /// weight) and before the reference policy is copied: a policy that trains only part of
    /// itself in RL (low-rank adapters) sets that up here, the weights so far becoming its
    /// frozen base. Called again, before [`load_state`](Policy::load_state), when a run
    /// resumes in RL. Nothing by default.
    fn start_rl(&mut self) -> Result<(), PluginError> {
        Ok(())
    }

    /// What the weights are, as the model's `config.json` would say it; sent to generators
    /// with every weight update. By default `Null` (a generator that needs it cannot be used).
    fn architecture(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Write a checkpoint into `dir`.
    fn save(&self, dir: &Path) -> Result<(), PluginError> {
        let _ = dir;
        Err(PluginError::unsupported(self.name(), "save"))
    }

    /// Replace the weights with those of a checkpoint written by [`save`](Policy::save) for
    /// the same architecture. On failure the policy must be left as it was (the engine then
    /// goes on with it, e.g. warms up again when a cached warm-up is damaged).
    fn load(&mut self, dir: &Path) -> Result<(), PluginError> {
        let _ = dir;
        Err(PluginError::unsupported(self.name(), "load"))
    }

    /// Write everything training has changed into `dir`, for an exact resume: every parameter
    /// (a value head included) and, when given, `optimizer`'s state for them.
    /// [`TrainableModule::save_state`](crate::TrainableModule::save_state) does it for a burn
    /// module. By default unsupported: runs of such a policy cannot be resumed.
    fn save_state(
        &self,
        optimizer: Option<&ModuleOptimizer>,
        dir: &Path,
    ) -> Result<(), PluginError> {
        let _ = (optimizer, dir);
        Err(PluginError::unsupported(self.name(), "save_state"))
    }

    /// Restore, bit for bit, what [`save_state`](Policy::save_state) wrote into `dir` (and the
    /// optimizer's state when `optimizer` is given). On failure the policy and the optimizer
    /// must be left as they were. By default unsupported.
    fn load_state(
        &mut self,
        optimizer: Option<&mut ModuleOptimizer>,
        dir: &Path,
    ) -> Result<(), PluginError> {
        let _ = (optimizer, dir);
        Err(PluginError::unsupported(self.name(), "load_state"))
    }
}
