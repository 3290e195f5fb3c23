//! The reward verifier check.

use std::sync::Arc;
use std::time::Duration;

use areal_sdk::{RewardInput, RewardVerifier, VerifyContext};

/// Check a verifier as the engine will call it, on cases with known rewards:
/// - every case is `Ok`, with a finite reward equal to the expected one and a verdict the
///   engine does not reserve for itself: a wrong answer is a low reward, never an error;
/// - the cases include at least one wrong answer (a reward below the best one);
/// - the same sample twice gives the same reward and verdict;
/// - the provenance names the verifier's version;
/// - with a deadline already past, `verify` returns (`Ok` or `Err`) within 2 seconds instead
///   of running on (it runs on a thread of its own here, so a hang fails the check).
pub fn check_verifier(verifier: Arc<dyn RewardVerifier>, cases: &[(RewardInput, f64)]) {
    let name = verifier.name().to_owned();
    assert!(!cases.is_empty(), "{name}: no cases given");
    let best = cases
        .iter()
        .map(|(_, e)| *e)
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(
        cases.iter().any(|(_, e)| *e < best),
        "{name}: give at least one wrong answer among the cases"
    );
    for (input, expected) in cases {
        let ctx = VerifyContext::with_timeout(Duration::from_secs(60));
        let reward = verifier
            .verify(input, &ctx)
            .unwrap_or_else(|e| panic!("{name}: sample {} failed: {e}", input.sample_id));
        assert!(
            reward.value.is_finite(),
            "{name}: non-finite reward {}",
            reward.value
        );
        assert!(
            !reward.verdict.is_failure(),
            "{name}: verdict {:?} is reserved for the engine",
            reward.verdict
        );
        assert!(
            (reward.value - expected).abs() < 1e-9,
            "{name}: sample {} ({:?}) got reward {}, expected {expected}",
            input.sample_id,
            input.completion,
            reward.value
        );
        assert!(
            !reward.provenance.verifier_version.is_empty(),
            "{name}: the reward's provenance has no verifier_version"
        );
        let again = verifier.verify(input, &ctx).expect("second verify");
        assert_eq!(again.value, reward.value, "{name}: not deterministic");
        assert_eq!(again.verdict, reward.verdict, "{name}: not deterministic");
    }
    // A deadline already past: the verifier must give its thread back.
    let (tx, rx) = std::sync::mpsc::channel();
    let on_thread = Arc::clone(&verifier);
    let input = cases[0].0.clone();
    std::thread::spawn(move || {
        let ctx = VerifyContext::with_timeout(Duration::ZERO);
        let _ = on_thread.verify(&input, &ctx);
        let _ = tx.send(());
    });
    if rx.recv_timeout(Duration::from_secs(2)).is_err() {
        panic!("{name}: still running 2 s after its deadline passed");
    }
}
