//! Low-rank adapters: only the adapters learn, the base stays bit for bit, the reference is the
//! base, PEFT's files round trip, merged and unmerged adapters compute the same model.

use areal_model::hf::export;
use areal_model::{
    AdapterConfig, LoraOptions, TransformerOptions, TransformerPolicy, load_adapter, save_adapter,
};
use areal_sdk::{NamedTensor, Tokenizer};
use areal_sdk_train::burn::optim::{AdamWConfig, ModuleOptimizer};
use areal_sdk_train::burn::tensor::{Device, Tensor};
use areal_sdk_train::{PackedBatch, Policy};

const ALPHABET: &str = "0123456789+=, ";

fn options() -> TransformerOptions {
    TransformerOptions {
        hidden_size: 32,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        max_positions: 64,
        ..TransformerOptions::default()
    }
}

fn lora(rank: usize, targets: &[&str]) -> AdapterConfig {
    AdapterConfig::from_options(&LoraOptions {
        rank,
        target_modules: targets.iter().map(|s| (*s).to_owned()).collect(),
        ..LoraOptions::default()
    })
    .unwrap()
}

fn values(t: Tensor<1>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn batch(t: &dyn Tokenizer) -> PackedBatch {
    let mut batch = PackedBatch::new(1.0);
    for s in ["12+34=46", "7+8=15,", "123+4=127", "1=1"] {
        batch.push(&t.encode(s).unwrap());
    }
    batch
}

fn policy(seed: u64, adapter: Option<AdapterConfig>) -> TransformerPolicy {
    let device = Device::flex().autodiff();
    let mut policy = TransformerPolicy::fresh(&options(), ALPHABET, seed, &device).unwrap();
    if let Some(config) = adapter {
        policy.set_lora(config, None, seed + 1);
    }
    policy
}

/// One step that raises the logprob of the batch.
fn step(policy: &mut TransformerPolicy, optimizer: &mut ModuleOptimizer, batch: &PackedBatch) {
    let loss = policy.logprobs(batch).unwrap().sum().neg().reshape([1]);
    policy.backward(loss).unwrap();
    policy.step(optimizer, 1e-2, Some(1.0)).unwrap();
}

fn bits(tensors: &[NamedTensor]) -> Vec<(String, Vec<u32>)> {
    tensors
        .iter()
        .map(|t| (t.name.clone(), t.data.iter().map(|v| v.to_bits()).collect()))
        .collect()
}

#[test]
fn only_the_adapters_learn_and_the_base_stays_bit_for_bit() {
    let mut policy = policy(3, Some(lora(4, &["q_proj", "v_proj", "down_proj"])));
    let batch = batch(policy.tokenizer().as_ref());
    let before = values(policy.logprobs_no_grad(&batch).unwrap());
    let base = export(policy.model());
    policy.start_rl().unwrap();
    // B = 0: the adapted model is the base, exactly
    assert_eq!(values(policy.logprobs_no_grad(&batch).unwrap()), before);
    let adapter = policy.adapter().expect("adapters are on");
    // 2 layers × 3 targets × (A, B)
    assert_eq!(adapter.tensors.len(), 12);
    let a = &adapter.tensors[0];
    assert_eq!(
        a.name,
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    );
    assert_eq!(a.shape, vec![4, 32]);
    assert_eq!(adapter.config["r"], 4);
    assert_eq!(
        adapter.config["target_modules"],
        serde_json::json!(["q_proj", "v_proj", "down_proj"])
    );

    let mut optimizer = AdamWConfig::new().with_weight_decay(0.1).init();
    for _ in 0..5 {
        step(&mut policy, &mut optimizer, &batch);
    }
    let after = values(policy.logprobs_no_grad(&batch).unwrap());
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    assert!(
        mean(&after) > mean(&before) + 0.05,
        "the adapters learned nothing: {} → {}",
        mean(&before),
        mean(&after)
    );
    // weight decay and all: the frozen weights did not move by one bit
    assert_eq!(bits(&export(&policy.model().without_lora())), bits(&base));
    // the optimizer keeps state for the adapters alone
    let trained = policy.adapter().unwrap();
    assert!(
        trained
            .tensors
            .iter()
            .filter(|t| t.name.contains("lora_B"))
            .all(|t| t.data.iter().any(|&v| v != 0.0))
    );
    // the update sends the base once (the same Arc) and the adapter
    let one = policy.weight_update(1);
    let two = policy.weight_update(2);
    assert!(std::sync::Arc::ptr_eq(&one.tensors, &two.tensors));
    assert_eq!(bits(&one.tensors), bits(&base));
    assert_eq!(one.adapter.as_deref(), Some(&trained));
    // the merged weights are the adapted model
    let merged = export(policy.model());
    let mut full = policy.snapshot().unwrap();
    full.load(&save_merged(&merged, &policy)).unwrap();
    let diff = max_diff(&values(full.logprobs_no_grad(&batch).unwrap()), &after);
    assert!(diff < 1e-4, "merged and adapted differ by {diff}");
}

/// A checkpoint folder of `tensors` with the policy's config and tokenizer.
fn save_merged(tensors: &[NamedTensor], policy: &TransformerPolicy) -> std::path::PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    policy.save(&dir).unwrap();
    areal_model::hf::write_safetensors(&dir.join("model.safetensors"), tensors).unwrap();
    dir
}

#[test]
fn the_reference_is_the_base_and_resume_continues_bit_for_bit() {
    let config = lora(2, &["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]);
    let mut policy = policy(5, Some(config.clone()));
    let batch = batch(policy.tokenizer().as_ref());
    let base_logprobs = values(policy.logprobs_no_grad(&batch).unwrap());
    policy.start_rl().unwrap();
    let reference = policy.snapshot().unwrap();
    let mut optimizer = AdamWConfig::new().init();
    for _ in 0..3 {
        step(&mut policy, &mut optimizer, &batch);
    }
    assert_eq!(
        values(reference.logprobs_no_grad(&batch).unwrap()),
        base_logprobs
    );
    assert_ne!(
        values(policy.logprobs_no_grad(&batch).unwrap()),
        base_logprobs
    );

    let dir = tempfile::tempdir().unwrap();
    policy.save_state(Some(&optimizer), dir.path()).unwrap();
    // a resumed run builds its policy afresh (another seed: other weights), starts RL, loads
    let mut resumed = self::policy(99, Some(config));
    resumed.start_rl().unwrap();
    let mut resumed_optimizer = AdamWConfig::new().init();
    resumed
        .load_state(Some(&mut resumed_optimizer), dir.path())
        .unwrap();
    for _ in 0..3 {
        step(&mut policy, &mut optimizer, &batch);
        step(&mut resumed, &mut resumed_optimizer, &batch);
    }
    assert_eq!(
        bits(&export(resumed.model())),
        bits(&export(policy.model()))
    );
    let (a, b) = (policy.weight_update(7), resumed.weight_update(7));
    assert_eq!(bits(&a.tensors), bits(&b.tensors), "the base of the update");
    assert_eq!(a.adapter, b.adapter);
}

#[test]
fn peft_files_round_trip_and_a_checkpoint_keeps_its_adapter() {
    let mut policy = policy(7, Some(lora(3, &["gate_proj", "o_proj"])));
    let batch = batch(policy.tokenizer().as_ref());
    policy.start_rl().unwrap();
    let mut optimizer = AdamWConfig::new().init();
    for _ in 0..2 {
        step(&mut policy, &mut optimizer, &batch);
    }
    let adapted = values(policy.logprobs_no_grad(&batch).unwrap());
    let dir = tempfile::tempdir().unwrap();
    policy.save(dir.path()).unwrap();
    let adapter_dir = dir.path().join(areal_model::ADAPTER_DIR);
    let (config, tensors) = load_adapter(&adapter_dir).unwrap();
    assert_eq!(config, *policy.adapter_config().unwrap());
    let sorted = |mut ts: Vec<NamedTensor>| {
        ts.sort_by(|a, b| a.name.cmp(&b.name));
        bits(&ts)
    };
    assert!(sorted(tensors.clone()) == sorted(policy.adapter().unwrap().tensors));

    // the checkpoint's weights have the adapter folded in
    let mut merged = self::policy(0, None);
    merged.load(dir.path()).unwrap();
    let diff = max_diff(&values(merged.logprobs_no_grad(&batch).unwrap()), &adapted);
    assert!(diff < 1e-4, "{diff}");

    // the base plus the adapter folder is the same model
    let mut base = self::policy(7, None);
    base.load(&adapter_dir).unwrap();
    let diff = max_diff(&values(base.logprobs_no_grad(&batch).unwrap()), &adapted);
    assert!(diff < 1e-4, "{diff}");

    // starting RL from a saved adapter: the same model, trainable again
    let mut again = self::policy(7, None);
    again.set_lora(config, Some(tensors), 0);
    again.start_rl().unwrap();
    assert_eq!(
        values(again.logprobs_no_grad(&batch).unwrap()),
        adapted,
        "an adapter loaded unmerged computes what it was saved from"
    );
}

/// An error with its causes.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out += &format!(": {s}");
        source = s.source();
    }
    out
}

#[test]
fn adapters_that_do_not_fit_are_refused_by_name() {
    let bad = |targets: &[&str]| {
        AdapterConfig::from_options(&LoraOptions {
            target_modules: targets.iter().map(|s| (*s).to_owned()).collect(),
            ..LoraOptions::default()
        })
        .unwrap_err()
    };
    let (key, message) = bad(&["q_proj", "qkv_proj"]);
    assert_eq!(key, "target_modules");
    assert!(message.contains("\"qkv_proj\""), "{message}");
    assert_eq!(bad(&[]).0, "target_modules");
    let (key, _) = AdapterConfig::from_options(&LoraOptions {
        rank: 0,
        ..LoraOptions::default()
    })
    .unwrap_err();
    assert_eq!(key, "rank");

    let mut json = lora(2, &["q_proj"]).to_json();
    json["use_dora"] = true.into();
    let e = AdapterConfig::from_json(&json).unwrap_err();
    assert!(e.contains("use_dora"), "{e}");
    let mut json = lora(2, &["q_proj"]).to_json();
    json["target_modules"] = "all-linear".into();
    assert_eq!(
        AdapterConfig::from_json(&json)
            .unwrap()
            .target_modules
            .len(),
        7
    );

    // an adapter of another rank or shape names the tensor
    let dir = tempfile::tempdir().unwrap();
    let mut policy = policy(1, Some(lora(2, &["q_proj"])));
    policy.start_rl().unwrap();
    let mut tensors = policy.adapter().unwrap().tensors;
    tensors[1].shape = vec![16, 4];
    tensors[1].data = vec![0.0; 64];
    save_adapter(dir.path(), &lora(2, &["q_proj"]), &tensors).unwrap();
    let mut base = self::policy(1, None);
    let e = chain(&base.load(dir.path()).unwrap_err());
    assert!(e.contains("layers.0.self_attn.q_proj.lora_B.weight"), "{e}");
    assert!(e.contains("[16, 4]"), "{e}");
}

/// A base checkpoint and an adapter trained a step over it, in `dir`: their folders.
fn base_and_adapter(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let base = dir.join("base");
    policy(5, None).save(&base).unwrap();
    let mut adapted = policy(5, Some(lora(2, &["q_proj", "down_proj"])));
    let batch = batch(adapted.tokenizer().as_ref());
    adapted.start_rl().unwrap();
    let mut optimizer = AdamWConfig::new().init();
    step(&mut adapted, &mut optimizer, &batch);
    let trained = dir.join("trained");
    adapted.save(&trained).unwrap();
    (base, trained.join(areal_model::ADAPTER_DIR))
}

/// An adapter with a value that is not finite is refused naming the tensor, by every way in
/// (`load_adapter`, a policy's `load`, `merge_adapter`), and nothing is written.
#[test]
fn an_adapter_that_is_not_finite_is_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let (base, adapter) = base_and_adapter(dir.path());
    let (config, tensors) = load_adapter(&adapter).unwrap();
    for (k, bad) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY]
        .into_iter()
        .enumerate()
    {
        let mut poisoned = tensors.clone();
        let t = k % poisoned.len();
        let i = poisoned[t].data.len() / 2;
        poisoned[t].data[i] = bad;
        let name = poisoned[t].name.clone();
        let folder = dir.path().join(format!("poisoned-{k}"));
        save_adapter(&folder, &config, &poisoned).unwrap();
        let e = chain(&load_adapter(&folder).unwrap_err());
        assert!(e.contains(&name) && e.contains("must be finite"), "{e}");
        let mut over = policy(5, None);
        let e = chain(&over.load(&folder).unwrap_err());
        assert!(e.contains(&name), "{e}");
        let out = dir.path().join(format!("merged-{k}"));
        let e = chain(&areal_model::merge_adapter(&base, &folder, &out, false).unwrap_err());
        assert!(e.contains(&name), "{e}");
        assert!(!out.exists(), "a refused merge wrote {}", out.display());
    }
}

/// A rank past what the model's projections can use is refused before anything is
/// allocated (a rank of 2^32 would claim gigabytes at once).
#[test]
fn a_rank_past_the_projections_is_refused_before_it_is_allocated() {
    let model = policy(1, None);
    let config = lora(1 << 32, &["q_proj"]);
    let e = model.model().check_lora(&config).unwrap_err().to_string();
    assert!(e.contains("rank 4294967296") && e.contains("q_proj"), "{e}");
    assert!(model.model().check_lora(&lora(32, &["q_proj"])).is_ok());
    let e = model
        .model()
        .clone()
        .with_lora(&config, None, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 4294967296"), "{e}");
}

/// `merge_adapter` writes only files it creates, in a folder of its own that then takes the
/// output's place: a link planted in the output is never written through; an output that
/// holds anything is refused unless `overwrite`; an output that is a link, always.
#[cfg(unix)]
#[test]
fn a_merge_never_writes_through_a_link_in_its_output() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let (base, adapter) = base_and_adapter(dir.path());
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "the user's").unwrap();
    let unchanged = || assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the user's");
    let merge = |out: &std::path::Path, overwrite: bool| {
        areal_model::merge_adapter(&base, &adapter, out, overwrite).map_err(|e| chain(&e))
    };
    // each file a merge writes, planted as a link to the victim
    for planted in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        let out = dir.path().join(format!("out-{planted}"));
        std::fs::create_dir(&out).unwrap();
        symlink(&victim, out.join(planted)).unwrap();
        let e = merge(&out, false).unwrap_err();
        assert!(
            e.contains("is not empty") && e.contains("--overwrite"),
            "{e}"
        );
        unchanged();
        // asked by name: the folder is replaced, the link with it, its target untouched
        merge(&out, true).unwrap();
        unchanged();
        // (a fresh character tokenizer has no tokenizer_config.json: the link is just gone)
        if let Ok(meta) = std::fs::symlink_metadata(out.join(planted)) {
            assert!(meta.is_file(), "{planted} is still a link");
        }
        assert!(out.join("model.safetensors").is_file());
    }
    // the output itself a link (to a folder, to the victim, dangling): refused
    let folder = dir.path().join("elsewhere");
    std::fs::create_dir(&folder).unwrap();
    for (name, target) in [
        ("to-folder", folder.clone()),
        ("to-file", victim.clone()),
        ("dangling", dir.path().join("nothing")),
    ] {
        let out = dir.path().join(name);
        symlink(&target, &out).unwrap();
        for overwrite in [false, true] {
            let e = merge(&out, overwrite).unwrap_err();
            assert!(e.contains("is a link"), "{name}: {e}");
        }
    }
    unchanged();
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0);
    assert!(!dir.path().join("nothing").exists());
    // a new folder and an empty one take the merge; a second merge is refused
    let out = dir.path().join("merged");
    merge(&out, false).unwrap();
    let e = merge(&out, false).unwrap_err();
    assert!(e.contains("already holds a checkpoint"), "{e}");
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    merge(&dir.path().join("empty"), false).unwrap();
    // nothing is left beside the outputs
    let stray: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("merging"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}
