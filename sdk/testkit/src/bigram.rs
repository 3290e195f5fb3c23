//! A bigram language model: the smallest policy that really learns, as a burn [`Policy`] for
//! the trainer and a plain-Rust [`Generator`] for rollouts, sharing weights through
//! [`WeightUpdate`]s exactly as a real model and generator do.
//!
//! The model is one table `table[prev][next]` of logits: the next token depends only on the
//! previous one.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use areal_sdk::{
    BuildContext, Completion, FinishReason, GenerateRequest, Generator, NamedTensor, PluginConfig,
    PluginError, PolicyVersion, Tokenizer, WeightUpdate, mix_seed, sampling::sample,
};
use areal_sdk_train::burn::module::{Module, Param};
use areal_sdk_train::burn::optim::ModuleOptimizer;
use areal_sdk_train::burn::tensor::activation::log_softmax;
use areal_sdk_train::burn::tensor::{Device, Int, Tensor, TensorData};
use areal_sdk_train::{PackedBatch, Policy, PolicyContext, StepStats, TrainableModule};
use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Deserialize;
use tokio::sync::{Notify, watch};

use crate::tokenizer::LetterTokenizer;

/// The name the bigram policy and generator are registered under.
pub(crate) const NAME: &str = "testkit-bigram";

/// Name of the single weight tensor.
pub const TABLE: &str = "table";

/// The burn module: one `[vocab, vocab]` table of logits.
#[derive(Module, Debug)]
pub struct BigramModel {
    /// `table[prev][next]`: logit of `next` after `prev`.
    pub table: Param<Tensor<2>>,
}

impl BigramModel {
    /// A table of `vocab × vocab` logits drawn from N(0, init_std²) with `seed`.
    pub fn new(vocab: usize, init_std: f32, seed: u64, device: &Device) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let values: Vec<f32> = (0..vocab * vocab)
            .map(|_| init_std * standard_normal(&mut rng))
            .collect();
        let table = Tensor::<2>::from_data(TensorData::new(values, [vocab, vocab]), device);
        Self {
            table: Param::from_tensor(table),
        }
    }

    /// Per-token logprobs of a packed batch (see [`Policy::logprobs`]).
    pub fn logprobs(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError> {
        let table = self.table.val();
        let [vocab, _] = table.dims();
        let device = table.device();
        let n = batch.num_tokens();
        if n == 0 {
            return Ok(Tensor::zeros([0], &device));
        }
        if let Some(bad) = batch.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(PluginError::failed(
                NAME,
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        let mut prev = vec![0i64; n];
        let mut mask = vec![1.0f32; n];
        for range in batch.ranges() {
            for t in range.clone() {
                if t == range.start {
                    prev[t] = i64::from(batch.tokens[t]);
                    mask[t] = 0.0;
                } else {
                    prev[t] = i64::from(batch.tokens[t - 1]);
                }
            }
        }
        let next: Vec<i64> = batch.tokens.iter().map(|&t| i64::from(t)).collect();
        let prev = Tensor::<1, Int>::from_data(TensorData::new(prev, [n]), &device);
        let next = Tensor::<2, Int>::from_data(TensorData::new(next, [n, 1]), &device);
        let mask = Tensor::<1>::from_data(TensorData::new(mask, [n]), &device);
        let logits = table
            .select(0, prev)
            .div_scalar(batch.temperature.max(1e-6));
        let lp = log_softmax(logits, 1).gather(1, next).reshape([n]);
        Ok(lp * mask)
    }
}

/// A standard normal sample (Box–Muller).
fn standard_normal(rng: &mut StdRng) -> f32 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// Options of the `testkit-bigram` policy.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BigramPolicyOptions {
    /// Letters in the alphabet (the vocabulary adds one stop token). By default 8.
    pub letters: u32,
    /// Standard deviation of the initial logits. By default 0 (uniform next-token distribution).
    pub init_std: f32,
}

impl Default for BigramPolicyOptions {
    fn default() -> Self {
        Self {
            letters: 8,
            init_std: 0.0,
        }
    }
}

/// The trainer-side bigram policy.
#[derive(Debug)]
pub struct BigramPolicy {
    module: TrainableModule<BigramModel>,
    tokenizer: Arc<LetterTokenizer>,
    device: Device,
}

impl BigramPolicy {
    /// A policy over `letters` letters on `device`.
    pub fn new(options: &BigramPolicyOptions, seed: u64, device: &Device) -> Self {
        let tokenizer = Arc::new(LetterTokenizer::new(options.letters));
        let model = BigramModel::new(tokenizer.vocab_size(), options.init_std, seed, device);
        Self {
            module: TrainableModule::new(model),
            tokenizer,
            device: device.clone(),
        }
    }

    /// The underlying module.
    pub fn model(&self) -> &BigramModel {
        self.module.module()
    }
}

impl Policy for BigramPolicy {
    fn name(&self) -> &str {
        NAME
    }

    fn device(&self) -> Device {
        self.device.clone()
    }

    fn tokenizer(&self) -> Arc<dyn Tokenizer> {
        self.tokenizer.clone()
    }

    fn logprobs(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError> {
        self.module.module().logprobs(batch)
    }

    fn logprobs_no_grad(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError> {
        self.module.module().valid().logprobs(batch)
    }

    fn backward(&mut self, loss: Tensor<1>) -> Result<(), PluginError> {
        self.module.backward(loss);
        Ok(())
    }

    fn step(
        &mut self,
        optimizer: &mut ModuleOptimizer,
        lr: f64,
        max_grad_norm: Option<f64>,
    ) -> Result<StepStats, PluginError> {
        self.module.step(optimizer, lr, max_grad_norm)
    }

    fn weights(&self) -> Vec<NamedTensor> {
        self.module.weights()
    }

    fn snapshot(&self) -> Result<Box<dyn Policy>, PluginError> {
        Ok(Box::new(Self {
            module: TrainableModule::new(self.module.module().clone()),
            tokenizer: self.tokenizer.clone(),
            device: self.device.clone(),
        }))
    }

    fn save_state(
        &self,
        optimizer: Option<&ModuleOptimizer>,
        dir: &Path,
    ) -> Result<(), PluginError> {
        self.module.save_state(NAME, optimizer, dir)
    }

    fn load_state(
        &mut self,
        optimizer: Option<&mut ModuleOptimizer>,
        dir: &Path,
    ) -> Result<(), PluginError> {
        self.module.load_state(NAME, optimizer, dir)
    }

    fn save(&self, dir: &Path) -> Result<(), PluginError> {
        let weights = self.weights();
        let json = serde_json::to_vec(&weights)
            .map_err(|e| PluginError::caused_by(self.name(), "cannot serialise weights", e))?;
        let path = dir.join("bigram.json");
        std::fs::write(&path, json).map_err(|e| {
            PluginError::caused_by(self.name(), format!("cannot write {}", path.display()), e)
        })
    }
}

pub(crate) fn build_policy(
    config: &PluginConfig,
    ctx: &PolicyContext,
) -> Result<Box<dyn Policy>, PluginError> {
    let options: BigramPolicyOptions = config.parse()?;
    LetterTokenizer::check_letters(config, options.letters)?;
    Ok(Box::new(BigramPolicy::new(
        &options,
        ctx.build.seed,
        &ctx.device,
    )))
}

/// Options of the `testkit-bigram` generator.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BigramGeneratorOptions {
    /// Sleep this long after each token, to give decoding a cost in tests of asynchrony. By
    /// default 0 (the task only yields to the runtime).
    pub token_delay_us: u64,
    /// Each token's delay is drawn uniformly from `delay · [1 − jitter, 1 + jitter]`, so rollouts
    /// finish in a random order. By default 0.
    pub jitter: f64,
}

#[derive(Clone)]
struct Weights {
    table: Arc<Vec<f32>>,
    vocab: usize,
    version: PolicyVersion,
}

/// The generator-side bigram model, sampling in plain Rust.
pub struct BigramGenerator {
    options: BigramGeneratorOptions,
    weights: RwLock<Option<Weights>>,
    paused: watch::Sender<bool>,
    active: AtomicUsize,
    idle: Notify,
}

impl BigramGenerator {
    /// A generator without weights; call `update_weights` before `generate`.
    pub fn new(options: BigramGeneratorOptions) -> Self {
        Self {
            options,
            weights: RwLock::new(None),
            paused: watch::Sender::new(false),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }

    fn snapshot(&self) -> Result<Weights, PluginError> {
        self.weights
            .read()
            .expect("weights lock poisoned")
            .clone()
            .ok_or_else(|| PluginError::failed(NAME, "generate before any weights"))
    }

    fn token_delay(&self, rng: &mut StdRng) -> Option<Duration> {
        if self.options.token_delay_us == 0 {
            return None;
        }
        let jitter = self.options.jitter.clamp(0.0, 1.0);
        let factor = 1.0 + jitter * (2.0 * rng.random::<f64>() - 1.0);
        Some(Duration::from_secs_f64(
            self.options.token_delay_us as f64 * 1e-6 * factor,
        ))
    }
}

struct ActiveGuard<'a>(&'a BigramGenerator);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[async_trait]
impl Generator for BigramGenerator {
    fn name(&self) -> &str {
        NAME
    }

    async fn generate(&self, request: GenerateRequest) -> Result<Completion, PluginError> {
        let mut paused = self.paused.subscribe();
        // Calls made while paused wait for resume.
        paused
            .wait_for(|p| !*p)
            .await
            .map_err(|_| PluginError::failed(self.name(), "generator dropped"))?;
        self.active.fetch_add(1, Ordering::SeqCst);
        let _guard = ActiveGuard(self);

        let Some(&last) = request.input_ids.last() else {
            return Err(PluginError::invalid_request(self.name(), "empty input"));
        };
        if let Some(w) = self.weights.read().expect("weights lock poisoned").as_ref()
            && let Some(bad) = request.input_ids.iter().find(|&&t| t as usize >= w.vocab)
        {
            return Err(PluginError::invalid_request(
                self.name(),
                format!("token id {bad} is outside the vocabulary of {}", w.vocab),
            ));
        }
        let mut rng = StdRng::seed_from_u64(mix_seed(
            mix_seed(request.sampling.seed, request.sample_id),
            request.input_ids.len() as u64,
        ));
        let mut out = Completion::empty(FinishReason::Length);
        let mut prev = last;
        while out.len() < request.max_new_tokens {
            if *paused.borrow() {
                out.finish_reason = FinishReason::Interrupted;
                return Ok(out);
            }
            let w = self.snapshot()?;
            if prev as usize >= w.vocab {
                return Err(PluginError::failed(
                    self.name(),
                    format!("token id {prev} is outside the vocabulary of {}", w.vocab),
                ));
            }
            let row = &w.table[prev as usize * w.vocab..(prev as usize + 1) * w.vocab];
            let (token, logprob) = sample(
                row,
                request.sampling.temperature,
                request.sampling.top_p,
                rng.random::<f64>(),
            );
            out.push(token, logprob, w.version);
            prev = token;
            if request.stop_token_ids.contains(&token) {
                out.finish_reason = FinishReason::Stop;
                return Ok(out);
            }
            match self.token_delay(&mut rng) {
                Some(delay) => {
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = paused.wait_for(|p| *p) => {}
                    }
                }
                None => tokio::task::yield_now().await,
            }
        }
        out.finish_reason = FinishReason::Length;
        Ok(out)
    }

    async fn update_weights(&self, update: WeightUpdate) -> Result<(), PluginError> {
        // sampling the base instead would train on the wrong policy without a word
        if update.adapter.is_some() {
            return Err(PluginError::unsupported(self.name(), "LoRA adapters"));
        }
        let table = update.tensor(TABLE).ok_or_else(|| {
            PluginError::failed(
                self.name(),
                format!("weight update has no `{TABLE}` tensor"),
            )
        })?;
        let [rows, cols] = table.shape[..] else {
            return Err(PluginError::failed(
                self.name(),
                format!(
                    "`{TABLE}` has shape {:?}, expected [vocab, vocab]",
                    table.shape
                ),
            ));
        };
        if rows != cols || table.data.len() != rows * cols {
            return Err(PluginError::failed(
                self.name(),
                format!(
                    "`{TABLE}` has shape {:?} and {} values",
                    table.shape,
                    table.data.len()
                ),
            ));
        }
        *self.weights.write().expect("weights lock poisoned") = Some(Weights {
            table: Arc::new(table.data.clone()),
            vocab: rows,
            version: update.version,
        });
        Ok(())
    }

    async fn pause(&self) -> Result<(), PluginError> {
        self.paused.send_replace(true);
        loop {
            let idle = self.idle.notified();
            if self.active.load(Ordering::SeqCst) == 0 {
                return Ok(());
            }
            idle.await;
        }
    }

    async fn resume(&self) -> Result<(), PluginError> {
        self.paused.send_replace(false);
        Ok(())
    }
}

pub(crate) fn build_generator(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn Generator>, PluginError> {
    let options: BigramGeneratorOptions = config.parse()?;
    if !(0.0..=1.0).contains(&options.jitter) {
        return Err(config.invalid(
            "jitter",
            format!("must be in [0, 1], found {}", options.jitter),
        ));
    }
    Ok(Arc::new(BigramGenerator::new(options)))
}
