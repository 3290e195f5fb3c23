//! The `math` reward plugin as the engine builds and calls it.

use std::time::Duration;

use areal_sdk::{
    BuildContext, FinishReason, PluginConfig, RewardInput, RewardPlugin, Verdict, VerifyContext,
};
use areal_testkit::conformance;
use serde_json::{Value, json};

// Link the crate's registration.
use areal_reward_math as _;

fn input(id: u64, completion: &str, reference: Value) -> RewardInput {
    RewardInput {
        metadata: Default::default(),
        sample_id: id,
        item_id: format!("item-{id}"),
        prompt: "What is 14/3 as a fraction?".into(),
        completion: completion.into(),
        completion_ids: Vec::new(),
        finish_reason: FinishReason::Stop,
        reference,
    }
}

fn build(
    config: PluginConfig,
) -> Result<std::sync::Arc<dyn areal_sdk::RewardVerifier>, areal_sdk::PluginError> {
    RewardPlugin::build_from(&config, &BuildContext::new(1, 1))
}

#[test]
fn conforms_and_records_what_it_read() {
    let verifier = build(PluginConfig::new("reward", "math")).unwrap();
    conformance::check_verifier(
        std::sync::Arc::clone(&verifier),
        &[
            (
                input(
                    1,
                    "So the answer is $\\boxed{\\dfrac{14}{3}}$.",
                    json!("\\frac{14}{3}"),
                ),
                1.0,
            ),
            (
                input(
                    2,
                    "The answer is 4.666667.",
                    json!({"answer": "\\frac{14}{3}"}),
                ),
                1.0,
            ),
            (
                input(3, "The answer is $\\boxed{5}$.", json!("\\frac{14}{3}")),
                0.0,
            ),
            (input(4, "I cannot tell.", json!("\\frac{14}{3}")), 0.0),
            (input(5, "$\\boxed{42}$", json!(42)), 1.0),
        ],
    );
    let ctx = VerifyContext::with_timeout(Duration::from_secs(5));
    let reward = verifier
        .verify(
            &input(
                1,
                "So the answer is $\\boxed{\\dfrac{14}{3}}$.",
                json!("\\frac{14}{3}"),
            ),
            &ctx,
        )
        .unwrap();
    assert_eq!(reward.verdict, Verdict::Accepted);
    assert_eq!(reward.provenance.verifier, "math");
    assert!(
        reward
            .provenance
            .verifier_version
            .starts_with("areal-reward-math ")
    );
    assert_eq!(reward.provenance.details["gold"], "14/3");
    assert_eq!(reward.provenance.details["pred"], "14/3");
    assert_eq!(reward.provenance.limits["timeout_s"], 5.0);
    let none = verifier
        .verify(&input(4, "I cannot tell.", json!("3")), &ctx)
        .unwrap();
    assert_eq!(none.verdict, Verdict::NoAnswer);
    let wrong = verifier
        .verify(&input(3, "$\\boxed{5}$", json!("3")), &ctx)
        .unwrap();
    assert_eq!(wrong.verdict, Verdict::WrongAnswer);
}

#[test]
fn a_bad_reference_or_option_is_named() {
    let verifier = build(PluginConfig::new("reward", "math")).unwrap();
    let ctx = VerifyContext::with_timeout(Duration::from_secs(5));
    let err = verifier
        .verify(&input(9, "$1$", json!([1, 2])), &ctx)
        .unwrap_err()
        .to_string();
    assert!(err.contains("item-9") && err.contains("reference"), "{err}");
    for (key, value, says) in [
        ("timeout_s", json!(0), "reward.timeout_s"),
        ("float_rounding", json!(40), "reward.float_rounding"),
        ("floatrounding", json!(2), "reward.floatrounding"),
        ("latex", json!("yes"), "reward.latex"),
    ] {
        let err = build(PluginConfig::new("reward", "math").with(key, value))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(says), "{key}: {err}");
    }
}

#[test]
fn the_engine_deadline_applies() {
    let verifier = build(PluginConfig::new("reward", "math")).unwrap();
    let heavy: String = (0..400)
        .map(|k| format!("\\frac{{x^{{{k}}}}}{{{}}}+", k + 1))
        .collect::<String>()
        + "1";
    let ctx = VerifyContext::with_timeout(Duration::from_millis(1));
    std::thread::sleep(Duration::from_millis(2));
    let started = std::time::Instant::now();
    let err = verifier
        .verify(
            &input(7, &format!("$\\boxed{{{heavy}}}$"), json!(heavy)),
            &ctx,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("deadline"), "{err}");
    assert!(started.elapsed() < Duration::from_millis(500));
}
