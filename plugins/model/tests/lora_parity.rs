//! LoRA parity with PEFT, both ways, on the parity fixtures' models
//! (`plugins/model/scripts/make_lora_fixtures.py`): adapters PEFT saved load here and give
//! PEFT's logits, unmerged and merged; the adapter areal-rs writes loads in PEFT and gives the
//! logits here. No Python at test time.

use std::path::{Path, PathBuf};

use areal_model::hf::{import, read_safetensors};
use areal_model::{
    AdapterConfig, LoraOptions, ModelConfig, TARGET_MODULES, Transformer, load_adapter,
    save_adapter,
};
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::Deserialize;

/// The largest |Δ logit| allowed in f32.
const TOLERANCE: f32 = 1e-4;

#[derive(Deserialize)]
struct Expected {
    family: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn base(family: &str) -> Transformer {
    let dir = fixtures().join("parity").join(family);
    let config: ModelConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let tensors = read_safetensors(&dir.join("model.safetensors")).unwrap();
    import(&config, tensors, &Device::flex()).unwrap()
}

fn expected(case: &str) -> Expected {
    let path = fixtures().join("lora").join(case).join("expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn logits(model: &Transformer, prompt: &[u32]) -> Vec<f32> {
    let data: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
    let tokens =
        Tensor::<2, Int>::from_data(TensorData::new(data, [1, prompt.len()]), &Device::flex());
    model
        .forward(tokens)
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap()
}

/// The largest |Δ logit| of `model` against the case's expected logits.
fn worst(model: &Transformer, expected: &Expected) -> f32 {
    let mut worst = 0.0f32;
    for case in &expected.cases {
        let got = logits(model, &case.prompt);
        let want: Vec<f32> = case.logits.iter().flatten().copied().collect();
        assert_eq!(got.len(), want.len());
        for (a, b) in got.iter().zip(&want) {
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

fn adapted(case: &str) -> (Transformer, Expected) {
    let expected = expected(case);
    let (config, tensors) = load_adapter(&fixtures().join("lora").join(case).join("adapter"))
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let model = base(&expected.family)
        .with_lora(&config, Some(tensors), 0)
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    (model, expected)
}

#[test]
#[allow(clippy::print_stderr, reason = "the test prints what it measured")]
fn peft_adapters_give_peft_logits_merged_or_not() {
    for case in ["peft-qwen2", "peft-llama3-rslora"] {
        let (model, expected) = adapted(case);
        // the adapter matters: the base alone is far off
        let off = worst(&base(&expected.family), &expected);
        assert!(
            off > 100.0 * TOLERANCE,
            "{case}: the adapter changes nothing ({off})"
        );
        let unmerged = worst(&model, &expected);
        let merged = worst(&model.merged(), &expected);
        eprintln!("{case}: max |Δ logit| unmerged {unmerged:.2e}, merged {merged:.2e}");
        assert!(unmerged <= TOLERANCE, "{case}: unmerged {unmerged}");
        assert!(merged <= TOLERANCE, "{case}: merged {merged}");
    }
    // `"all-linear"` as PEFT saves it: every projection's path
    let (model, _) = adapted("peft-llama3-rslora");
    let (config, _) = load_adapter(&fixtures().join("lora/peft-llama3-rslora/adapter")).unwrap();
    assert!(config.rslora);
    assert_eq!(model.adapter_tensors().len(), 2 * TARGET_MODULES.len() * 2);
}

/// The adapter areal-rs writes for the `areal-qwen2` case: fresh `A` from a seed, `B` filled
/// deterministically (a fresh `B` is 0 and would check nothing).
fn areal_adapter(dir: &Path) {
    let config = AdapterConfig::from_options(&LoraOptions {
        rank: 3,
        alpha: 12.0,
        target_modules: ["k_proj", "o_proj", "gate_proj", "up_proj"]
            .map(String::from)
            .to_vec(),
        ..LoraOptions::default()
    })
    .unwrap();
    let model = base("qwen2").with_lora(&config, None, 11).unwrap();
    let mut tensors = model.adapter_tensors();
    let mut x = 0.37f32;
    for t in tensors.iter_mut().filter(|t| t.name.contains("lora_B")) {
        for v in &mut t.data {
            x = (x * 3.1 + 0.17).fract();
            *v = (x - 0.5) * 0.3;
        }
    }
    save_adapter(dir, &config, &tensors).unwrap();
}

#[test]
#[allow(clippy::print_stderr, reason = "the test prints what it measured")]
fn the_adapter_written_here_gives_peft_logits_in_peft() {
    let committed = fixtures().join("lora/areal-qwen2/adapter");
    if std::env::var_os("AREAL_WRITE_LORA_FIXTURE").is_some() {
        areal_adapter(&committed);
        return;
    }
    // what this build writes is what PEFT was checked on
    let fresh = tempfile::tempdir().unwrap();
    areal_adapter(fresh.path());
    let (config, mut tensors) = load_adapter(fresh.path()).unwrap();
    let (committed_config, mut committed_tensors) = load_adapter(&committed).unwrap();
    assert_eq!(config, committed_config);
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    committed_tensors.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(
        tensors == committed_tensors,
        "the adapter written here changed"
    );
    let json = |dir: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("adapter_config.json")).unwrap())
            .unwrap()
    };
    assert_eq!(json(fresh.path()), json(&committed));

    let (model, expected) = adapted("areal-qwen2");
    let worst = worst(&model, &expected);
    eprintln!("areal-qwen2 in PEFT: max |Δ logit| {worst:.2e}");
    assert!(worst <= TOLERANCE, "{worst}");
}
