//! The transformer: policy conformance, Hugging Face round trips, KV-cache decoding.

use std::path::PathBuf;

use areal_model::hf::{export, import, load_checkpoint};
use areal_model::{
    LayerKv, ModelConfig, Transformer, TransformerOptions, TransformerPolicy, char_tokenizer,
};
use areal_sdk::Tokenizer;
use areal_sdk_train::burn::module::Module;
use areal_sdk_train::burn::optim::AdamWConfig;
use areal_sdk_train::burn::tensor::{Device, Int, Tensor, TensorData};
use areal_sdk_train::{PackedBatch, Policy};
use areal_testkit::conformance;

const ALPHABET: &str = "0123456789+=, ";

fn options(hidden: usize, layers: usize, heads: usize, kv_heads: usize) -> TransformerOptions {
    TransformerOptions {
        hidden_size: hidden,
        layers,
        heads,
        kv_heads,
        max_positions: 64,
        ..TransformerOptions::default()
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn sequences(t: &dyn Tokenizer) -> Vec<Vec<u32>> {
    ["12+34=46", "7+8=15,", "123+4=127", "1=1"]
        .iter()
        .map(|s| t.encode(s).unwrap())
        .collect()
}

#[test]
fn transformer_policy_conforms() {
    let device = Device::flex().autodiff();
    for (heads, kv) in [(4, 2), (4, 4), (2, 1)] {
        let mut policy =
            TransformerPolicy::fresh(&options(32, 2, heads, kv), ALPHABET, 5, &device).unwrap();
        let seqs = sequences(policy.tokenizer().as_ref());
        let mut optimizer = AdamWConfig::new().init();
        conformance::check_policy(&mut policy, &mut optimizer, &seqs);
    }
}

#[test]
fn checkpoints_round_trip_in_the_hugging_face_layout() {
    let device = Device::flex();
    let policy = TransformerPolicy::fresh(&options(32, 2, 4, 2), ALPHABET, 9, &device).unwrap();
    let dir = tempfile::tempdir().unwrap();
    policy.save(dir.path()).unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(dir.path().join(file).exists(), "{file}");
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(config["num_key_value_heads"], 2);

    let loaded = TransformerPolicy::load(dir.path(), &device).unwrap();
    let mut batch = PackedBatch::new(0.7);
    for s in sequences(policy.tokenizer().as_ref()) {
        batch.push(&s);
    }
    let a = values(policy.logprobs_no_grad(&batch).unwrap());
    let b = values(loaded.logprobs_no_grad(&batch).unwrap());
    assert_eq!(a, b, "a saved and loaded model computes the same logprobs");
    assert_eq!(
        loaded.tokenizer().encode("12+3").unwrap(),
        policy.tokenizer().encode("12+3").unwrap()
    );
    // generation stops at generation_config.json's end tokens too, after config.json's
    let own = policy.tokenizer().stop_token_ids();
    std::fs::write(
        dir.path().join("generation_config.json"),
        format!(
            r#"{{"eos_token_id": [{}, 3], "temperature": 0.7, "top_k": 20}}"#,
            own[0]
        ),
    )
    .unwrap();
    let with_generation = TransformerPolicy::load(dir.path(), &device).unwrap();
    assert_eq!(with_generation.tokenizer().stop_token_ids(), [own[0], 3]);
    let generation = areal_model::hf::read_generation_config(dir.path())
        .unwrap()
        .unwrap();
    assert_eq!(
        (generation.temperature, generation.top_k),
        (Some(0.7), Some(20))
    );
    std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();

    // names and layouts are Hugging Face's: q_proj is [out, in], norms are `weight`
    let names: Vec<String> = policy.weights().iter().map(|t| t.name.clone()).collect();
    assert!(names.contains(&"model.layers.1.self_attn.q_proj.bias".to_owned()));
    assert!(names.contains(&"model.layers.0.post_attention_layernorm.weight".to_owned()));
    assert!(
        !names.iter().any(|n| n.starts_with("lm_head")),
        "tied embeddings"
    );
    let k = policy
        .weights()
        .into_iter()
        .find(|t| t.name == "model.layers.0.self_attn.k_proj.weight")
        .unwrap();
    assert_eq!(k.shape, vec![16, 32], "[kv_heads · head_dim, hidden]");
}

/// A checkpoint's chat template renders prompts through the SDK's tokenizer, exactly as
/// transformers renders them (the `chatml` case of the chat fixtures), and survives saving:
/// the tokenizer's side files (settings, template, generation settings) are written back, so
/// the saved model keeps its chat format and its stop tokens.
#[test]
fn a_checkpoints_chat_template_and_stop_tokens_survive_saving() {
    use areal_model::ChatMessage;
    let device = Device::flex();
    let policy = TransformerPolicy::fresh(&options(32, 2, 4, 2), ALPHABET, 9, &device).unwrap();
    let error = policy
        .tokenizer()
        .chat_prompt(&[ChatMessage::new("user", "1+2")])
        .unwrap_err()
        .to_string();
    assert!(error.contains("no chat template"), "{error}");

    let dir = tempfile::tempdir().unwrap();
    policy.save(dir.path()).unwrap();
    let chat = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat");
    for file in ["chat_template.jinja", "tokenizer_config.json"] {
        std::fs::copy(chat.join("chatml").join(file), dir.path().join(file)).unwrap();
    }
    let own = policy.tokenizer().stop_token_ids()[0];
    std::fs::write(
        dir.path().join("generation_config.json"),
        format!(r#"{{"eos_token_id": [{own}, 5]}}"#),
    )
    .unwrap();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chat.join("expected.json")).unwrap())
            .unwrap();
    let case = expected["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["template"] == "chatml"
                && c["add_generation_prompt"] == true
                && c["messages"].as_array().unwrap().len() == 1
        })
        .unwrap();
    let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();

    let loaded = TransformerPolicy::load(dir.path(), &device).unwrap();
    let rendered = loaded.tokenizer().chat_prompt(&messages).unwrap();
    assert_eq!(rendered, case["expected"].as_str().unwrap());
    assert_eq!(loaded.tokenizer().stop_token_ids(), [own, 5]);

    let again = tempfile::tempdir().unwrap();
    loaded.save(again.path()).unwrap();
    for file in [
        "chat_template.jinja",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert_eq!(
            std::fs::read(again.path().join(file)).unwrap(),
            std::fs::read(dir.path().join(file)).unwrap(),
            "{file} is written back as it was"
        );
    }
    let reloaded = TransformerPolicy::load(again.path(), &device).unwrap();
    assert_eq!(
        reloaded.tokenizer().chat_prompt(&messages).unwrap(),
        rendered
    );
    assert_eq!(reloaded.tokenizer().stop_token_ids(), [own, 5]);
}

#[test]
fn import_names_what_is_wrong() {
    let device = Device::flex();
    let mut config = ModelConfig::small(16, 32, 2, 4, 2, 64);
    let model = Transformer::new(&config, 1, &device);
    let mut tensors = export(&model);
    tensors.retain(|t| t.name != "model.layers.1.mlp.up_proj.weight");
    let err = import(&config, tensors.clone(), &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.layers.1.mlp.up_proj.weight"), "{err}");
    config.intermediate_size += 16;
    let err = import(&config, export(&model), &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("gate_proj") && err.contains("shape"), "{err}");
    config.intermediate_size -= 16;
    config.tie_word_embeddings = false;
    let err = import(&config, export(&model), &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("lm_head.weight"), "{err}");
    let missing = load_checkpoint(std::path::Path::new("/nonexistent/ckpt"), &device)
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("/nonexistent/ckpt/config.json"),
        "{missing}"
    );
}

/// Decoding token by token from a cache, rows at different positions, gives the logits of a
/// full forward pass.
#[test]
fn cached_decoding_matches_the_full_forward() {
    let device = Device::flex();
    let tokenizer = char_tokenizer(ALPHABET).unwrap();
    for tie in [true, false] {
        let mut config = ModelConfig::small(tokenizer.vocab_size(), 32, 2, 4, 2, 64);
        config.tie_word_embeddings = tie;
        let model = Transformer::new(&config, 3, &device).valid();
        let prompts = sequences(&tokenizer);
        let capacity = 16;
        let [kvh, hd] = [config.kv_heads(), config.head_dim()];
        let mut cache: Vec<LayerKv> = (0..config.num_hidden_layers)
            .map(|_| LayerKv {
                k: Tensor::zeros([prompts.len(), kvh, capacity, hd], &device),
                v: Tensor::zeros([prompts.len(), kvh, capacity, hd], &device),
            })
            .collect();
        // prefill every prompt but its last token, each into its own row
        for (row, p) in prompts.iter().enumerate() {
            let n = p.len() - 1;
            let ids: Vec<i64> = p[..n].iter().map(|&x| i64::from(x)).collect();
            let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), &device);
            let (_, kvs) = model.forward_with_kv(tokens);
            for (layer, kv) in cache.iter_mut().zip(kvs) {
                layer.k = layer
                    .k
                    .clone()
                    .slice_assign([row..row + 1, 0..kvh, 0..n, 0..hd], kv.k);
                layer.v = layer
                    .v
                    .clone()
                    .slice_assign([row..row + 1, 0..kvh, 0..n, 0..hd], kv.v);
            }
        }
        // then feed the last prompt token and two more, all rows at once
        let mut seqs: Vec<Vec<u32>> = prompts.iter().map(|p| p[..p.len() - 1].to_vec()).collect();
        let mut next: Vec<u32> = prompts.iter().map(|p| *p.last().unwrap()).collect();
        for _ in 0..3 {
            let positions: Vec<usize> = seqs.iter().map(Vec::len).collect();
            let ids: Vec<i64> = next.iter().map(|&x| i64::from(x)).collect();
            let tokens =
                Tensor::<2, Int>::from_data(TensorData::new(ids, [next.len(), 1]), &device);
            let logits = values(model.decode_step(tokens, &positions, &mut cache));
            for (row, seq) in seqs.iter_mut().enumerate() {
                seq.push(next[row]);
                let ids: Vec<i64> = seq.iter().map(|&x| i64::from(x)).collect();
                let n = ids.len();
                let full = model.forward(Tensor::<2, Int>::from_data(
                    TensorData::new(ids, [1, n]),
                    &device,
                ));
                let last = values(full.narrow(1, n - 1, 1).reshape([config.vocab_size]));
                let got = &logits[row * config.vocab_size..(row + 1) * config.vocab_size];
                assert!(
                    max_diff(got, &last) < 1e-4,
                    "row {row} at position {}: {}",
                    n - 1,
                    max_diff(got, &last)
                );
                next[row] = (row as u32 + n as u32) % 12 + 2;
            }
        }
    }
}

#[test]
fn a_fresh_policy_needs_an_alphabet() {
    use areal_model as _;
    use areal_sdk::{BuildContext, PluginConfig};
    use areal_sdk_train::{PolicyContext, PolicyPlugin};
    let ctx = PolicyContext::new(BuildContext::new(1, 1), Device::flex().autodiff());
    let err = PolicyPlugin::build_from(&PluginConfig::new("policy", "transformer"), &ctx)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("`policy.alphabet`"), "{err}");
    let cfg = PluginConfig::new("policy", "transformer")
        .with("alphabet", "01+=")
        .with("hidden_size", 16)
        .with("heads", 2)
        .with("kv_heads", 1);
    let policy = PolicyPlugin::build_from(&cfg, &ctx).unwrap();
    assert_eq!(policy.tokenizer().vocab_size(), 6);
}

/// Logits agree with an independent numpy implementation of Hugging Face's Qwen2 forward pass
/// (tests/fixtures/qwen2_reference.py) on a checkpoint it wrote: names, `[out, in]` layouts,
/// rotate-half RoPE, grouped key/value heads, biases and an untied head are all read as
/// Hugging Face means them.
#[test]
fn logits_match_the_qwen2_reference() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2-tiny");
    let config: ModelConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let tensors = areal_model::hf::read_safetensors(&dir.join("model.safetensors")).unwrap();
    let device = Device::flex();
    let model = import(&config, tensors, &device).unwrap();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    for (tokens, logits) in expected["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .zip(expected["logits"].as_array().unwrap())
    {
        let ids: Vec<i64> = tokens
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap())
            .collect();
        let n = ids.len();
        let got = values(model.forward(Tensor::<2, Int>::from_data(
            TensorData::new(ids, [1, n]),
            &device,
        )));
        let want: Vec<f32> = logits
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
            })
            .collect();
        assert!(
            max_diff(&got, &want) < 1e-4,
            "logits differ from the reference by {}",
            max_diff(&got, &want)
        );
    }
}
