//! A decoder-only transformer for areal-rs, in burn: token embedding, pre-norm decoder layers
//! (RMSNorm, rotary self-attention with grouped key/value heads, SwiGLU), a final norm and an
//! output projection (tied or not) — the Llama/Qwen2 family. Parameters are named and laid
//! out as Hugging Face does, and checkpoints are folders of `config.json`,
//! `model.safetensors` and `tokenizer.json`, so real Qwen2/Llama checkpoints load with the same
//! code.
//!
//! Registered as the `transformer` policy:
//!
//! ```toml
//! [policy]
//! kind = "transformer"
//! path = "runs/warmup/checkpoint"   # or a fresh model:
//! # alphabet = "0123456789+=*, \n"
//! # hidden_size = 128
//! ```
//!
//! ```
//! use areal_model::{ModelConfig, Transformer, char_tokenizer};
//! use areal_sdk::Tokenizer;
//! use burn::tensor::{Device, Int, Tensor, TensorData};
//!
//! let tokenizer = char_tokenizer("0123456789+=").unwrap();
//! let config = ModelConfig::small(tokenizer.vocab_size(), 32, 2, 4, 2, 64);
//! let model = Transformer::new(&config, 7, &Device::flex());
//! let ids: Vec<i64> = tokenizer.encode("12+3=").unwrap().into_iter().map(i64::from).collect();
//! let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, 5]), &Device::flex());
//! assert_eq!(model.forward(tokens).dims(), [1, 5, config.vocab_size]);
//! ```

mod chat;
mod config;
pub mod fused;
pub mod hf;
mod lora;
mod model;
mod policy;
mod tokenizer;

pub use areal_sdk::ChatMessage;
pub use chat::{CHAT_TEMPLATE_FILE, ChatTemplate, TOKENIZER_CONFIG_FILE};
pub use config::{EosTokens, Llama3Scaling, ModelConfig};
pub use lora::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterConfig, LoraOptions, TARGET_MODULES,
    is_adapter, load_adapter, merge_adapter, save_adapter,
};
pub use model::{
    Attention, DecoderLayer, INIT_STD, LayerKv, Lora, Mlp, Proj, Rope, Transformer, rope_tables,
};
pub use policy::{ADAPTER_DIR, TransformerOptions, TransformerPolicy, packed_logprobs};
pub use tokenizer::{EOS, HfTokenizer, TOKENIZER_SIDE_FILES, UNK, char_tokenizer};

/// The name the transformer policy is registered under (`[policy] kind = "transformer"`).
pub const NAME: &str = "transformer";

areal_sdk_train::register_policy!(
    NAME,
    "decoder-only transformer (RMSNorm, RoPE, GQA, SwiGLU) in the Hugging Face layout",
    policy::build
);
