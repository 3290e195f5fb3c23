//! The model's `config.json`, in Hugging Face's field names (Qwen2, Qwen3, Llama).

use serde::{Deserialize, Serialize};

/// Architecture of a decoder-only transformer, as Hugging Face writes it in `config.json`.
///
/// Unknown fields are ignored, so real Qwen2, Qwen3 and Llama configs load; values this
/// implementation does not support (sliding windows, RoPE scaling other than `llama3`, MLP
/// biases) are rejected by [`ModelConfig::check`], naming the field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Model class names; written as `["Qwen2ForCausalLM"]`.
    #[serde(default = "default_architectures")]
    pub architectures: Vec<String>,
    /// `"qwen2"`, `"qwen3"` or `"llama"`.
    #[serde(default = "default_model_type")]
    pub model_type: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU feed-forward layer.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Width of one head, when it is not `hidden_size / num_attention_heads` (Qwen3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Key/value heads (grouped-query attention); defaults to the query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Longest sequence the model is meant for.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Whether the output projection is the transposed input embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have a bias (Qwen2: yes; Llama: no).
    #[serde(default)]
    pub attention_bias: Option<bool>,
    /// Beginning-of-sequence token, if any.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token(s).
    #[serde(default)]
    pub eos_token_id: Option<EosTokens>,
    /// RoPE scaling: absent, null, or of type `llama3` (Llama 3.1 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
    /// Whether the feed-forward projections have biases (not supported when true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_bias: Option<bool>,
    /// Sliding-window attention (not supported when enabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    /// Tensor dtype of the checkpoint, informative.
    #[serde(default = "default_dtype")]
    pub torch_dtype: String,
}

/// `eos_token_id` is a number or a list in Hugging Face configs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EosTokens {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl EosTokens {
    /// The ids.
    pub fn ids(&self) -> Vec<u32> {
        match self {
            EosTokens::One(id) => vec![*id],
            EosTokens::Many(ids) => ids.clone(),
        }
    }
}

/// RoPE scaling of type `llama3`: low frequencies slowed by `factor`, high ones kept, a smooth
/// blend between (Hugging Face's `_compute_llama3_parameters`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    /// How much the low frequencies are slowed.
    pub factor: f64,
    /// Wavelengths above `original / low_freq_factor` are slowed whole.
    pub low_freq_factor: f64,
    /// Wavelengths below `original / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// The context length the model was first trained for.
    pub original_max_position_embeddings: f64,
}

fn default_architectures() -> Vec<String> {
    vec!["Qwen2ForCausalLM".into()]
}
fn default_model_type() -> String {
    "qwen2".into()
}
fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10_000.0
}
fn default_dtype() -> String {
    "float32".into()
}

impl ModelConfig {
    /// A small Qwen2-style model for `vocab_size` tokens: `layers` layers of width `hidden`,
    /// `heads` query heads, `kv_heads` key/value heads, a SwiGLU 8/3 as wide (rounded up to a
    /// multiple of 16), tied embeddings.
    pub fn small(
        vocab_size: usize,
        hidden: usize,
        layers: usize,
        heads: usize,
        kv_heads: usize,
        max_positions: usize,
    ) -> Self {
        let intermediate = (hidden * 8 / 3).div_ceil(16) * 16;
        Self {
            architectures: default_architectures(),
            model_type: default_model_type(),
            vocab_size,
            hidden_size: hidden,
            intermediate_size: intermediate,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: Some(kv_heads),
            max_position_embeddings: max_positions,
            rms_norm_eps: default_eps(),
            rope_theta: default_theta(),
            tie_word_embeddings: true,
            attention_bias: Some(true),
            bos_token_id: None,
            eos_token_id: None,
            head_dim: None,
            rope_scaling: None,
            mlp_bias: None,
            use_sliding_window: None,
            torch_dtype: default_dtype(),
        }
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Whether queries and keys are RMS-normalised per head before RoPE (Qwen3).
    pub fn qk_norm(&self) -> bool {
        self.model_type == "qwen3"
    }

    /// The `llama3` RoPE scaling, if the config asks for it; an error names the field at
    /// fault for any other scaling.
    pub fn llama3_scaling(&self) -> Result<Option<Llama3Scaling>, String> {
        let Some(scaling) = self.rope_scaling.as_ref().filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let kind = scaling
            .get("rope_type")
            .or_else(|| scaling.get("type"))
            .and_then(|v| v.as_str())
            .unwrap_or("(none)");
        match kind {
            "default" => Ok(None),
            "llama3" => {
                let field = |name: &str| {
                    scaling
                        .get(name)
                        .and_then(serde_json::Value::as_f64)
                        .filter(|v| v.is_finite() && *v > 0.0)
                        .ok_or_else(|| {
                            format!("`rope_scaling.{name}` must be a positive number for llama3")
                        })
                };
                let s = Llama3Scaling {
                    factor: field("factor")?,
                    low_freq_factor: field("low_freq_factor")?,
                    high_freq_factor: field("high_freq_factor")?,
                    original_max_position_embeddings: field("original_max_position_embeddings")?,
                };
                if s.high_freq_factor <= s.low_freq_factor {
                    return Err(
                        "`rope_scaling.high_freq_factor` must exceed `low_freq_factor`".into(),
                    );
                }
                Ok(Some(s))
            }
            other => Err(format!(
                "`rope_scaling.rope_type` {other:?} is not supported (only \"llama3\")"
            )),
        }
    }

    /// Whether q/k/v have biases (Qwen2 by default).
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias.unwrap_or(self.model_type == "qwen2")
    }

    /// Reject shapes and features this implementation cannot run; the message names the field.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{name}` must be positive"));
        }
        if self.head_dim == Some(0) {
            return Err("`head_dim` must be positive".into());
        }
        // a norm of sqrt(mean(x²) + eps) and RoPE's base^(-2i/d) are NaN or infinite otherwise
        for (name, value) in [
            ("rms_norm_eps", self.rms_norm_eps),
            ("rope_theta", self.rope_theta),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(format!("`{name}` {value} must be a positive number"));
            }
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "`hidden_size` {} is not a multiple of `num_attention_heads` {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!(
                "head width {} must be even for RoPE",
                self.head_dim()
            ));
        }
        if !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            return Err(format!(
                "`num_attention_heads` {} is not a multiple of `num_key_value_heads` {}",
                self.num_attention_heads,
                self.kv_heads()
            ));
        }
        self.llama3_scaling()?;
        if self.mlp_bias == Some(true) {
            return Err("`mlp_bias` = true is not supported".into());
        }
        if !["qwen2", "qwen3", "llama"].contains(&self.model_type.as_str()) {
            return Err(format!(
                "`model_type` {:?} is not supported (qwen2, qwen3 or llama)",
                self.model_type
            ));
        }
        if self.use_sliding_window == Some(true) {
            return Err("`use_sliding_window` is not supported".into());
        }
        Ok(())
    }

    /// Parameters of the model (exact for real shapes; saturates rather than wraps for absurd
    /// ones).
    pub fn num_parameters(&self) -> u128 {
        let n = |x: usize| x as u128;
        let (d, f, v) = (
            n(self.hidden_size),
            n(self.intermediate_size),
            n(self.vocab_size),
        );
        let hd = n(self.head_dim());
        let kv = n(self.kv_heads()).saturating_mul(hd);
        let q = n(self.num_attention_heads).saturating_mul(hd);
        let bias = if self.qkv_bias() {
            q.saturating_add(kv.saturating_mul(2))
        } else {
            0
        };
        let qk_norm = if self.qk_norm() {
            hd.saturating_mul(2)
        } else {
            0
        };
        // q is d × q and o is q × d, k and v are d × kv
        let attention = d
            .saturating_mul(q)
            .saturating_mul(2)
            .saturating_add(d.saturating_mul(kv).saturating_mul(2))
            .saturating_add(bias)
            .saturating_add(qk_norm);
        let mlp = d.saturating_mul(f).saturating_mul(3);
        let layer = attention
            .saturating_add(mlp)
            .saturating_add(d.saturating_mul(2));
        let head = if self.tie_word_embeddings {
            0
        } else {
            d.saturating_mul(v)
        };
        v.saturating_mul(d)
            .saturating_add(n(self.num_hidden_layers).saturating_mul(layer))
            .saturating_add(d)
            .saturating_add(head)
    }

    /// Bytes a training run holds for this model: f32 weights, their gradients and AdamW's two
    /// moments on the trainer, and the generator's copy — 5 × 4 bytes per parameter.
    pub fn training_bytes(&self) -> u128 {
        self.num_parameters().saturating_mul(20)
    }

    /// [`ModelConfig::check`], and that a run with this model fits in this machine's memory
    /// ([`ModelConfig::training_bytes`]); the message gives both numbers.
    pub fn check_fits(&self) -> Result<(), String> {
        self.check()?;
        areal_sdk::resources::check_memory(
            &format!(
                "a model of {} parameters ({} layers of width {}; weights, gradients, optimizer state and the generator's copy)",
                self.num_parameters(),
                self.num_hidden_layers,
                self.hidden_size
            ),
            self.training_bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_qwen2_config() {
        // Qwen2.5-0.5B-Instruct's config.json, abridged to the fields that matter plus extras
        let text = r#"{
          "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
          "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
          "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
          "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
          "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
          "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
          "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
          "vocab_size": 151936
        }"#;
        let c: ModelConfig = serde_json::from_str(text).unwrap();
        assert_eq!(c.head_dim(), 64);
        assert_eq!(c.kv_heads(), 2);
        assert!(c.qkv_bias());
        assert_eq!(c.eos_token_id.as_ref().unwrap().ids(), vec![151645]);
        c.check().unwrap();
        // 494M parameters, as published for Qwen2.5-0.5B
        assert_eq!(c.num_parameters(), 494_032_768);
    }

    #[test]
    fn refuses_models_that_cannot_fit_with_the_numbers() {
        // hidden_size 1e6 × 1000 layers, and a checkpoint's num_hidden_layers = 1e9, once
        // aborted on a multi-TB allocation.
        let huge = ModelConfig::small(20, 1_000_000, 1000, 4, 2, 128);
        assert_eq!(huge.num_parameters() / 1_000_000_000_000, 11_000);
        let mut deep = ModelConfig::small(20, 64, 2, 4, 2, 128);
        deep.num_hidden_layers = 1_000_000_000;
        let mut wide = ModelConfig::small(20, 64, 2, 4, 2, 128);
        wide.vocab_size = usize::MAX;
        wide.hidden_size = 1 << 62;
        if areal_sdk::resources::total_memory().is_some() {
            for c in [&huge, &deep, &wide] {
                let err = c.check_fits().unwrap_err();
                assert!(
                    err.contains("needs about") && err.contains("this machine has"),
                    "{err}"
                );
            }
            let err = deep.check_fits().unwrap_err();
            assert!(err.contains("1000000000 layers"), "{err}");
        }
        ModelConfig::small(20, 64, 2, 4, 2, 128)
            .check_fits()
            .unwrap();
    }

    #[test]
    fn rejects_what_it_cannot_run() {
        let mut c = ModelConfig::small(20, 64, 2, 4, 2, 128);
        c.check().unwrap();
        c.num_key_value_heads = Some(3);
        assert!(c.check().unwrap_err().contains("num_key_value_heads"));
        for (eps, theta) in [
            (-1e-6, 1e4),
            (0.0, 1e4),
            (f64::NAN, 1e4),
            (1e-6, 0.0),
            (1e-6, f64::INFINITY),
        ] {
            let mut c = ModelConfig::small(20, 64, 2, 4, 2, 128);
            (c.rms_norm_eps, c.rope_theta) = (eps, theta);
            let err = c.check().unwrap_err();
            assert!(err.contains("must be a positive number"), "{err}");
        }
        let mut c = ModelConfig::small(20, 60, 2, 4, 2, 128);
        c.hidden_size = 66;
        assert!(c.check().unwrap_err().contains("hidden_size"));
        let mut c = ModelConfig::small(20, 64, 2, 4, 2, 128);
        c.rope_scaling = Some(serde_json::json!({"type": "yarn"}));
        assert!(c.check().unwrap_err().contains("rope_scaling"));
    }
}
