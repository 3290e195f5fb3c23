//! The `wasm` and `python` reward plugins as the engine builds and calls them: the same
//! rewards as the compiled-in verifier, hostile plugins costing one sample each, load-time
//! errors that name the plugin and the key.
//!
//! The components are built by `make reward-components` (into `.cache/components`), the
//! interpreter by `make python-wasi`; `make test` builds both first.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use areal_sdk::{
    BuildContext, FinishReason, PluginConfig, PluginError, RewardInput, RewardPlugin,
    RewardVerifier, Verdict, VerifyContext,
};
use areal_testkit::conformance;
use serde_json::{Value, json};

use areal_reward_plugin as _;
use areal_tasks as _;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn component(name: &str) -> String {
    let path = root()
        .join(".cache/components")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: build the components with `make reward-components`",
        path.display()
    );
    path.display().to_string()
}

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(name)
        .display()
        .to_string()
}

fn build(config: Value) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    let config = PluginConfig::from_value("reward", config).unwrap();
    RewardPlugin::build_from(&config, &BuildContext::new(1, 1))
}

fn input(id: u64, completion: &str, answer: u64) -> RewardInput {
    RewardInput {
        sample_id: id,
        item_id: format!("item-{id}"),
        prompt: "a5b8c3=".into(),
        completion: completion.into(),
        completion_ids: vec![1, 2, 3],
        finish_reason: FinishReason::Stop,
        reference: json!({ "terms": [5, 8, 3], "answer": answer }),
        metadata: json!({ "data_source": "chain-sum" })
            .as_object()
            .cloned()
            .unwrap(),
    }
}

fn verify(v: &dyn RewardVerifier, input: &RewardInput) -> Result<areal_sdk::Reward, PluginError> {
    v.verify(
        input,
        &VerifyContext::with_timeout(Duration::from_secs(120)),
    )
}

fn python_chain_sum() -> Value {
    json!({ "kind": "python", "path": root().join("rewards/plugin/examples/chain_sum.py") })
}

fn wasm_chain_sum() -> Value {
    json!({ "kind": "wasm", "path": component("chain-sum") })
}

#[test]
fn both_kinds_pass_the_verifier_checks() {
    for config in [python_chain_sum(), wasm_chain_sum()] {
        let v = build(config).unwrap();
        conformance::check_verifier(
            Arc::clone(&v),
            &[
                (input(1, "a5=5,b8=13,c3=16>16", 16), 1.0),
                (input(2, "a5=5,b8=3,c3=6>6", 16), 0.0),
                (input(3, "a5=5,b8=13", 16), 0.0),
            ],
        );
        assert!(v.cache_identity().is_some(), "{}", v.name());
    }
}

/// Completions around the task's answer format over the task's answer format: right, wrong, missing,
/// malformed, empty, unicode digits, spaces, several `>`.
fn completions() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let tails = [
        "16",
        "6",
        "",
        " 16 ",
        "16x",
        "0016",
        "１６",
        "-16",
        "99999999999999999999",
        "16>",
        ">16",
    ];
    for (i, tail) in tails.iter().enumerate() {
        out.push((format!("a5=5,b8=13,c3=16>{tail}"), 16));
        out.push((format!("a5=5>{tail}"), 5 + i as u64));
        out.push((tail.to_string(), 16));
    }
    out.push(("a5=5,b8=13,c3=16 no answer".into(), 16));
    out
}

#[test]
fn python_and_wasm_give_the_compiled_in_rewards_on_the_built_in_task() {
    let compiled = build(json!({ "kind": "chain-sum" })).unwrap();
    let python = build(python_chain_sum()).unwrap();
    let wasm = build(wasm_chain_sum()).unwrap();
    for (i, (c, answer)) in completions().iter().enumerate() {
        let sample = input(i as u64, c, *answer);
        let want = verify(compiled.as_ref(), &sample).unwrap();
        let want = (want.value, want.verdict);
        for v in [&python, &wasm] {
            let got = verify(v.as_ref(), &sample).unwrap();
            assert_eq!((got.value, got.verdict), want, "{} on {c:?}", v.name());
        }
    }
}

/// The error of a sample, which must name the plugin's file and say `what`.
fn fails_with(v: &dyn RewardVerifier, completion: &str, file: &str, what: &str) {
    let err = verify(v, &input(7, completion, 16))
        .map(|r| format!("{r:?}"))
        .expect_err(&format!("{completion:?} should fail"));
    let text = err.to_string();
    assert!(text.contains(file), "{completion:?}: {text}");
    assert!(
        text.contains(what),
        "{completion:?}: want {what:?} in {text}"
    );
}

#[test]
fn a_hostile_component_costs_one_sample_each_and_sees_nothing_of_the_host() {
    let file = component("hostile");
    let v = build(json!({
        "kind": "wasm", "path": file, "cpu_s": 1.0, "memory_mb": 32, "output_bytes": 4096,
    }))
    .unwrap();
    fails_with(v.as_ref(), "loop", &file, "CPU-time limit of 1.0 s");
    fails_with(v.as_ref(), "memory", &file, "memory limit of 32 MiB");
    fails_with(v.as_ref(), "big", &file, "memory limit of 32 MiB");
    fails_with(v.as_ref(), "flood", &file, "output limit of 4096 bytes");
    fails_with(v.as_ref(), "stderr", &file, "CPU-time limit");
    fails_with(v.as_ref(), "panic", &file, "panics on purpose");
    fails_with(v.as_ref(), "nan", &file, "not finite");
    fails_with(v.as_ref(), "recurse", &file, "trapped");
    let details = |c: &str| {
        verify(v.as_ref(), &input(8, c, 16))
            .unwrap()
            .provenance
            .details
    };
    let files = details("files");
    for key in ["/etc/passwd", "Cargo.toml", "/"] {
        let seen = files[key].as_str().unwrap();
        assert!(seen.starts_with("error"), "{key}: {seen}");
    }
    let env = details("env");
    assert_eq!(
        (env["vars"].clone(), env["args"].clone()),
        (json!(0), json!(0))
    );
    let granted = build(json!({ "kind": "wasm", "path": file, "env": { "TOKEN": "t" } })).unwrap();
    let env = verify(granted.as_ref(), &input(8, "env", 16))
        .unwrap()
        .provenance
        .details;
    assert_eq!(env["vars"], json!(1), "what the config grants");
    let net = details("net");
    assert!(
        net["connect"].as_str().unwrap().starts_with("error"),
        "{net:?}"
    );
    // and the plugin still works
    assert_eq!(
        verify(v.as_ref(), &input(9, "fine", 16)).unwrap().value,
        1.0
    );
}

#[test]
fn a_sleeping_component_is_stopped_by_the_wall_time_limit() {
    let file = component("hostile");
    let v = build(json!({ "kind": "wasm", "path": file, "cpu_s": 0.5, "wall_s": 1.0 })).unwrap();
    let started = std::time::Instant::now();
    fails_with(v.as_ref(), "sleep", &file, "wall-time limit of 1.0 s");
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn a_hostile_python_file_costs_one_sample_each_with_its_traceback() {
    let file = fixture("tests/fixtures/hostile.py");
    let v = build(json!({
        "kind": "python", "path": file, "cpu_s": 1.0, "memory_mb": 160, "output_bytes": 4096,
        "wall_s": 5.0,
    }))
    .unwrap();
    fails_with(v.as_ref(), "loop", &file, "CPU-time limit of 1.0 s");
    fails_with(v.as_ref(), "memory", &file, "memory limit of 160 MiB");
    fails_with(v.as_ref(), "flood", &file, "output limit of 4096 bytes");
    fails_with(v.as_ref(), "sleep", &file, "limit");
    // a loop of naps, each charged the time it took (issue 32: what it asked, nothing, so it
    // ran to its wall time; the accounting is the grader's, proven in its second_pass.rs)
    fails_with(v.as_ref(), "naps", &file, "CPU-time limit of 1.0 s");
    fails_with(v.as_ref(), "exit", &file, "exited with status 3");
    fails_with(
        v.as_ref(),
        "junk",
        &file,
        "returned 'not a number', not a number",
    );
    fails_with(v.as_ref(), "nan", &file, "not finite");
    // Issue 32: a finite 1e308 was trained on (and overflowed the group's statistics).
    fails_with(v.as_ref(), "huge", &file, "outside ±1e6");
    // Issue 32: the reply mark had no per-run nonce, so code a reward runs could print a
    // score of its own. Now a reply without this run's nonce is none, and a second one
    // (the harness's own after a forged one) is refused.
    fails_with(v.as_ref(), "forge", &file, "the harness said nothing back");
    fails_with(v.as_ref(), "forge-found", &file, "wrote 2 replies");
    fails_with(v.as_ref(), "recurse", &file, "RecursionError");
    // the traceback starts at the user's own frames, with the file's name and line
    let err = verify(v.as_ref(), &input(7, "raise", 16))
        .unwrap_err()
        .to_string();
    assert!(err.contains("Traceback (most recent call last)"), "{err}");
    assert!(
        err.contains(&format!("File \"{file}\", line 27, in compute_score")),
        "{err}"
    );
    assert!(
        err.contains("ValueError: the hostile reward raises on purpose"),
        "{err}"
    );
    assert!(
        !err.contains("areal_main"),
        "harness frames are noise: {err}"
    );
    let env = verify(v.as_ref(), &input(8, "env", 16)).unwrap();
    assert_eq!(
        env.provenance.details["env"],
        json!([]),
        "no environment unless granted"
    );
    let files = verify(v.as_ref(), &input(8, "files", 16)).unwrap();
    let seen = files.provenance.details["passwd"].as_str().unwrap();
    assert!(seen.starts_with("error"), "{seen}");
    assert_eq!(
        verify(v.as_ref(), &input(9, "fine", 16)).unwrap().value,
        1.0
    );
}

#[test]
fn a_python_call_gets_verl_s_arguments_and_the_options_as_keywords() {
    let file = fixture("tests/fixtures/hostile.py");
    let v = build(json!({
        "kind": "python", "path": file, "options": { "strict": true }, "env": { "TOKEN": "t" },
    }))
    .unwrap();
    let env = verify(v.as_ref(), &input(4, "env", 16)).unwrap();
    assert_eq!(
        env.provenance.details["env"],
        json!(["TOKEN"]),
        "what the config grants"
    );
    let r = verify(v.as_ref(), &input(4, "args", 16)).unwrap();
    let d = &r.provenance.details;
    assert_eq!(d["data_source"], json!("chain-sum"));
    assert_eq!(
        d["ground_truth"],
        json!({ "terms": [5, 8, 3], "answer": 16 })
    );
    assert_eq!(d["options"], json!({ "strict": true }));
    let extra = &d["extra_info"];
    assert_eq!(extra["item_id"], json!("item-4"));
    assert!(
        extra.get("sample_id").is_none(),
        "no reward depends on the sample's id"
    );
    assert_eq!(extra["finish_reason"], json!("stop"));
    assert_eq!(extra["completion_tokens"], json!(3));
    assert_eq!(r.verdict, Verdict::Partial, "a score between 0 and 1");
    assert_eq!(d["plugin_sha256"].as_str().unwrap().len(), 64);

    let areal = build(json!({
        "kind": "python", "path": fixture("tests/fixtures/areal_style.py"),
        "function": "reward_fn", "signature": "areal",
    }))
    .unwrap();
    assert_eq!(
        verify(areal.as_ref(), &input(1, "x>16", 16)).unwrap().value,
        1.0
    );
    assert_eq!(
        verify(areal.as_ref(), &input(1, "x>15", 16)).unwrap().value,
        0.0
    );
}

#[test]
fn deterministic_mode_gives_the_same_reward_and_fuel_for_the_same_sample() {
    let file = fixture("tests/fixtures/hostile.py");
    let v = build(json!({ "kind": "python", "path": file, "mode": "deterministic" })).unwrap();
    let a = verify(v.as_ref(), &input(1, "random", 16)).unwrap();
    let b = verify(v.as_ref(), &input(2, "random", 16)).unwrap();
    assert_eq!(a.provenance.details["draw"], b.provenance.details["draw"]);
    assert!(a.provenance.fuel.is_some() && a.provenance.fuel == b.provenance.fuel);
    assert_eq!(a.provenance.limits["mode"], json!("deterministic"));
    // A loop of `time.sleep(0)` runs out of fuel, every time alike (issue 32: it ran to the
    // wall-time limit, its fuel differing from run to run)
    let naps = (0..3)
        .map(|_| {
            verify(v.as_ref(), &input(1, "naps", 16))
                .unwrap_err()
                .to_string()
        })
        .collect::<Vec<_>>();
    assert!(naps[0].contains("fuel budget"), "{}", naps[0]);
    assert!(naps.iter().all(|e| e == &naps[0]));
    let w =
        build(json!({ "kind": "wasm", "path": component("chain-sum"), "mode": "deterministic" }))
            .unwrap();
    let a = verify(w.as_ref(), &input(1, "x>16", 16)).unwrap();
    let b = verify(w.as_ref(), &input(1, "x>16", 16)).unwrap();
    assert!(a.provenance.fuel.is_some() && a.provenance.fuel == b.provenance.fuel);
}

fn load_error(config: Value) -> String {
    build(config)
        .map(|_| ())
        .expect_err("should not load")
        .to_string()
}

#[test]
fn what_cannot_be_loaded_stops_the_run_at_start_naming_the_plugin_and_the_key() {
    let hostile = component("hostile");
    let err = load_error(json!({ "kind": "wasm", "path": hostile, "options": { "refuse": true } }));
    assert!(
        err.contains("reward.options") && err.contains("refused: `refuse` is set"),
        "{err}"
    );
    let err = load_error(json!({ "kind": "wasm", "path": "no/such.wasm" }));
    assert!(
        err.contains("reward.path") && err.contains("no/such.wasm"),
        "{err}"
    );
    let err = load_error(json!({ "kind": "wasm", "path": hostile, "function": "f" }));
    assert!(
        err.contains("reward.function") && err.contains("`kind = \"python\"` only"),
        "{err}"
    );
    let err = load_error(json!({ "kind": "wasm", "path": hostile, "cpu_s": 0 }));
    assert!(err.contains("reward.cpu_s"), "{err}");
    let err = load_error(json!({ "kind": "wasm", "path": hostile, "cpus": 1 }));
    assert!(err.contains("reward.cpus"), "{err}");
    let err = load_error(
        json!({ "kind": "python", "path": fixture("tests/fixtures/hostile.py"), "signature": "trl" }),
    );
    assert!(err.contains("reward.signature"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    // a core module, and bytes that are no wasm at all
    let core = write("core.wasm", b"\0asm\x01\0\0\0");
    let err = load_error(json!({ "kind": "wasm", "path": core }));
    assert!(
        err.contains("core.wasm") && err.contains("not a WebAssembly component"),
        "{err}"
    );
    let junk = write("junk.wasm", b"hello");
    let err = load_error(json!({ "kind": "wasm", "path": junk }));
    assert!(err.contains("junk.wasm"), "{err}");

    let hang = write("hang.py", b"while True:\n    pass\n");
    let err = load_error(json!({ "kind": "python", "path": hang, "import_s": 1.0 }));
    assert!(
        err.contains("hang.py: importing it failed: CPU-time limit of 1.0 s"),
        "{err}"
    );
    let raises = write("raises.py", b"import pandas\n");
    let err = load_error(json!({ "kind": "python", "path": raises }));
    assert!(err.contains("raises.py: importing it failed"), "{err}");
    assert!(
        err.contains("ModuleNotFoundError: No module named 'pandas'"),
        "{err}"
    );
    let none = write("none.py", b"def other():\n    return 1\n");
    let err = load_error(json!({ "kind": "python", "path": none }));
    assert!(err.contains("defines no function 'compute_score'"), "{err}");
    let bomb = write("bomb.py", b"x = bytearray(1 << 30)\n");
    let err = load_error(json!({ "kind": "python", "path": bomb, "memory_mb": 200 }));
    assert!(err.contains("memory limit of 200 MiB"), "{err}");
}

/// A change to a plugin's config, named.
type Variant<'a> = (&'a str, Box<dyn Fn(&mut Value)>);

/// Issue 32: a Python reward's cache identity left out its file's sha256 (an edited file got
/// the old file's rewards from `.cache/rewards`) and its environment (`MODE = "b"` got
/// `MODE = "a"`'s rewards). For each form, every change of what its function can see or what
/// bounds it is another identity: the next run's cache, on the same folder, misses.
#[test]
fn every_input_of_a_plugin_is_in_its_cache_identity() {
    use areal_core::RewardCache;
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("rewards");
    let sample = input(1, "x>16", 16);
    let reward = areal_sdk::Reward::new(1.0, Verdict::Accepted);
    // The base config's reward is cached; each variant must miss it.
    let check = |kind: &str, base: Value, variants: Vec<Variant<'_>>| {
        let identity = |config: Value| build(config).unwrap().cache_identity().unwrap();
        let cache = RewardCache::new(kind, &identity(base.clone()), Some(&cache_dir)).unwrap();
        let key = cache.key(&sample);
        cache.put(key, &reward);
        drop(cache);
        let again = RewardCache::new(kind, &identity(base.clone()), Some(&cache_dir)).unwrap();
        assert_eq!(
            again.get(&key),
            Some(reward.clone()),
            "{kind}: the same plugin hits"
        );
        for (what, change) in variants {
            let mut config = base.clone();
            change(&mut config);
            let other = RewardCache::new(kind, &identity(config), Some(&cache_dir)).unwrap();
            assert_eq!(
                other.get(&other.key(&sample)),
                None,
                "{kind}: {what} hit the cache"
            );
        }
    };
    let file = dir.path().join("sees.py");
    let source = "import os\ndef compute_score(data_source, solution_str, ground_truth, extra_info, **kw):\n    return 1.0 if os.environ.get('MODE') == 'a' else 0.0\n";
    std::fs::write(&file, source).unwrap();
    let edited = dir.path().join("edited.py");
    std::fs::write(&edited, source.replace("'a'", "'b'")).unwrap();
    let python = json!({
        "kind": "python", "path": file, "env": { "MODE": "a" }, "options": { "x": 1 },
    });
    let edited_path = edited.display().to_string();
    check(
        "python",
        python,
        vec![
            (
                "another file",
                Box::new(move |c| c["path"] = json!(edited_path)),
            ),
            (
                "the environment",
                Box::new(|c| c["env"]["MODE"] = json!("b")),
            ),
            ("the options", Box::new(|c| c["options"]["x"] = json!(2))),
            ("the CPU limit", Box::new(|c| c["cpu_s"] = json!(6.0))),
            ("the mode", Box::new(|c| c["mode"] = json!("deterministic"))),
        ],
    );
    // The same file edited in place is another identity too.
    let before = build(json!({ "kind": "python", "path": file }))
        .unwrap()
        .cache_identity();
    std::fs::write(&file, source.replace("1.0 if", "0.5 if")).unwrap();
    let after = build(json!({ "kind": "python", "path": file }))
        .unwrap()
        .cache_identity();
    assert_ne!(before, after, "an edited file");

    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("answers.txt"), "16").unwrap();
    let wasm = json!({
        "kind": "wasm", "path": component("chain-sum"), "env": { "MODE": "a" },
        "dirs": [format!("{}:/data", data.display())],
    });
    let other_data = dir.path().join("other");
    std::fs::create_dir(&other_data).unwrap();
    let mount = format!("{}:/data", other_data.display());
    check(
        "wasm",
        wasm.clone(),
        vec![
            (
                "the environment",
                Box::new(|c| c["env"]["MODE"] = json!("b")),
            ),
            (
                "the options",
                Box::new(|c| c["options"] = json!({ "wrong": 0.5 })),
            ),
            (
                "another folder",
                Box::new(move |c| c["dirs"] = json!([mount])),
            ),
            ("the memory limit", Box::new(|c| c["memory_mb"] = json!(32))),
        ],
    );
    // A file of a mounted folder written between two runs is another identity.
    let before = build(wasm.clone()).unwrap().cache_identity();
    std::fs::write(data.join("answers.txt"), "17, and more").unwrap();
    assert_ne!(
        before,
        build(wasm).unwrap().cache_identity(),
        "an edited file of a mounted folder"
    );
}

/// A Python reward's numpy numbers are the Python numbers they hold (verl takes them so);
/// a bool is refused as Python's is; numpy's generator draws from each run's seed, not the
/// state the snapshot froze.
#[test]
fn numpy_numbers_count_and_numpy_draws_from_each_runs_seed() {
    let file = fixture("tests/fixtures/numpy_reward.py");
    let v = build(json!({ "kind": "python", "path": file })).unwrap();
    for (kind, score) in [
        ("f32", 0.5),
        ("i64", 1.0),
        ("mean", 0.5),
        ("sum", 0.75),
        ("dict", 0.25),
    ] {
        let reward = verify(v.as_ref(), &input(1, kind, 16)).unwrap();
        assert_eq!(reward.value, score, "{kind}: {reward:?}");
    }
    fails_with(v.as_ref(), "bool", &file, "not a number");
    // np.mean([]) is NaN: the reward's bug, an error naming it (the sample is then counted
    // in `reward_failures`, not trained on)
    fails_with(v.as_ref(), "empty-mean", &file, "not finite");
    let draws: std::collections::BTreeSet<String> = (0..4)
        .map(|i| {
            verify(v.as_ref(), &input(i, "rand", 16))
                .unwrap()
                .provenance
                .details["draw"]
                .to_string()
        })
        .collect();
    assert_eq!(draws.len(), 4, "{draws:?}");
}

/// Issue 45: a reward file named like a standard module (`types.py`) replaced it in
/// `sys.modules`, and numpy's import then failed. It is registered under a name of its own.
#[test]
fn a_reward_file_named_like_a_standard_module_shadows_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // numpy's import is the one `types.py` broke; the others show the rule (and cost less)
    for (stem, numpy) in [("types", true), ("json", false), ("random", false)] {
        let path = dir.path().join(format!("{stem}.py"));
        let (import, half) = if numpy {
            ("import numpy as np\n", "np.float32(0.5)")
        } else {
            ("", "0.5")
        };
        std::fs::write(
            &path,
            format!(
                "import sys, types, json, random\n{import}\n\
                 def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    \
                 assert sys.modules['types'] is types and hasattr(types, 'ModuleType')\n    \
                 assert hasattr(json, 'dumps') and hasattr(random, 'random')\n    \
                 return {{'score': {half}, 'module': __name__}}\n"
            ),
        )
        .unwrap();
        let v = build(json!({ "kind": "python", "path": path }))
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        let reward = verify(v.as_ref(), &input(1, "x", 16)).unwrap();
        assert_eq!(reward.value, 0.5, "{stem}: {reward:?}");
        assert_eq!(
            reward.provenance.details["module"],
            format!("areal_reward_{stem}")
        );
    }
    let path = dir.path().join("my_scorer.py");
    std::fs::write(&path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return {'score': 1.0, 'module': __name__}\n").unwrap();
    let v = build(json!({ "kind": "python", "path": path })).unwrap();
    let reward = verify(v.as_ref(), &input(1, "x", 16)).unwrap();
    assert_eq!(
        reward.provenance.details["module"], "my_scorer",
        "a name no module has is kept"
    );
}
