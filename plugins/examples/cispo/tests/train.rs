//! The example crate as a user would check theirs: the `areal` binary built from it lists the
//! new algorithm and trains with it, and the loss has the gradient of CISPO's formula.

use std::process::Command;

use areal_sdk::{BuildContext, PluginConfig};
use areal_sdk_train::burn::tensor::{Device, Tensor, TensorData};
use areal_sdk_train::{
    AlgorithmPlugin, BehaviourLogprobs, CurrentLogprobs, LossInput, ProximalLogprobs,
};

fn areal() -> Command {
    Command::new(env!("CARGO_BIN_EXE_areal-with-cispo"))
}

#[test]
fn the_binary_lists_cispo_and_trains_one_step_with_it() {
    let out = areal().arg("plugins").output().unwrap();
    assert!(out.status.success());
    let listing = String::from_utf8(out.stdout).unwrap();
    let line = listing
        .lines()
        .find(|l| l.contains("cispo"))
        .unwrap_or_else(|| panic!("cispo missing from:\n{listing}"));
    assert!(
        line.contains("clipped, stop-gradient importance weights"),
        "{line}"
    );
    // the built-in plugins are all there too
    assert!(
        listing.contains("decoupled-ppo") && listing.contains("chain-sum"),
        "{listing}"
    );

    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let status = areal()
        .args([
            "train",
            "-q",
            "--set",
            "algorithm.kind=cispo",
            "--set",
            "algorithm.eps_high=0.2",
        ])
        .args(["--set", "train.steps=1", "--set", "warmup.enabled=false"])
        .args(["--set", "eval.enabled=false", "--out"])
        .arg(&run)
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["algorithm"], "cispo");
    assert_eq!(summary["steps"], 1);
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let step: serde_json::Value = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["event"] == "step")
        .unwrap();
    assert!(
        step["algorithm"]["weight_clipped_fraction"].is_number(),
        "{step}"
    );
    assert!(step["trained_tokens"].as_u64().unwrap() > 0, "{step}");

    // a bad option is named with its key
    let out = areal()
        .args([
            "train",
            "-q",
            "--set",
            "algorithm.kind=cispo",
            "--set",
            "algorithm.eps_high=-1",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`algorithm.eps_high`") && err.contains("-1"),
        "{err}"
    );
}

#[test]
#[allow(
    clippy::single_range_in_vec_init,
    reason = "one sequence: its completion range"
)]
fn the_gradient_is_the_clipped_weight_times_the_advantage() {
    use areal_example_cispo as _;
    let cfg = PluginConfig::new("algorithm", "cispo").with("eps_low", 0.2);
    let cispo = AlgorithmPlugin::build_from(&cfg, &BuildContext::new(0, 1)).unwrap();
    let device = Device::flex().autodiff();
    let t = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &device);
    // one prompt token, then ratios 2.0 (clipped to 1.28), 0.5 (clipped to 0.8) and 1.1
    let old = [0.0f32, -1.0, -1.0, -1.0];
    let current = [
        0.0f32,
        -1.0 + 2f32.ln(),
        -1.0 + 0.5f32.ln(),
        -1.0 + 1.1f32.ln(),
    ];
    let adv = [0.0f32, 1.0, -2.0, 0.5];
    let current_t = t(&current).require_grad();
    let input = LossInput {
        current: CurrentLogprobs(current_t.clone()),
        proximal: ProximalLogprobs(t(&old)),
        behaviour: BehaviourLogprobs(t(&old)),
        advantages: t(&adv),
        loss_mask: t(&[0.0, 1.0, 1.0, 1.0]),
        versions: vec![areal_sdk::PROMPT_VERSION, 0, 0, 0],
        completions: vec![1..4],
        minibatch_tokens: 3,
        minibatch_sequences: 1,
        trainer_version: 0,
        reference: None,
        critic: None,
    };
    let out = cispo.loss(&input).unwrap();
    let weights = [0.0f32, 1.28, 0.8, 1.1];
    let want: f32 = -(1..4)
        .map(|i| weights[i] * adv[i] * current[i])
        .sum::<f32>()
        / 3.0;
    let loss = out.loss.clone().into_scalar::<f32>();
    assert!((loss - want).abs() < 1e-5, "{loss} vs {want}");
    let grads = out.loss.backward();
    let grad: Vec<f32> = current_t
        .grad(&grads)
        .unwrap()
        .into_data()
        .try_to_vec()
        .unwrap();
    for i in 0..4 {
        let want = -weights[i] * adv[i] / 3.0;
        assert!(
            (grad[i] - want).abs() < 1e-6,
            "token {i}: {} vs {want}",
            grad[i]
        );
    }
    assert!((out.stats.means()["weight_clipped_fraction"] - 2.0 / 3.0).abs() < 1e-9);
}
