//! The example crate as a user would check theirs: the verifier passes the SDK's conformance
//! checks, and the `areal` binary built from it lists the new reward and trains with it.

use std::process::Command;
use std::sync::Arc;

use areal_example_chain_steps::{ChainSteps, Options};
use areal_sdk::{FinishReason, RewardInput};

fn areal() -> Command {
    Command::new(env!("CARGO_BIN_EXE_areal-with-chain-steps"))
}

fn input(id: u64, completion: &str) -> RewardInput {
    RewardInput {
        metadata: Default::default(),
        sample_id: id,
        item_id: format!("item-{id}"),
        prompt: "a5b8c3=".into(),
        completion: completion.into(),
        completion_ids: Vec::new(),
        finish_reason: FinishReason::Stop,
        reference: serde_json::json!({"terms": [5, 8, 3], "answer": 16}),
    }
}

#[test]
fn the_verifier_conforms() {
    areal_testkit::conformance::check_verifier(
        Arc::new(ChainSteps::new(Options::default())),
        &[
            (input(1, "a5=5,b8=13,c3=16>16"), 1.0),
            (input(2, "a5=5,b8=3,c3=6>6"), 0.5 / 3.0),
            (input(3, "a5=5,b8=13,c3=6>16"), 0.5 + 0.5 * 2.0 / 3.0),
            (input(4, "a5=4,b8=3,c3=1>1"), 0.0),
            (input(5, "no answer"), 0.0),
        ],
    );
}

#[test]
fn the_binary_lists_the_reward_and_trains_with_it() {
    let out = areal().arg("plugins").output().unwrap();
    assert!(out.status.success());
    let listing = String::from_utf8(out.stdout).unwrap();
    assert!(
        listing
            .lines()
            .any(|l| l.contains("chain-steps") && l.contains("partial credit")),
        "chain-steps missing from:\n{listing}"
    );
    assert!(
        listing.contains("decoupled-ppo") && listing.contains("math"),
        "{listing}"
    );

    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let status = areal()
        .args([
            "train",
            "-q",
            "--set",
            "reward.kind=chain-steps",
            "--set",
            "reward.final_weight=0.7",
        ])
        .args(["--set", "train.steps=2", "--set", "warmup.enabled=false"])
        .args(["--set", "eval.enabled=false", "--out"])
        .arg(&run)
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 2);
    assert_eq!(summary["reward_failures"], 0);
    // The untrained model writes garbage, but partial credit is possible: rewards lie in [0, 1].
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["event"] == "step")
        .collect();
    assert_eq!(steps.len(), 2);
    for s in &steps {
        let mean = s["reward_mean"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&mean), "{s}");
    }

    // A bad option is named with its key.
    let out = areal()
        .args([
            "train",
            "-q",
            "--set",
            "reward.kind=chain-steps",
            "--set",
            "reward.final_weight=2",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("reward.final_weight") && err.contains("between 0 and 1"),
        "{err}"
    );
}
