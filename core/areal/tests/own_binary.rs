//! A user's crate: its own reward plugin, registered here, and the areal command line used as
//! a library to train with it.

use std::process::ExitCode;
use std::sync::Arc;

// The testkit's plugins (its job is what this test trains), linked as `areal` links them.
use areal_testkit as _;

use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, Verdict,
    VerifyContext, register_reward,
};

/// Rewards completions that start with the letter after the prompt's.
struct FirstLetter;

impl RewardVerifier for FirstLetter {
    fn name(&self) -> &str {
        "first-letter"
    }

    fn verify(&self, input: &RewardInput, _: &VerifyContext) -> Result<Reward, PluginError> {
        let prompt = input.prompt.chars().next().unwrap_or('a');
        let want = char::from_u32('a' as u32 + (prompt as u32 - 'a' as u32 + 1) % 8).unwrap();
        Ok(if input.completion.starts_with(want) {
            Reward::new(1.0, Verdict::Accepted)
        } else {
            Reward::new(0.0, Verdict::WrongAnswer)
        })
    }
}

fn build(_: &PluginConfig, _: &BuildContext) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    Ok(Arc::new(FirstLetter))
}

register_reward!(
    "first-letter",
    "reward 1 when the first letter is right",
    build
);

#[test]
fn a_users_binary_trains_with_its_own_plugin() {
    assert!(
        areal_core::registered_plugins()
            .iter()
            .any(|p| p.name == "first-letter" && p.kind == "reward")
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let config = dir.path().join("testkit.toml");
    std::fs::write(&config, areal_testkit::CONFIG).unwrap();
    let code = areal_cli::main_from([
        "areal",
        "train",
        "-q",
        "--config",
        config.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--set",
        "reward.kind=first-letter",
        "--set",
        "train.steps=60",
    ]);
    assert_eq!(code, ExitCode::SUCCESS);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 60);
    // the policy learns what this plugin rewards: the first letter only
    let (first, last) = (
        summary["reward_mean_first"].as_f64().unwrap(),
        summary["reward_mean_last"].as_f64().unwrap(),
    );
    assert!(first < 0.3 && last > 0.5, "{summary}");
    assert!(
        std::fs::read_to_string(out.join("config.toml"))
            .unwrap()
            .contains("kind = \"first-letter\"")
    );
}
