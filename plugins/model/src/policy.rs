//! The transformer as a [`Policy`] plugin.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use areal_sdk::{
    Adapter, NamedTensor, PluginConfig, PluginError, PolicyVersion, Tokenizer, WeightUpdate,
};
use areal_sdk_train::{PackedBatch, Policy, PolicyContext, StepStats, TrainableModule};
use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::fused::Fused;
use crate::hf::{export, load_checkpoint, save_checkpoint};
use crate::lora::{AdapterConfig, LoraOptions, is_adapter, load_adapter, save_adapter};
use crate::model::Transformer;
use crate::tokenizer::{HfTokenizer, char_tokenizer};

/// Per-token logprobs of a packed batch (see [`Policy::logprobs`]): sequences of similar
/// length are laid out together as right-padded batches (so padding stays small), run
/// causally, and gathered back into packed order.
pub fn packed_logprobs(
    model: &Transformer,
    batch: &PackedBatch,
    vocab: usize,
) -> Result<Tensor<1>, PluginError> {
    let temperature = batch.temperature.max(1e-6);
    packed(model, batch, vocab, |tokens, ids| {
        let [b, t] = tokens.dims();
        let fused = Fused::on(&tokens.device());
        let mut logits = model
            .forward(tokens)
            .narrow(1, 0, t - 1)
            .reshape([b * (t - 1), vocab]);
        // dividing by 1 changes nothing, and would cost two passes over [b, t, vocab]
        if temperature != 1.0 {
            logits = logits.div_scalar(temperature);
        }
        // the next token of every position: ids of positions 1..t of each row
        let next: Vec<u32> = ids
            .chunks(t)
            .flat_map(|row| row[1..].iter().map(|&id| id as u32))
            .collect();
        fused.token_logprobs(logits, next).reshape([b, t - 1])
    })
}

/// Per-token values of a packed batch (see [`Policy::values`]): entry `t` is the value head
/// on the hidden state after `tokens[..t]`; the first token of every sequence gets 0.
pub(crate) fn packed_values(
    model: &Transformer,
    batch: &PackedBatch,
    vocab: usize,
) -> Result<Tensor<1>, PluginError> {
    if model.value_head.is_none() {
        return Err(PluginError::failed(
            crate::NAME,
            "the model has no value head (enable_values was not called)",
        ));
    }
    packed(model, batch, vocab, |tokens, _| {
        let t = tokens.dims()[1];
        model
            .values(tokens)
            .expect("checked above")
            .narrow(1, 0, t - 1)
    })
}

/// Run `per_bucket` on right-padded buckets of similar-length sequences (as a tensor `[b, t]`
/// and as the same ids on the host) and gather its `[b, t − 1]` outputs (for positions 1..t of each row) back into packed order, with 0 at the
/// first token of every sequence.
fn packed(
    model: &Transformer,
    batch: &PackedBatch,
    vocab: usize,
    per_bucket: impl Fn(Tensor<2, Int>, &[i64]) -> Tensor<2>,
) -> Result<Tensor<1>, PluginError> {
    let device = model.embed_tokens.weight.val().device();
    let n = batch.num_tokens();
    if n == 0 {
        return Ok(Tensor::zeros([0], &device));
    }
    if let Some(bad) = batch.tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(PluginError::failed(
            crate::NAME,
            format!("token id {bad} is outside the vocabulary of {vocab}"),
        ));
    }
    let ranges: Vec<std::ops::Range<usize>> = batch.ranges().collect();
    let mut parts = Vec::new();
    // position in the concatenation of the buckets' padded outputs of each packed token
    let mut index = vec![0i64; n];
    let mut offset = 0usize;
    for bucket in length_buckets(&ranges) {
        let b = bucket.len();
        let t = bucket.iter().map(|&s| ranges[s].len()).max().unwrap_or(0);
        let mut padded = vec![0i64; b * t];
        for (row, &s) in bucket.iter().enumerate() {
            for (j, i) in ranges[s].clone().enumerate() {
                padded[row * t + j] = i64::from(batch.tokens[i]);
                index[i] = (offset + row * t + j) as i64;
            }
        }
        offset += b * t;
        if t < 2 {
            parts.push(Tensor::zeros([b * t], &device));
            continue;
        }
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(padded.clone(), [b, t]), &device);
        let picked = per_bucket(tokens, &padded);
        // position 0 of every sequence has no value
        parts.push(Tensor::cat(vec![Tensor::zeros([b, 1], &device), picked], 1).reshape([b * t]));
    }
    let all = if parts.len() == 1 {
        parts.pop().expect("one part")
    } else {
        Tensor::cat(parts, 0)
    };
    let index = Tensor::<1, Int>::from_data(TensorData::new(index, [n]), &device);
    Ok(all.select(0, index))
}

/// Group sequences (longest first) so that each group's padded size stays within 30% of its
/// real tokens; returns indices into `ranges`.
fn length_buckets(ranges: &[std::ops::Range<usize>]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&s| std::cmp::Reverse(ranges[s].len()));
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut tokens = 0usize;
    for s in order {
        let len = ranges[s].len();
        match buckets.last_mut() {
            Some(bucket)
                if {
                    let longest = ranges[bucket[0]].len();
                    longest * (bucket.len() + 1) * 10 <= (tokens + len) * 13
                } =>
            {
                bucket.push(s);
                tokens += len;
            }
            _ => {
                buckets.push(vec![s]);
                tokens = len;
            }
        }
    }
    buckets
}

/// Options of the `transformer` policy.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransformerOptions {
    /// A checkpoint folder (`config.json`, `model.safetensors`, `tokenizer.json`) to start
    /// from. When absent, a fresh model is built from the options below.
    pub path: Option<PathBuf>,
    /// Characters of the fresh model's character tokenizer. Required without `path`.
    pub alphabet: Option<String>,
    /// Width of a fresh model. By default 128.
    pub hidden_size: usize,
    /// Layers of a fresh model. By default 4.
    pub layers: usize,
    /// Query heads of a fresh model. By default 4.
    pub heads: usize,
    /// Key/value heads of a fresh model. By default 2.
    pub kv_heads: usize,
    /// Longest sequence of a fresh model. By default 256.
    pub max_positions: usize,
    /// A chat template (Jinja, as transformers renders it) used instead of the checkpoint's,
    /// or given to a fresh model. A checkpoint the run saves keeps it.
    pub chat_template: Option<String>,
    /// `[policy.lora]`: reinforcement learning trains low-rank adapters over the frozen
    /// weights (those of `path`, or of the warm-up) instead of the weights themselves.
    pub lora: Option<LoraOptions>,
}

impl Default for TransformerOptions {
    fn default() -> Self {
        Self {
            path: None,
            alphabet: None,
            hidden_size: 128,
            layers: 4,
            heads: 4,
            kv_heads: 2,
            max_positions: 256,
            chat_template: None,
            lora: None,
        }
    }
}

/// The folder of a checkpoint that holds its adapter, in PEFT's format (the checkpoint's own
/// weights have the adapter folded in).
pub const ADAPTER_DIR: &str = "adapter";

/// Adapters to put on when RL starts.
#[derive(Clone, Debug)]
struct LoraPlan {
    config: AdapterConfig,
    /// PEFT-named tensors to start from (`[policy.lora] path`); fresh adapters otherwise.
    tensors: Option<Vec<NamedTensor>>,
    seed: u64,
}

/// A transformer language model being trained.
#[derive(Debug)]
pub struct TransformerPolicy {
    config: ModelConfig,
    module: TrainableModule<Transformer>,
    tokenizer: Arc<HfTokenizer>,
    device: Device,
    /// Seed of a value head added later.
    value_seed: u64,
    /// Adapters RL trains, if any.
    lora: Option<LoraPlan>,
    /// With adapters on: the frozen weights as every weight update sends them, exported at
    /// the first update (one host copy for the run, shared by every update).
    base: std::sync::OnceLock<Arc<Vec<NamedTensor>>>,
}

impl TransformerPolicy {
    /// Wrap a model with its config and tokenizer.
    pub fn new(
        config: ModelConfig,
        model: Transformer,
        tokenizer: HfTokenizer,
        device: Device,
    ) -> Self {
        Self {
            config,
            module: TrainableModule::new(model),
            tokenizer: Arc::new(tokenizer),
            device,
            value_seed: 0,
            lora: None,
            base: std::sync::OnceLock::new(),
        }
    }

    /// A fresh model for `alphabet` drawn from `seed`.
    pub fn fresh(
        options: &TransformerOptions,
        alphabet: &str,
        seed: u64,
        device: &Device,
    ) -> Result<Self, PluginError> {
        let tokenizer = char_tokenizer(alphabet)?;
        let mut config = ModelConfig::small(
            tokenizer.vocab_size(),
            options.hidden_size,
            options.layers,
            options.heads,
            options.kv_heads,
            options.max_positions,
        );
        config.eos_token_id = Some(crate::config::EosTokens::One(tokenizer.stop_token_ids()[0]));
        config
            .check_fits()
            .map_err(|e| PluginError::failed(crate::NAME, e))?;
        let model = Transformer::new(&config, seed, device);
        Ok(Self::new(config, model, tokenizer, device.clone()))
    }

    /// Load a checkpoint folder.
    pub fn load(dir: &Path, device: &Device) -> Result<Self, PluginError> {
        let (config, model, tokenizer) = load_checkpoint(dir, device)?;
        Ok(Self::new(config, model, tokenizer, device.clone()))
    }

    /// The architecture.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The model.
    pub fn model(&self) -> &Transformer {
        self.module.module()
    }

    /// The tokenizer.
    pub fn hf_tokenizer(&self) -> &HfTokenizer {
        &self.tokenizer
    }

    /// Train the adapters `config` describes from RL on (fresh ones drawn from `seed`, or
    /// `tensors` in PEFT's names).
    pub fn set_lora(
        &mut self,
        config: AdapterConfig,
        tensors: Option<Vec<NamedTensor>>,
        seed: u64,
    ) {
        self.lora = Some(LoraPlan {
            config,
            tensors,
            seed,
        });
    }

    /// The adapters' configuration, once they are on.
    pub fn adapter_config(&self) -> Option<&AdapterConfig> {
        self.lora
            .as_ref()
            .filter(|_| self.module.module().has_lora())
            .map(|p| &p.config)
    }

    /// The adapters as PEFT saves them, once they are on.
    pub fn adapter(&self) -> Option<Adapter> {
        let config = self.adapter_config()?;
        Some(Adapter {
            config: config.to_json(),
            tensors: self.module.module().adapter_tensors(),
        })
    }

    /// The frozen weights, exported once for every weight update.
    fn base(&self) -> Arc<Vec<NamedTensor>> {
        self.base
            .get_or_init(|| Arc::new(export(&self.module.module().without_lora())))
            .clone()
    }
}

impl Policy for TransformerPolicy {
    fn name(&self) -> &str {
        crate::NAME
    }

    fn device(&self) -> Device {
        self.device.clone()
    }

    fn tokenizer(&self) -> Arc<dyn Tokenizer> {
        self.tokenizer.clone()
    }

    fn logprobs(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError> {
        packed_logprobs(self.module.module(), batch, self.config.vocab_size)
    }

    fn logprobs_no_grad(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError> {
        packed_logprobs(&self.module.module().valid(), batch, self.config.vocab_size)
    }

    fn enable_values(&mut self) -> Result<(), PluginError> {
        if self.module.module().value_head.is_none() {
            let model = self
                .module
                .module()
                .clone()
                .with_value_head(self.value_seed);
            self.module.replace(model);
        }
        Ok(())
    }

    fn values(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError> {
        packed_values(self.module.module(), batch, self.config.vocab_size)
    }

    fn values_no_grad(&self, batch: &PackedBatch) -> Result<Tensor<1>, PluginError> {
        packed_values(&self.module.module().valid(), batch, self.config.vocab_size)
    }

    /// A copy sharing the weights (burn's tensors are shared, not copied); with adapters on,
    /// the base alone: the reference of a KL penalty is the model RL started from.
    fn snapshot(&self) -> Result<Box<dyn Policy>, PluginError> {
        Ok(Box::new(Self {
            config: self.config.clone(),
            module: TrainableModule::new(self.module.module().without_lora()),
            tokenizer: self.tokenizer.clone(),
            device: self.device.clone(),
            value_seed: self.value_seed,
            lora: None,
            base: std::sync::OnceLock::new(),
        }))
    }

    /// Put the adapters on: the weights so far become the frozen base.
    fn start_rl(&mut self) -> Result<(), PluginError> {
        let Some(plan) = &self.lora else {
            return Ok(());
        };
        if self.module.module().has_lora() {
            return Ok(());
        }
        let model = self.module.module().clone().with_lora(
            &plan.config,
            plan.tensors.clone(),
            plan.seed,
        )?;
        self.module.replace(model);
        self.base = std::sync::OnceLock::new();
        Ok(())
    }

    fn weight_update(&self, version: PolicyVersion) -> WeightUpdate {
        let architecture = self.architecture();
        match self.adapter() {
            Some(adapter) => {
                WeightUpdate::adapted(version, self.base(), adapter).with_architecture(architecture)
            }
            _ => WeightUpdate::new(version, self.weights()).with_architecture(architecture),
        }
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
        export(self.module.module())
    }

    fn architecture(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).expect("the config serialises")
    }

    fn save_state(
        &self,
        optimizer: Option<&ModuleOptimizer>,
        dir: &Path,
    ) -> Result<(), PluginError> {
        self.module.save_state(crate::NAME, optimizer, dir)
    }

    fn load_state(
        &mut self,
        optimizer: Option<&mut ModuleOptimizer>,
        dir: &Path,
    ) -> Result<(), PluginError> {
        self.module.load_state(crate::NAME, optimizer, dir)?;
        // the base is the state's, not the one the adapters were put on before
        self.base = std::sync::OnceLock::new();
        Ok(())
    }

    /// A checkpoint folder with the adapters folded into its weights and, with adapters on,
    /// the adapters alone in PEFT's format under [`ADAPTER_DIR`].
    fn save(&self, dir: &Path) -> Result<(), PluginError> {
        save_checkpoint(dir, &self.config, self.module.module(), &self.tokenizer)?;
        if let (Some(config), Some(adapter)) = (self.adapter_config(), self.adapter()) {
            save_adapter(&dir.join(ADAPTER_DIR), config, &adapter.tensors)?;
        }
        Ok(())
    }

    /// A checkpoint folder; or a PEFT adapter folder, folded into the weights held now (the
    /// base it was trained on).
    fn load(&mut self, dir: &Path) -> Result<(), PluginError> {
        if is_adapter(dir) {
            let (config, tensors) = load_adapter(dir)?;
            let model = self
                .module
                .module()
                .without_lora()
                .with_lora(&config, Some(tensors), 0)
                .map_err(|e| {
                    PluginError::caused_by(crate::NAME, format!("adapter {}", dir.display()), e)
                })?
                .merged();
            self.module.replace(model);
            // whole weights now: adapters, if planned, go on again at the next `start_rl`
            self.base = std::sync::OnceLock::new();
            return Ok(());
        }
        let (config, model, tokenizer) = load_checkpoint(dir, &self.device)?;
        if config != self.config {
            return Err(PluginError::failed(
                crate::NAME,
                format!(
                    "checkpoint {} has another architecture than this model",
                    dir.display()
                ),
            ));
        }
        // A checkpoint holds the language model; a value head, if any, stays.
        let model = match &self.module.module().value_head {
            Some(head) => Transformer {
                value_head: Some(head.clone()),
                ..model
            },
            None => model,
        };
        self.module.replace(model);
        self.tokenizer = Arc::new(tokenizer);
        self.base = std::sync::OnceLock::new();
        Ok(())
    }
}

pub(crate) fn build(
    config: &PluginConfig,
    ctx: &PolicyContext,
) -> Result<Box<dyn Policy>, PluginError> {
    let options: TransformerOptions = config.parse()?;
    let mut policy = match (&options.path, &options.alphabet) {
        (Some(path), _) => TransformerPolicy::load(path, &ctx.device)?,
        (None, Some(alphabet)) => {
            TransformerPolicy::fresh(&options, alphabet, ctx.build.seed, &ctx.device)?
        }
        (None, None) => {
            return Err(config.invalid(
                "alphabet",
                "a fresh model (no `path`) needs the characters of its tokenizer",
            ));
        }
    };
    if let Some(source) = &options.chat_template {
        Arc::make_mut(&mut policy.tokenizer)
            .set_chat_template(source)
            .map_err(|e| config.invalid("chat_template", e.to_string()))?;
    }
    policy.value_seed = ctx.build.seed ^ 0x7661_6c75_6521;
    if let Some(lora) = &options.lora {
        let (adapter, tensors) = match &lora.path {
            Some(dir) => {
                let (adapter, tensors) = load_adapter(dir)
                    .map_err(|e| config.invalid("lora.path", crate::lora::chain(&e)))?;
                (adapter, Some(tensors))
            }
            None => {
                let mut adapter = AdapterConfig::from_options(lora)
                    .map_err(|(key, message)| config.invalid(&format!("lora.{key}"), message))?;
                adapter.base_model = options.path.as_ref().map(|p| p.display().to_string());
                (adapter, None)
            }
        };
        let key = if lora.path.is_some() {
            "lora.path"
        } else {
            "lora.rank"
        };
        policy
            .module
            .module()
            .check_lora(&adapter)
            .map_err(|e| config.invalid(key, crate::lora::chain(&e)))?;
        policy.set_lora(adapter, tensors, ctx.build.seed ^ 0x6c6f_7261);
    }
    Ok(Box::new(policy))
}
