//! Low-rank adapters (LoRA) on the transformer's projections, in PEFT's format.
//!
//! With adapters on, every projection named in `target_modules` computes
//! `x·W + scale · (dropout(x)·A)·B`, `A: [in, rank]` drawn as PEFT draws it (Kaiming-uniform,
//! bound `1/√in`), `B: [rank, out]` zero (so the adapted model starts as the base), `scale =
//! alpha / rank`. Everything else is frozen: gradients reach `A` and `B` only (and a value
//! head, which stays trainable).
//!
//! PEFT's files: `adapter_config.json` and `adapter_model.safetensors` with keys
//! `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` (`[rank, in]`) and
//! `….lora_B.weight` (`[out, rank]`), the layout of PyTorch's `nn.Linear`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use areal_sdk::{NamedTensor, PluginError};
use burn::module::{Module, Param};
use burn::nn::DropoutConfig;
use burn::tensor::{Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Deserialize;

use crate::model::{DecoderLayer, Lora, Proj, Transformer};

/// The projections an adapter may target, by PEFT's names (the modules' own).
pub const TARGET_MODULES: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// PEFT's adapter configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// PEFT's adapter weights file.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// The prefix PEFT puts before a causal language model's parameter names.
const PEFT_PREFIX: &str = "base_model.model.";

/// `[policy.lora]`: train low-rank adapters instead of the weights.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoraOptions {
    /// Rank of every adapter. By default 8.
    pub rank: usize,
    /// The adapters' output is scaled by `alpha / rank`. By default 32 ("LoRA without
    /// regret": one alpha for every rank keeps the best learning rate nearly independent of
    /// the rank).
    pub alpha: f64,
    /// Dropout on the adapters' input while training. By default 0 (PEFT's default). Drawn
    /// from the backend's generator: a run with dropout is not reproducible bit for bit.
    pub dropout: f64,
    /// The projections that get adapters, by PEFT's names. By default all seven.
    pub target_modules: Vec<String>,
    /// A PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`) to start
    /// from instead of fresh adapters; its rank, alpha and targets are used.
    pub path: Option<PathBuf>,
}

impl Default for LoraOptions {
    fn default() -> Self {
        Self {
            rank: 8,
            alpha: 32.0,
            dropout: 0.0,
            target_modules: TARGET_MODULES.iter().map(|s| (*s).to_owned()).collect(),
            path: None,
        }
    }
}

/// What an adapter is: PEFT's `adapter_config.json`, the fields areal-rs reads and writes.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterConfig {
    /// Rank.
    pub rank: usize,
    /// Scale numerator.
    pub alpha: f64,
    /// Dropout while training.
    pub dropout: f64,
    /// Targeted projections, in [`TARGET_MODULES`] order.
    pub target_modules: Vec<String>,
    /// rsLoRA: the scale is `alpha / √rank`.
    pub rslora: bool,
    /// The base model, as PEFT records it (a path or a hub name; informative).
    pub base_model: Option<String>,
}

fn failed(message: impl Into<String>) -> PluginError {
    PluginError::failed(crate::NAME, message)
}

impl AdapterConfig {
    /// The adapter `options` describe (checked: a rank of at least 1, a finite alpha, a
    /// dropout in [0, 1), known and distinct targets). Errors name the key.
    pub fn from_options(options: &LoraOptions) -> Result<Self, (&'static str, String)> {
        if options.rank == 0 {
            return Err(("rank", "must be at least 1".into()));
        }
        if !options.alpha.is_finite() || options.alpha <= 0.0 {
            return Err(("alpha", format!("must be above 0, found {}", options.alpha)));
        }
        if !(0.0..1.0).contains(&options.dropout) {
            return Err((
                "dropout",
                format!("must be in [0, 1), found {}", options.dropout),
            ));
        }
        Ok(Self {
            rank: options.rank,
            alpha: options.alpha,
            dropout: options.dropout,
            target_modules: targets(&options.target_modules).map_err(|e| ("target_modules", e))?,
            rslora: false,
            base_model: None,
        })
    }

    /// The factor of the adapters' output.
    pub fn scale(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// As PEFT writes it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": self.base_model,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": self.target_modules,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": self.rslora,
            "use_dora": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
        })
    }

    /// Read PEFT's `adapter_config.json`; what areal-rs cannot apply (DoRA, biases, per-module
    /// ranks, other modules trained alongside, a subset of layers) is refused by its key.
    pub fn from_json(json: &serde_json::Value) -> Result<Self, String> {
        let field = |key: &str| json.get(key).filter(|v| !v.is_null());
        let peft_type = field("peft_type")
            .and_then(|v| v.as_str())
            .unwrap_or("LORA");
        if peft_type != "LORA" {
            return Err(format!("`peft_type` is {peft_type:?}, not \"LORA\""));
        }
        let rank = field("r")
            .and_then(serde_json::Value::as_u64)
            .filter(|&r| r > 0)
            .ok_or("`r` must be a rank of at least 1")? as usize;
        let alpha = match field("lora_alpha") {
            None => 8.0, // PEFT's default
            Some(v) => v.as_f64().ok_or("`lora_alpha` must be a number")?,
        };
        let dropout = match field("lora_dropout") {
            None => 0.0,
            Some(v) => v.as_f64().ok_or("`lora_dropout` must be a number")?,
        };
        let refuse = |key: &str, ok: &dyn Fn(&serde_json::Value) -> bool| match field(key) {
            Some(v) if !ok(v) => Err(format!("`{key}` = {v} is not supported")),
            _ => Ok(()),
        };
        let empty = |v: &serde_json::Value| v.as_object().is_some_and(|o| o.is_empty());
        refuse("use_dora", &|v| v == &serde_json::Value::Bool(false))?;
        refuse("bias", &|v| v == "none")?;
        refuse("fan_in_fan_out", &|v| v == &serde_json::Value::Bool(false))?;
        refuse("rank_pattern", &empty)?;
        refuse("alpha_pattern", &empty)?;
        refuse("modules_to_save", &|v| {
            v.as_array().is_some_and(Vec::is_empty)
        })?;
        refuse("layers_to_transform", &|_| false)?;
        refuse("lora_bias", &|v| v == &serde_json::Value::Bool(false))?;
        let target_modules = match field("target_modules") {
            Some(serde_json::Value::String(s)) if s == "all-linear" => {
                TARGET_MODULES.iter().map(|s| (*s).to_owned()).collect()
            }
            Some(serde_json::Value::Array(names)) => {
                let names: Vec<String> = names
                    .iter()
                    .map(|n| n.as_str().map(str::to_owned))
                    .collect::<Option<_>>()
                    .ok_or("`target_modules` must be a list of names")?;
                targets(&names).map_err(|e| format!("`target_modules`: {e}"))?
            }
            Some(other) => {
                return Err(format!(
                    "`target_modules` = {other} is not supported (a list of names, or \"all-linear\")"
                ));
            }
            None => return Err("`target_modules` is missing".into()),
        };
        let rslora = field("use_rslora").and_then(serde_json::Value::as_bool) == Some(true);
        Ok(Self {
            rank,
            alpha,
            dropout,
            target_modules,
            rslora,
            base_model: field("base_model_name_or_path")
                .and_then(|v| v.as_str())
                .map(str::to_owned),
        })
    }
}

/// `names` checked: each a projection of [`TARGET_MODULES`], or a module path ending in one
/// (`model.layers.0.self_attn.q_proj`, as PEFT saves `"all-linear"`). Short names come out in
/// [`TARGET_MODULES`] order, each once; paths as given.
fn targets(names: &[String]) -> Result<Vec<String>, String> {
    if names.is_empty() {
        return Err("names no projection".into());
    }
    let projection = |n: &str| {
        let last = n.rsplit('.').next().unwrap_or(n);
        TARGET_MODULES.contains(&last)
    };
    if let Some(bad) = names.iter().find(|n| !projection(n)) {
        return Err(format!(
            "{bad:?} is not a projection of the model (one of {})",
            TARGET_MODULES.join(", ")
        ));
    }
    let mut out: Vec<String> = TARGET_MODULES
        .iter()
        .filter(|t| names.iter().any(|n| n == *t))
        .map(|s| (*s).to_owned())
        .collect();
    out.extend(names.iter().filter(|n| n.contains('.')).cloned());
    Ok(out)
}

impl AdapterConfig {
    /// Whether the projection `name` of layer `layer` (in block `kind`) gets an adapter, as
    /// PEFT matches `target_modules`: the module's name, or its path, or a path it ends with.
    pub fn targets(&self, layer: usize, kind: &str, name: &str) -> bool {
        let path = format!("model.layers.{layer}.{kind}.{name}");
        self.target_modules
            .iter()
            .any(|t| t == name || path == *t || path.ends_with(&format!(".{t}")))
    }
}

impl DecoderLayer {
    /// The seven projections with their paths within the layer.
    fn projections(&self) -> [(&'static str, &'static str, &Proj); 7] {
        let (a, m) = (&self.self_attn, &self.mlp);
        [
            ("self_attn", "q_proj", &a.q_proj),
            ("self_attn", "k_proj", &a.k_proj),
            ("self_attn", "v_proj", &a.v_proj),
            ("self_attn", "o_proj", &a.o_proj),
            ("mlp", "gate_proj", &m.gate_proj),
            ("mlp", "up_proj", &m.up_proj),
            ("mlp", "down_proj", &m.down_proj),
        ]
    }

    fn projections_mut(&mut self) -> [(&'static str, &'static str, &mut Proj); 7] {
        let (a, m) = (&mut self.self_attn, &mut self.mlp);
        [
            ("self_attn", "q_proj", &mut a.q_proj),
            ("self_attn", "k_proj", &mut a.k_proj),
            ("self_attn", "v_proj", &mut a.v_proj),
            ("self_attn", "o_proj", &mut a.o_proj),
            ("mlp", "gate_proj", &mut m.gate_proj),
            ("mlp", "up_proj", &mut m.up_proj),
            ("mlp", "down_proj", &mut m.down_proj),
        ]
    }
}

/// PEFT's key of an adapter matrix (`A` or `B`) of `kind.name` in layer `layer`.
fn peft_key(layer: usize, kind: &str, name: &str, matrix: &str) -> String {
    format!("{PEFT_PREFIX}model.layers.{layer}.{kind}.{name}.lora_{matrix}.weight")
}

fn plain(t: Tensor<2>) -> NamedTensor {
    let [a, b] = t.dims();
    NamedTensor {
        name: String::new(),
        shape: vec![a, b],
        data: t
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("converted to f32"),
    }
}

impl Transformer {
    /// Whether any projection has an adapter.
    pub fn has_lora(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.projections().iter().any(|(_, _, p)| p.lora.is_some()))
    }

    /// Whether adapters of `config` fit this model, checked before anything is allocated: a
    /// rank past a projection's larger side adds nothing a full matrix could not, and a huge
    /// one would claim memory by itself.
    pub fn check_lora(&self, config: &AdapterConfig) -> Result<(), PluginError> {
        let r = config.rank;
        for (i, layer) in self.layers.iter().enumerate() {
            for (kind, name, proj) in layer.projections() {
                if !config.targets(i, kind, name) {
                    continue;
                }
                let [d_in, d_out] = proj.weight.val().dims();
                if r > d_in.max(d_out) {
                    return Err(failed(format!(
                        "rank {r} is past the {d_in}×{d_out} of layer {i}'s {name}: at most {}",
                        d_in.max(d_out)
                    )));
                }
            }
        }
        Ok(())
    }

    /// This model with adapters described by `config` on its targeted projections, everything
    /// else frozen but a value head: fresh adapters drawn from `seed` (`B = 0`: the model
    /// computes what the base does), or `tensors` in PEFT's names and layout, each present
    /// with its shape and no other.
    pub fn with_lora(
        self,
        config: &AdapterConfig,
        tensors: Option<Vec<NamedTensor>>,
        seed: u64,
    ) -> Result<Self, PluginError> {
        let device = self.embed_tokens.weight.val().device();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut given: Option<BTreeMap<String, NamedTensor>> =
            tensors.map(|ts| ts.into_iter().map(|t| (t.name.clone(), t)).collect());
        let r = config.rank;
        self.check_lora(config)?;
        let value_head = self.value_head.clone();
        let mut model = self.no_grad();
        for (i, layer) in model.layers.iter_mut().enumerate() {
            for (kind, name, proj) in layer.projections_mut() {
                if !config.targets(i, kind, name) {
                    continue;
                }
                let [d_in, d_out] = proj.weight.val().dims();
                let (a, b) = match &mut given {
                    None => {
                        let bound = 1.0 / (d_in as f64).sqrt();
                        let a: Vec<f32> = (0..d_in * r)
                            .map(|_| (rng.random::<f64>() * 2.0 - 1.0) * bound)
                            .map(|x| x as f32)
                            .collect();
                        (
                            Tensor::<2>::from_data(TensorData::new(a, [d_in, r]), &device),
                            Tensor::<2>::zeros([r, d_out], &device),
                        )
                    }
                    Some(given) => {
                        let mut take = |matrix: &str, shape: [usize; 2]| {
                            let key = peft_key(i, kind, name, matrix);
                            let t = given
                                .remove(&key)
                                .ok_or_else(|| failed(format!("the adapter has no `{key}`")))?;
                            if t.shape != shape {
                                return Err(failed(format!(
                                    "`{key}` has shape {:?}; rank {r} on this model needs {shape:?}",
                                    t.shape
                                )));
                            }
                            Ok(crate::hf::transposed(&t.data, shape, &device))
                        };
                        (take("A", [r, d_in])?, take("B", [d_out, r])?)
                    }
                };
                proj.lora = Some(Lora {
                    a: Param::from_tensor(a),
                    b: Param::from_tensor(b),
                    dropout: DropoutConfig::new(config.dropout).init(),
                    scale: config.scale(),
                });
            }
        }
        if let Some(extra) = given.as_ref().and_then(|g| g.keys().next()) {
            return Err(failed(format!(
                "the adapter has {} tensor(s) this model and its targets do not use, e.g. `{extra}`",
                given.as_ref().map_or(0, BTreeMap::len)
            )));
        }
        model.value_head = value_head;
        Ok(model)
    }

    /// The adapters as PEFT saves them (`[rank, in]` and `[out, rank]` under its keys), layer
    /// by layer in projection order.
    pub fn adapter_tensors(&self) -> Vec<NamedTensor> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (kind, name, proj) in layer.projections() {
                if let Some(lora) = &proj.lora {
                    for (matrix, t) in [("A", lora.a.val()), ("B", lora.b.val())] {
                        out.push(NamedTensor {
                            name: peft_key(i, kind, name, matrix),
                            ..plain(t.transpose())
                        });
                    }
                }
            }
        }
        out
    }

    /// This model (its adapters, if any, taken off) with `adapter` on, as a generator receives
    /// it ([`areal_sdk::WeightUpdate::adapter`]).
    pub fn adapted(&self, adapter: &areal_sdk::Adapter) -> Result<Self, PluginError> {
        let config = AdapterConfig::from_json(&adapter.config)
            .map_err(|e| failed(format!("adapter_config: {e}")))?;
        self.without_lora()
            .with_lora(&config, Some(adapter.tensors.clone()), 0)
    }

    /// The base: this model with every adapter taken off (the weights are shared, not copied).
    pub fn without_lora(&self) -> Self {
        let mut model = self.clone();
        for layer in &mut model.layers {
            for (_, _, proj) in layer.projections_mut() {
                proj.lora = None;
            }
        }
        model
    }

    /// The adapters folded into the weights (`W + scale · A·B`), none left.
    pub fn merged(&self) -> Self {
        let mut model = self.clone();
        for layer in &mut model.layers {
            for (_, _, proj) in layer.projections_mut() {
                if proj.lora.is_some() {
                    let weight = proj.merged_weight().detach();
                    proj.weight = Param::from_tensor(weight);
                    proj.lora = None;
                }
            }
        }
        model
    }
}

/// An error with its causes, on one line.
pub(crate) use areal_sdk::error_chain as chain;

fn caused(message: impl Into<String>, source: impl Into<areal_sdk::BoxError>) -> PluginError {
    PluginError::caused_by(crate::NAME, message, source)
}

/// Write an adapter folder as PEFT does.
pub fn save_adapter(
    dir: &Path,
    config: &AdapterConfig,
    tensors: &[NamedTensor],
) -> Result<(), PluginError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| caused(format!("cannot create {}", dir.display()), e))?;
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let json = serde_json::to_string_pretty(&config.to_json()).expect("json");
    std::fs::write(&path, json + "\n")
        .map_err(|e| caused(format!("cannot write {}", path.display()), e))?;
    let metadata = std::collections::HashMap::from([("format".to_owned(), "pt".to_owned())]);
    areal_sdk_train::weights_file::write_safetensors(
        &dir.join(ADAPTER_WEIGHTS_FILE),
        tensors,
        &metadata,
    )
    .map_err(|e| caused("cannot save the adapter", e))
}

/// Read a PEFT adapter folder: its configuration and tensors.
pub fn load_adapter(dir: &Path) -> Result<(AdapterConfig, Vec<NamedTensor>), PluginError> {
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let bytes = areal_sdk::resources::read_file(&path, areal_sdk::resources::MAX_JSON_FILE_BYTES)
        .map_err(|e| caused(format!("cannot read {}", path.display()), e))?;
    let json: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| caused(format!("{} is not JSON", path.display()), e))?;
    let config =
        AdapterConfig::from_json(&json).map_err(|e| failed(format!("{}: {e}", path.display())))?;
    let weights = dir.join(ADAPTER_WEIGHTS_FILE);
    let (tensors, _) = areal_sdk_train::weights_file::read_safetensors(&weights)
        .map_err(|e| caused("cannot load the adapter", e))?;
    NamedTensor::check_finite(&tensors)
        .map_err(|what| failed(format!("{}: {what}", weights.display())))?;
    Ok((config, tensors))
}

/// Whether `dir` is a PEFT adapter folder (it has `adapter_config.json`).
pub fn is_adapter(dir: &Path) -> bool {
    dir.join(ADAPTER_CONFIG_FILE).is_file()
}

/// Fold the PEFT adapter in `adapter` into the checkpoint `base` and write the result as a full
/// checkpoint folder `out` (on the CPU); the adapter's configuration.
///
/// `out` must be new or an empty folder, unless `overwrite`; it is never a link. The
/// checkpoint is written into a folder of its own made beside `out` (only files it creates,
/// in a folder no one else has written to), which then takes `out`'s place: a link planted in
/// `out` is never written through, and a merge that fails leaves `out` as it was.
pub fn merge_adapter(
    base: &Path,
    adapter: &Path,
    out: &Path,
    overwrite: bool,
) -> Result<AdapterConfig, PluginError> {
    let replaced = check_output(out, overwrite)?;
    let device = burn::tensor::Device::flex();
    let (config, model, tokenizer) = crate::hf::load_checkpoint(base, &device)?;
    let (adapter_config, tensors) = load_adapter(adapter)?;
    let merged = model
        .with_lora(&adapter_config, Some(tensors), 0)
        .map_err(|e| {
            caused(
                format!(
                    "the adapter {} does not fit the base {}",
                    adapter.display(),
                    base.display()
                ),
                e,
            )
        })?
        .merged();
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .map_err(|e| caused(format!("cannot create {}", parent.display()), e))?;
    let fresh = fresh_folder(&parent, out)?;
    let written = crate::hf::save_checkpoint(&fresh, &config, &merged, &tokenizer).and_then(|()| {
        if replaced {
            std::fs::remove_dir_all(out)
                .map_err(|e| caused(format!("cannot remove {}", out.display()), e))?;
        }
        std::fs::rename(&fresh, out).map_err(|e| {
            caused(
                format!("cannot move the checkpoint to {}", out.display()),
                e,
            )
        })
    });
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&fresh);
    }
    written.map(|()| adapter_config)
}

/// Whether `out` may take a merged checkpoint: `Ok(true)` when a folder there will be
/// replaced (`overwrite`), `Ok(false)` when it is new or an empty folder.
fn check_output(out: &Path, overwrite: bool) -> Result<bool, PluginError> {
    let meta = match std::fs::symlink_metadata(out) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(caused(format!("cannot read {}", out.display()), e)),
    };
    if meta.file_type().is_symlink() {
        return Err(failed(format!(
            "{} is a link: give the folder itself, or a new one",
            out.display()
        )));
    }
    if !meta.is_dir() {
        return Err(failed(format!("{} is not a folder", out.display())));
    }
    let empty = std::fs::read_dir(out)
        .map_err(|e| caused(format!("cannot read {}", out.display()), e))?
        .next()
        .is_none();
    match (empty, overwrite) {
        (true, _) => Ok(false),
        (false, true) => Ok(true),
        (false, false) => Err(failed(format!(
            "{} is not empty{}: give a new folder, or --overwrite to replace it",
            out.display(),
            if out.join(crate::hf::CONFIG_FILE).exists() {
                " (it already holds a checkpoint)"
            } else {
                ""
            }
        ))),
    }
}

/// A new folder in `parent`, made here (no one else's), for what becomes `out`.
fn fresh_folder(parent: &Path, out: &Path) -> Result<PathBuf, PluginError> {
    let name = out
        .file_name()
        .map_or_else(|| "merged".into(), |n| n.to_string_lossy().into_owned());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for k in 0u32.. {
        let path = parent.join(format!(
            ".{name}.merging-{}-{nanos}-{k}",
            std::process::id()
        ));
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && k < 100 => {}
            Err(e) => return Err(caused(format!("cannot create {}", path.display()), e)),
        }
    }
    unreachable!("the loop returns")
}
