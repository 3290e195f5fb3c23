//! Parity with Hugging Face transformers: small random Qwen2, Qwen3 and Llama 3 models built
//! and saved by transformers (`plugins/model/scripts/make_parity_fixtures.py`), loaded here
//! from their `config.json` and `model.safetensors`. The logits of every position, the greedy
//! continuation of 32 tokens, and decoding with the key/value cache must match transformers'
//! own (`expected.json`), with no Python at test time.

use std::path::PathBuf;

use areal_model::hf::{import, read_safetensors};
use areal_model::{LayerKv, ModelConfig, Transformer};
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::Deserialize;

/// The largest |Δ logit| allowed in f32.
const TOLERANCE: f32 = 1e-4;

#[derive(Deserialize)]
struct Expected {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: Vec<u32>,
    logits: Vec<Vec<f32>>,
    greedy: Vec<u32>,
}

fn fixture(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/parity/{family}"))
}

fn load(family: &str) -> (Transformer, Expected) {
    let dir = fixture(family);
    let config: ModelConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config.check().unwrap_or_else(|e| panic!("{family}: {e}"));
    let tensors = read_safetensors(&dir.join("model.safetensors")).unwrap();
    let model =
        import(&config, tensors, &Device::flex()).unwrap_or_else(|e| panic!("{family}: {e}"));
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    (model, expected)
}

fn tokens(ids: &[u32]) -> Tensor<2, Int> {
    let data: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    Tensor::from_data(TensorData::new(data, [1, ids.len()]), &Device::flex())
}

fn rows(t: Tensor<2>) -> Vec<Vec<f32>> {
    let [n, v] = t.dims();
    let flat = t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    (0..n).map(|i| flat[i * v..(i + 1) * v].to_vec()).collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f32::max)
}

fn logits(model: &Transformer, ids: &[u32]) -> Vec<Vec<f32>> {
    let out = model.forward(tokens(ids));
    let [_, t, v] = out.dims();
    rows(out.reshape([t, v]))
}

/// Every position's logits, the greedy continuation (full forward each step) and the same
/// continuation decoded with the key/value cache, against transformers.
#[allow(clippy::print_stderr, reason = "the test prints what it measured")]
fn check(family: &str) {
    let (model, expected) = load(family);
    let (mut logit_worst, mut cache_worst): (f32, f32) = (0.0, 0.0);
    for (n, case) in expected.cases.iter().enumerate() {
        let got = logits(&model, &case.prompt);
        let diff = max_diff(&got, &case.logits);
        logit_worst = logit_worst.max(diff);
        assert!(
            diff <= TOLERANCE,
            "{family} case {n}: max |Δ logit| {diff:e}"
        );

        // greedy, recomputing the whole sequence each step
        let mut ids = case.prompt.clone();
        for _ in 0..case.greedy.len() {
            let last = logits(&model, &ids).pop().unwrap();
            ids.push(argmax(&last));
        }
        assert_eq!(
            &ids[case.prompt.len()..],
            case.greedy.as_slice(),
            "{family} case {n}: greedy"
        );

        // the same continuation with the key/value cache equals the full forward pass
        let capacity = case.prompt.len() + case.greedy.len();
        let (prefill, kvs) = model.forward_with_kv(tokens(&case.prompt));
        let [_, t, v] = prefill.dims();
        let mut cache: Vec<LayerKv> = kvs
            .into_iter()
            .map(|kv| kv.with_capacity(capacity))
            .collect();
        let mut next = argmax(&rows(prefill.reshape([t, v])).pop().unwrap());
        let mut decoded = vec![next];
        let mut worst: f32 = 0.0;
        for step in 0..case.greedy.len() - 1 {
            let position = case.prompt.len() + step;
            let step_logits = rows(model.decode_step(tokens(&[next]), &[position], &mut cache));
            let full = logits(&model, &ids[..=position]).pop().unwrap();
            worst = worst.max(max_diff(&step_logits, &[full]));
            next = argmax(&step_logits[0]);
            decoded.push(next);
        }
        assert!(
            worst <= TOLERANCE,
            "{family} case {n}: cached decoding differs by {worst:e}"
        );
        assert_eq!(decoded, case.greedy, "{family} case {n}: cached greedy");
        cache_worst = cache_worst.max(worst);
    }
    // the figures, for `cargo test -p areal-model --test parity -- --nocapture`
    eprintln!(
        "{family}: {} prompts, max |Δ logit| against transformers {logit_worst:.1e}, \
         greedy continuations identical, cached decoding within {cache_worst:.1e} of the full pass",
        expected.cases.len()
    );
}

#[test]
fn qwen2_matches_transformers() {
    check("qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    check("qwen3");
}

#[test]
fn llama3_with_rope_scaling_matches_transformers() {
    check("llama3");
}

/// A checkpoint sharded as Hugging Face shards large ones (`model.safetensors.index.json`
/// naming each tensor's file) reads as the single file does; an index that misplaces a
/// tensor is refused, naming it.
#[test]
fn sharded_checkpoints_read_as_one_file() {
    use areal_model::hf::{read_weights, write_safetensors};
    let whole = read_safetensors(&fixture("qwen2").join("model.safetensors")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = whole.split_at(whole.len() / 2);
    write_safetensors(&dir.path().join("model-00001-of-00002.safetensors"), first).unwrap();
    write_safetensors(&dir.path().join("model-00002-of-00002.safetensors"), second).unwrap();
    let mut map = serde_json::Map::new();
    for (part, tensors) in [(1, first), (2, second)] {
        for t in tensors {
            map.insert(
                t.name.clone(),
                format!("model-0000{part}-of-00002.safetensors").into(),
            );
        }
    }
    let index = |map: &serde_json::Map<String, serde_json::Value>| {
        let body = serde_json::json!({ "metadata": { "total_size": 0 }, "weight_map": map });
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            body.to_string(),
        )
        .unwrap();
    };
    index(&map);
    let mut read = read_weights(dir.path()).unwrap();
    let mut expected = whole.clone();
    read.sort_by(|a, b| a.name.cmp(&b.name));
    expected.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(read, expected);
    let moved = first[0].name.clone();
    map.insert(moved.clone(), "model-00002-of-00002.safetensors".into());
    index(&map);
    let error = read_weights(dir.path()).unwrap_err().to_string();
    assert!(error.contains(&moved), "{error}");
}

/// Chat templates render as transformers' `apply_chat_template` renders them: six templates
/// in the styles models ship, saved as transformers saves a tokenizer, over conversations with
/// and without the generation prompt, three of them with `tools` (schemas with their keys in
/// the order written, which `tojson` keeps), `tool` messages, and assistant messages with
/// OpenAI's `tool_calls` (arguments an object, or JSON text written as it is)
/// (`plugins/model/scripts/make_chat_fixtures.py`).
#[test]
fn chat_templates_render_as_transformers_renders_them() {
    use areal_model::{ChatMessage, ChatTemplate};
    use areal_sdk::ToolSchema;
    #[derive(Deserialize)]
    struct ChatCase {
        template: String,
        messages: Vec<ChatMessage>,
        #[serde(default)]
        tools: Option<Vec<serde_json::Value>>,
        add_generation_prompt: bool,
        expected: String,
    }
    #[derive(Deserialize)]
    struct ChatExpected {
        cases: Vec<ChatCase>,
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat");
    let expected: ChatExpected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    assert_eq!(expected.cases.len(), 54);
    let mut with_tools = 0;
    for case in &expected.cases {
        let template = ChatTemplate::from_folder(&dir.join(&case.template))
            .unwrap()
            .expect("the folder has a chat template");
        let tools: Vec<ToolSchema> = case
            .tools
            .iter()
            .flatten()
            .map(|t| {
                // the round trip through ToolSchema must give back what the fixture wrote
                let schema: ToolSchema = serde_json::from_value(t["function"].clone()).unwrap();
                assert_eq!(
                    serde_json::to_string(&schema.to_function()).unwrap(),
                    serde_json::to_string(t).unwrap()
                );
                schema
            })
            .collect();
        with_tools += usize::from(!tools.is_empty());
        let text = template
            .render(&case.messages, &tools, case.add_generation_prompt)
            .unwrap_or_else(|e| panic!("{}: {e}", case.template));
        assert_eq!(
            text,
            case.expected,
            "{} with {} tools, add_generation_prompt = {}",
            case.template,
            tools.len(),
            case.add_generation_prompt
        );
    }
    assert_eq!(with_tools, 18);
    // a folder without one has none
    assert!(
        ChatTemplate::from_folder(&fixture("qwen2"))
            .unwrap()
            .is_none()
    );
}
