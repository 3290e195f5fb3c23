//! `areal grade reward`: the three forms of one reward (compiled in, a WASM component, a
//! Python file) grade the same samples alike, on any thread count, with the reward cache.

use std::path::{Path, PathBuf};

use super::{areal, json_lines, text};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A config whose `[reward]` is `section`.
fn config(dir: &Path, name: &str, section: &str) -> String {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, format!("[reward]\n{section}\n")).unwrap();
    path.display().to_string()
}

#[test]
fn grade_reward_gives_one_reward_in_three_forms_the_same_results_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let component = root().join(".cache/components/chain-sum.wasm");
    assert!(
        component.is_file(),
        "build the components: make reward-components"
    );
    let python = root().join("rewards/plugin/examples/chain_sum.py");
    let configs = [
        config(dir.path(), "compiled", "kind = \"chain-sum\""),
        config(
            dir.path(),
            "wasm",
            &format!("kind = \"wasm\"\npath = {:?}", component),
        ),
        config(
            dir.path(),
            "python",
            &format!("kind = \"python\"\npath = {:?}", python),
        ),
    ];
    let reference = r#"{"terms": [5, 8, 3], "answer": 16}"#;
    let mut lines = vec![
        format!(
            r#"{{"prompt": "a5b8c3=", "completion": "a5=5,b8=13,c3=16>16", "reference": {reference}, "id": "right"}}"#
        ),
        format!(
            r#"{{"prompt": "a5b8c3=", "completion": "a5=5,b8=3,c3=6>6", "reference": {reference}}}"#
        ),
        "{not json".to_string(),
        format!(r#"{{"prompt": "a5b8c3=", "reference": {reference}}}"#),
        format!(r#"{{"completion": "a5=5>", "reference": {reference}, "metadata": 3}}"#),
        format!(r#"{{"completion": "a5=5>5", "reference": {{"terms": [5]}}}}"#),
    ];
    for k in 0..200 {
        lines.push(format!(
            r#"{{"completion": "x>{}", "reference": {{"answer": {k}}}, "data_source": "chain-sum"}}"#,
            k + k % 3
        ));
    }
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let grade = |config: &str, threads: &str, extra: &[&str]| {
        let mut args = vec![
            "grade",
            "reward",
            input.to_str().unwrap(),
            "--config",
            config,
            "-j",
            threads,
        ];
        args.extend(extra);
        let out = areal(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        (json_lines(&out.stdout), text(&out.stderr))
    };
    let summary = |results: &[serde_json::Value]| -> Vec<(u64, String, String)> {
        results
            .iter()
            .map(|r| {
                (
                    r["line"].as_u64().unwrap(),
                    r["verdict"].as_str().unwrap().to_owned(),
                    r["reward"].to_string(),
                )
            })
            .collect()
    };
    let (want, stderr) = grade(&configs[0], "1", &[]);
    assert_eq!(want.len(), lines.len());
    assert!(stderr.contains("graded 206 lines"), "{stderr}");
    let first: Vec<&str> = want[..6]
        .iter()
        .map(|r| r["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(
        first,
        [
            "accepted",
            "wrong_answer",
            "error",
            "error",
            "error",
            "error"
        ]
    );
    assert_eq!(want[0]["id"], "right");
    assert!(
        want[2]["error"]
            .as_str()
            .unwrap()
            .contains("line 3: not JSON")
    );
    assert!(
        want[3]["error"]
            .as_str()
            .unwrap()
            .contains("line 4: no `completion`")
    );
    assert!(
        want[4]["error"]
            .as_str()
            .unwrap()
            .contains("`metadata` must be an object")
    );
    // a reference without `answer` is the reward's error, and grading goes on
    assert!(
        want[5]["error"].as_str().unwrap().contains("answer"),
        "{}",
        want[5]
    );
    let accepted = want.iter().filter(|r| r["verdict"] == "accepted").count();
    assert_eq!(accepted, 1 + (0..200).filter(|k| k % 3 == 0).count());
    for config in &configs[1..] {
        for threads in ["1", "2"] {
            let (got, _) = grade(config, threads, &[]);
            // the plugins' own errors differ in words, not in where they are
            assert_eq!(
                summary(&got),
                summary(&want),
                "{config} on {threads} threads"
            );
            assert!(got[0]["details"]["plugin_sha256"].as_str().is_some());
        }
    }
    // the cache: a second run answers every valid line from the first run's rewards
    let cache = dir.path().join("cache");
    let set = format!("reward_service.cache_dir={:?}", cache.display().to_string());
    let cached = ["--set", "reward_service.cache=true", "--set", &set];
    let (cold, _) = grade(&configs[2], "2", &cached);
    assert!(cold.iter().all(|r| r["cached"] != true));
    let (warm, stderr) = grade(&configs[2], "2", &cached);
    assert_eq!(summary(&warm), summary(&cold));
    let hits = warm.iter().filter(|r| r["cached"] == true).count();
    assert_eq!(
        hits, 202,
        "every line with a reward (not the 3 unreadable ones, nor the one the reward failed): {stderr}"
    );
    assert!(stderr.contains("cache hits 202 of 203"), "{stderr}");
}

/// Issue 45: a Python reward's NaN (`np.mean([])`) cost the sample unnoticed. It is the
/// reward's bug: an error naming the sample, in the log (the first few), counted in each
/// step's `reward_failures` and the summary's, and the sample is not trained on.
#[test]
fn a_reward_that_answers_nan_costs_named_and_counted_samples() {
    let dir = tempfile::tempdir().unwrap();
    let reward = dir.path().join("sometimes_nan.py");
    std::fs::write(
        &reward,
        "import random\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return float('nan') if random.random() < 0.5 else 0.5\n",
    )
    .unwrap();
    let config = dir.path().join("config.toml");
    let text_of = areal_testkit::CONFIG.replace(
        "[reward]\nkind = \"testkit-successor\"",
        &format!("[reward]\nkind = \"python\"\npath = {:?}", reward),
    );
    assert_ne!(text_of, areal_testkit::CONFIG);
    std::fs::write(&config, text_of).unwrap();
    let run = dir.path().join("run");
    let out = areal(&[
        "train",
        "--config",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--set",
        "train.steps=3",
        "--set",
        "eval.enabled=false",
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let named: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("the sample lost its reward and is not trained on"))
        .collect();
    assert!(!named.is_empty() && named.len() <= 10, "{stderr}");
    assert!(
        named
            .iter()
            .all(|l| l.contains("sample_id=") && l.contains("not finite")),
        "{named:?}"
    );
    let steps = super::records(&run, "step");
    let lost: u64 = steps
        .iter()
        .map(|s| s["reward_failures"].as_u64().unwrap())
        .sum();
    assert!(lost > 0, "{steps:?}");
    assert!(super::summary(&run)["reward_failures"].as_u64().unwrap() >= lost);
}
