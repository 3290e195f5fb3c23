//! Parameters in the Hugging Face layout: names (`model.layers.0.self_attn.q_proj.weight`),
//! PyTorch's `[out, in]` linear weights, `model.safetensors` files and checkpoint folders.

use std::collections::BTreeMap;
use std::path::Path;

use areal_sdk::{NamedTensor, PluginError};
use areal_sdk_train::weights_file;
use burn::module::Param;
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::{Device, Tensor, TensorData};

use crate::config::ModelConfig;
use crate::model::{Attention, DecoderLayer, Mlp, Proj, Transformer};
use crate::tokenizer::HfTokenizer;

fn failed(message: impl Into<String>) -> PluginError {
    PluginError::failed(crate::NAME, message)
}

/// A failure caused by `source` (kept as the error's cause, not flattened into its text).
fn caused(message: impl Into<String>, source: impl Into<areal_sdk::BoxError>) -> PluginError {
    PluginError::caused_by(crate::NAME, message, source)
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("converted to f32")
}

/// Every parameter of `model` under its Hugging Face name, linear weights as `[out, in]`;
/// adapters, if any, folded into the weights they adapt.
pub fn export(model: &Transformer) -> Vec<NamedTensor> {
    let mut out = Vec::new();
    let mut push = |name: String, t: Tensor<2>| {
        let [a, b] = t.dims();
        out.push(NamedTensor {
            name,
            shape: vec![a, b],
            data: values(t),
        });
    };
    push(
        "model.embed_tokens.weight".into(),
        model.embed_tokens.weight.val(),
    );
    let mut vectors = Vec::new();
    for (i, layer) in model.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let a = &layer.self_attn;
        for (name, lin) in [
            ("q_proj", &a.q_proj),
            ("k_proj", &a.k_proj),
            ("v_proj", &a.v_proj),
            ("o_proj", &a.o_proj),
        ] {
            push(
                format!("{p}.self_attn.{name}.weight"),
                lin.merged_weight().transpose(),
            );
            if let Some(bias) = &lin.bias {
                vectors.push((format!("{p}.self_attn.{name}.bias"), bias.val()));
            }
        }
        for (name, norm) in [("q_norm", &a.q_norm), ("k_norm", &a.k_norm)] {
            if let Some(norm) = norm {
                vectors.push((format!("{p}.self_attn.{name}.weight"), norm.gamma.val()));
            }
        }
        let m = &layer.mlp;
        for (name, lin) in [
            ("gate_proj", &m.gate_proj),
            ("up_proj", &m.up_proj),
            ("down_proj", &m.down_proj),
        ] {
            push(
                format!("{p}.mlp.{name}.weight"),
                lin.merged_weight().transpose(),
            );
        }
        vectors.push((
            format!("{p}.input_layernorm.weight"),
            layer.input_layernorm.gamma.val(),
        ));
        vectors.push((
            format!("{p}.post_attention_layernorm.weight"),
            layer.post_attention_layernorm.gamma.val(),
        ));
    }
    vectors.push(("model.norm.weight".into(), model.norm.gamma.val()));
    if let Some(head) = &model.lm_head {
        push("lm_head.weight".into(), head.weight.val().transpose());
    }
    for (name, t) in vectors {
        let [n] = t.dims();
        out.push(NamedTensor {
            name,
            shape: vec![n],
            data: values(t),
        });
    }
    out
}

/// The `[cols, rows]` transpose of row-major `[rows, cols]` data, laid out as a fresh tensor:
/// a transposed view would multiply in another order of sums, and a loaded model or adapter
/// would compute other bits than the one that was saved.
pub(crate) fn transposed(data: &[f32], [rows, cols]: [usize; 2], device: &Device) -> Tensor<2> {
    let mut out = vec![0.0f32; rows * cols];
    for (i, row) in data.chunks(cols).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            out[j * rows + i] = v;
        }
    }
    Tensor::from_data(TensorData::new(out, [cols, rows]), device)
}

/// Tensors by name, taken one by one; what is left at the end was not expected.
struct Source {
    tensors: BTreeMap<String, NamedTensor>,
    device: Device,
}

impl Source {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<NamedTensor, PluginError> {
        let t = self
            .tensors
            .remove(name)
            .ok_or_else(|| failed(format!("checkpoint has no tensor `{name}`")))?;
        if t.shape != shape {
            return Err(failed(format!(
                "tensor `{name}` has shape {:?}, the config implies {shape:?}",
                t.shape
            )));
        }
        Ok(t)
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Tensor<2>, PluginError> {
        let t = self.take(name, &[rows, cols])?;
        Ok(Tensor::from_data(
            TensorData::new(t.data, [rows, cols]),
            &self.device,
        ))
    }

    /// A `[rows, cols]` tensor as the `[cols, rows]` matrix it is the transpose of
    /// ([`transposed`]).
    fn matrix_transposed(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Tensor<2>, PluginError> {
        let t = self.take(name, &[rows, cols])?;
        Ok(transposed(&t.data, [rows, cols], &self.device))
    }

    fn vector(&mut self, name: &str, n: usize) -> Result<Tensor<1>, PluginError> {
        let t = self.take(name, &[n])?;
        Ok(Tensor::from_data(
            TensorData::new(t.data, [n]),
            &self.device,
        ))
    }

    /// A projection from an `[out, in]` weight (and a bias if `bias`).
    fn linear(
        &mut self,
        prefix: &str,
        d_in: usize,
        d_out: usize,
        bias: bool,
    ) -> Result<Proj, PluginError> {
        let weight = self.matrix_transposed(&format!("{prefix}.weight"), d_out, d_in)?;
        let bias = if bias {
            Some(self.vector(&format!("{prefix}.bias"), d_out)?)
        } else {
            None
        };
        Ok(Proj::new(weight, bias))
    }

    fn norm(&mut self, name: &str, d: usize, eps: f64) -> Result<RmsNorm, PluginError> {
        Ok(RmsNorm {
            gamma: Param::from_tensor(self.vector(name, d)?),
            epsilon: eps,
        })
    }
}

/// Build a model with `config`'s architecture from Hugging Face-named tensors. Every tensor
/// the config implies must be present with its shape, and no other (a tied checkpoint may
/// still carry `lm_head.weight`).
pub fn import(
    config: &ModelConfig,
    tensors: Vec<NamedTensor>,
    device: &Device,
) -> Result<Transformer, PluginError> {
    config.check_fits().map_err(|e| caused("config.json", e))?;
    let mut src = Source {
        tensors: tensors.into_iter().map(|t| (t.name.clone(), t)).collect(),
        device: device.clone(),
    };
    let (d, f, v) = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
    );
    let hd = config.head_dim();
    let kv = config.kv_heads() * hd;
    let q = config.num_attention_heads * hd;
    let bias = config.qkv_bias();
    let eps = config.rms_norm_eps;
    let embed = src.matrix("model.embed_tokens.weight", v, d)?;
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for i in 0..config.num_hidden_layers {
        let p = format!("model.layers.{i}");
        layers.push(DecoderLayer {
            self_attn: Attention::new(
                src.linear(&format!("{p}.self_attn.q_proj"), d, q, bias)?,
                src.linear(&format!("{p}.self_attn.k_proj"), d, kv, bias)?,
                src.linear(&format!("{p}.self_attn.v_proj"), d, kv, bias)?,
                src.linear(&format!("{p}.self_attn.o_proj"), q, d, false)?,
                if config.qk_norm() {
                    Some((
                        src.norm(&format!("{p}.self_attn.q_norm.weight"), hd, eps)?,
                        src.norm(&format!("{p}.self_attn.k_norm.weight"), hd, eps)?,
                    ))
                } else {
                    None
                },
                config,
            ),
            mlp: Mlp {
                gate_proj: src.linear(&format!("{p}.mlp.gate_proj"), d, f, false)?,
                up_proj: src.linear(&format!("{p}.mlp.up_proj"), d, f, false)?,
                down_proj: src.linear(&format!("{p}.mlp.down_proj"), f, d, false)?,
            },
            input_layernorm: src.norm(&format!("{p}.input_layernorm.weight"), d, eps)?,
            post_attention_layernorm: src.norm(
                &format!("{p}.post_attention_layernorm.weight"),
                d,
                eps,
            )?,
        });
    }
    let norm = src.norm("model.norm.weight", d, eps)?;
    let lm_head = if config.tie_word_embeddings {
        src.tensors.remove("lm_head.weight");
        None
    } else {
        let head = src.linear("lm_head", d, v, false)?;
        Some(Linear {
            weight: head.weight,
            bias: None,
        })
    };
    if let Some(extra) = src.tensors.keys().next() {
        return Err(failed(format!(
            "checkpoint has {} tensor(s) the config does not use, e.g. `{extra}`",
            src.tensors.len()
        )));
    }
    Ok(Transformer {
        embed_tokens: Embedding {
            weight: Param::from_tensor(embed),
        },
        layers,
        norm,
        lm_head,
        value_head: None,
    })
}

/// Write tensors to a `.safetensors` file as float32.
pub fn write_safetensors(path: &Path, tensors: &[NamedTensor]) -> Result<(), PluginError> {
    weights_file::write_safetensors(path, tensors, &std::collections::HashMap::new())
        .map_err(|e| caused("cannot save the weights", e))
}

/// Read every tensor of a `.safetensors` file as float32 (f32, bf16 and f16 are accepted).
pub fn read_safetensors(path: &Path) -> Result<Vec<NamedTensor>, PluginError> {
    weights_file::read_safetensors(path)
        .map(|(tensors, _)| tensors)
        .map_err(|e| caused("cannot load the weights", e))
}

/// Files of a checkpoint folder.
pub const CONFIG_FILE: &str = "config.json";
/// Weights file of a checkpoint folder.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a checkpoint sharded into several safetensors files.
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

/// Every tensor of the checkpoint folder `dir`: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` names (as Hugging Face saves models over ~5 GB). Each
/// tensor must be in the shard the index says, and each shard hold only indexed tensors.
pub fn read_weights(dir: &Path) -> Result<Vec<NamedTensor>, PluginError> {
    let index_path = dir.join(WEIGHTS_INDEX_FILE);
    if !index_path.exists() {
        return read_safetensors(&dir.join(WEIGHTS_FILE));
    }
    let text = read_json_text(&index_path)?;
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let index: Index = serde_json::from_str(&text)
        .map_err(|e| caused(format!("{}: no `weight_map`", index_path.display()), e))?;
    let mut shards: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (tensor, shard) in &index.weight_map {
        if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
            return Err(failed(format!(
                "{}: shard {shard:?} of `{tensor}` is not a file name in the folder",
                index_path.display()
            )));
        }
        shards.entry(shard).or_default().push(tensor);
    }
    let mut out = Vec::with_capacity(index.weight_map.len());
    for (shard, names) in shards {
        let tensors = read_safetensors(&dir.join(shard))?;
        if let Some(stray) = tensors
            .iter()
            .find(|t| index.weight_map.get(&t.name).map(String::as_str) != Some(shard))
        {
            return Err(failed(format!(
                "{shard} holds `{}`, which {} does not place there",
                stray.name, WEIGHTS_INDEX_FILE
            )));
        }
        if tensors.len() != names.len() {
            let held: std::collections::BTreeSet<&str> =
                tensors.iter().map(|t| t.name.as_str()).collect();
            let missing = names.iter().find(|n| !held.contains(*n)).unwrap_or(&"?");
            return Err(failed(format!(
                "{WEIGHTS_INDEX_FILE} places `{missing}` in {shard}, which does not hold it"
            )));
        }
        out.extend(tensors);
    }
    Ok(out)
}

pub use crate::tokenizer::{GENERATION_CONFIG_FILE, TOKENIZER_FILE};

/// A checkpoint's `generation_config.json`: the tokens that end a generation and the
/// sampling its authors suggest (the run's `rollout` settings decide the sampling; these are
/// read so that they can be reported and compared).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct GenerationConfig {
    /// End-of-sequence token(s): generation stops at these as well as at `config.json`'s.
    #[serde(default)]
    pub eos_token_id: Option<crate::EosTokens>,
    /// Suggested temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Suggested nucleus.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Suggested top-k (not implemented by the burn generator's sampler).
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Whether its authors sample at all.
    #[serde(default)]
    pub do_sample: Option<bool>,
}

/// The `generation_config.json` of `dir`, if it has one.
pub fn read_generation_config(dir: &Path) -> Result<Option<GenerationConfig>, PluginError> {
    let path = dir.join(GENERATION_CONFIG_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = read_json_text(&path)?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| caused(path.display().to_string(), e))
}

/// The tokens that end a generation for the checkpoint in `dir` with `config`: those of
/// `config.json` and of `generation_config.json`, in that order, once each.
pub fn stop_tokens(dir: &Path, config: &ModelConfig) -> Result<Vec<u32>, PluginError> {
    let mut stop = config
        .eos_token_id
        .as_ref()
        .map(|e| e.ids())
        .unwrap_or_default();
    if let Some(generation) = read_generation_config(dir)?
        && let Some(eos) = generation.eos_token_id
    {
        for id in eos.ids() {
            if !stop.contains(&id) {
                stop.push(id);
            }
        }
    }
    Ok(stop)
}

/// Write a checkpoint folder: `config.json`, `model.safetensors`, `tokenizer.json` and the
/// files that came with the tokenizer (its settings, chat template, generation settings).
pub fn save_checkpoint(
    dir: &Path,
    config: &ModelConfig,
    model: &Transformer,
    tokenizer: &HfTokenizer,
) -> Result<(), PluginError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| caused(format!("cannot create {}", dir.display()), e))?;
    let json = serde_json::to_string_pretty(config).expect("the config serialises");
    let path = dir.join(CONFIG_FILE);
    std::fs::write(&path, json + "\n")
        .map_err(|e| caused(format!("cannot write {}", path.display()), e))?;
    write_safetensors(&dir.join(WEIGHTS_FILE), &export(model))?;
    tokenizer.save_to_folder(dir)
}

/// The text of a checkpoint's JSON file: a regular file of at most
/// [`MAX_JSON_FILE_BYTES`](areal_sdk::resources::MAX_JSON_FILE_BYTES) (a folder a server is
/// told to load may name anything).
fn read_json_text(path: &Path) -> Result<String, PluginError> {
    let bytes = areal_sdk::resources::read_file(path, areal_sdk::resources::MAX_JSON_FILE_BYTES)
        .map_err(|e| caused(format!("cannot read {}", path.display()), e))?;
    String::from_utf8(bytes).map_err(|e| caused(format!("cannot read {}", path.display()), e))
}

/// Read a checkpoint folder written by [`save_checkpoint`] or by Hugging Face.
pub fn load_checkpoint(
    dir: &Path,
    device: &Device,
) -> Result<(ModelConfig, Transformer, HfTokenizer), PluginError> {
    let path = dir.join(CONFIG_FILE);
    let text = read_json_text(&path)?;
    let config: ModelConfig =
        serde_json::from_str(&text).map_err(|e| caused(path.display().to_string(), e))?;
    config
        .check_fits()
        .map_err(|e| caused(path.display().to_string(), e))?;
    let tensors = read_weights(dir)?;
    let model =
        import(&config, tensors, device).map_err(|e| caused(dir.display().to_string(), e))?;
    let stop = stop_tokens(dir, &config)?;
    let tokenizer = HfTokenizer::from_folder(dir, stop)?;
    Ok((config, model, tokenizer))
}
