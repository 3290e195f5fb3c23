//! The reward service: a crashed, failing or hung verifier costs one sample, never the run.

use std::sync::Arc;
use std::time::Duration;

use areal_core::RewardService;
use areal_sdk::{FinishReason, RewardInput, Verdict};
use areal_testkit::{FaultyOptions, FaultyVerifier};

use super::{chain, config, run_recorded};

/// A sample of one item (as the samples of a group are): only `sample_id` tells them apart.
fn input(sample_id: u64) -> RewardInput {
    RewardInput {
        metadata: Default::default(),
        sample_id,
        item_id: "item-1".into(),
        prompt: "c".into(),
        completion: "defgha".into(),
        completion_ids: vec![3, 4, 5, 6, 7, 0],
        finish_reason: FinishReason::Length,
        reference: serde_json::json!({"letters": 8, "length": 6}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_panicking_and_hung_verifiers_cost_one_sample_each() {
    let verifier = FaultyVerifier::new(FaultyOptions {
        panic_every: 5,
        error_every: 7,
        hang_every: 3,
        hang_ms: None, // an hour: this thread is lost
    });
    let deadline = Duration::from_millis(300);
    let service = Arc::new(RewardService::new(Arc::new(verifier), 2, deadline));
    let mut jobs = Vec::new();
    for id in 1..=20u64 {
        let service = service.clone();
        jobs.push(tokio::spawn(async move {
            (id, service.verify(input(id)).await)
        }));
    }
    let mut hung = 0;
    for job in jobs {
        let (id, verified) = tokio::time::timeout(Duration::from_secs(120), job)
            .await
            .expect("verify returned")
            .unwrap();
        let r = &verified.reward;
        let expected = if id % 3 == 0 {
            Verdict::VerifierTimeout
        } else if id % 5 == 0 {
            Verdict::VerifierCrashed
        } else if id % 7 == 0 {
            Verdict::Error
        } else {
            Verdict::Accepted
        };
        assert_eq!(r.verdict, expected, "sample {id}: {r:?}");
        assert_eq!(r.provenance.verifier, "testkit-faulty");
        if expected == Verdict::VerifierTimeout {
            hung += 1;
            assert!(
                verified.latency >= deadline,
                "timed out before the deadline: {:?}",
                verified.latency
            );
            assert!(
                r.provenance.details["error"]
                    .as_str()
                    .unwrap()
                    .contains("300 ms")
            );
        } else if expected == Verdict::Accepted {
            assert_eq!(r.value, 1.0);
        } else {
            assert_eq!(r.value, 0.0);
            assert!(
                r.provenance.details["error"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("sample {id}"))
            );
        }
    }
    assert_eq!(hung, 6);
    assert_eq!(service.abandoned(), 6);
    // the stuck threads stay stuck; the pool kept two working ones beside them
    assert_eq!(service.live_threads(), 2 + 6);
    let after = service.verify(input(1)).await;
    assert_eq!(after.reward.verdict, Verdict::Accepted);
}

/// A run whose verifier panics, fails and hangs on some samples still trains every step,
/// and reports the lost samples.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulty_verifier_never_costs_the_run() {
    let config = config(&[
        "reward.kind=testkit-faulty",
        "reward.panic_every=29",
        "reward.error_every=11",
        "reward.hang_every=13",
        "reward.hang_ms=2000",
        "reward_service.deadline_ms=100",
        "train.steps=15",
        "eval.enabled=false",
    ]);
    let (summary, recorder) = run_recorded(config, None).await;
    let summary = summary.unwrap();
    assert_eq!(summary.steps, 15);
    assert!(summary.reward_failures > 0, "{summary:?}");
    let steps = recorder.steps.lock().unwrap();
    let lost: u64 = steps.iter().map(|m| m.reward_failures).sum();
    assert!(lost > 0);
    // groups that lost samples are trained with the rest
    assert!(
        steps.iter().any(|m| m.samples < m.groups * 4),
        "no group was trained short"
    );
    for (_, groups) in recorder.trained.lock().unwrap().iter() {
        for s in groups.iter().flat_map(|g| &g.samples) {
            assert!(!s.reward.verdict.is_failure());
            assert!(s.sample_id % 29 != 0 && s.sample_id % 11 != 0 && s.sample_id % 13 != 0);
        }
    }
}

/// A verifier that returns after its deadline frees its thread: the pool shrinks back to the
/// configured size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_verifiers_give_their_thread_back() {
    let verifier = FaultyVerifier::new(FaultyOptions {
        hang_every: 2,
        hang_ms: Some(400),
        ..FaultyOptions::default()
    });
    let service = RewardService::new(Arc::new(verifier), 2, Duration::from_millis(100));
    let late = service.verify(input(2)).await;
    assert_eq!(late.reward.verdict, Verdict::VerifierTimeout);
    assert_eq!(service.live_threads(), 3);
    assert_eq!(
        service.verify(input(1)).await.reward.verdict,
        Verdict::Accepted
    );
    let mut waited = Duration::ZERO;
    while service.live_threads() > 2 && waited < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    assert_eq!(service.live_threads(), 2);
    assert_eq!(
        service.verify(input(3)).await.reward.verdict,
        Verdict::Accepted
    );
}

/// A verifier that fails on every sample once left the run generating and rejecting groups
/// forever, never counting a failure. Now a group with no reward left is a failed rollout:
/// `rollout.max_consecutive_failures` of them in a row stop the run with the verifier's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verifier_that_fails_on_every_sample_stops_the_run() {
    let config = config(&[
        "reward.kind=testkit-faulty",
        "reward.error_every=1",
        "rollout.max_consecutive_failures=2",
        "eval.enabled=false",
    ]);
    let (result, recorder) = run_recorded(config, None).await;
    let chain = chain(&result.unwrap_err());
    assert!(
        chain.contains("rollout.max_consecutive_failures"),
        "{chain}"
    );
    assert!(chain.contains("lost its reward"), "{chain}");
    assert!(chain.contains("testkit-faulty"), "{chain}");
    assert!(
        chain.contains("as configured"),
        "the verifier's own message: {chain}"
    );
    assert!(recorder.steps.lock().unwrap().is_empty());
}

/// With `reward_service.cache`, a completion graded once is answered from the cache: the
/// rewards are the same as without it, and the steps report the hit rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reward_cache_answers_repeated_completions_with_the_same_rewards() {
    let service = RewardService::from_config(
        Arc::new(areal_testkit::SuccessorVerifier),
        &areal_core::RewardServiceConfig {
            cache: true,
            cache_dir: String::new(),
            ..Default::default()
        },
    );
    let first = service.verify(input(1)).await;
    let again = service.verify(input(2)).await;
    assert!(
        !first.cached && again.cached,
        "same completion and reference"
    );
    assert_eq!(again.reward, first.reward);
    let mut other = input(3);
    other.completion = "dex".into();
    let other = service.verify(other).await;
    assert!(!other.cached);
    assert_eq!(service.cache().unwrap().stats(), (1, 3));

    let config = config(&[
        "reward_service.cache=true",
        "reward_service.cache_dir=",
        "train.steps=12",
        "eval.enabled=false",
    ]);
    let (summary, recorder) = run_recorded(config, None).await;
    assert_eq!(summary.unwrap().steps, 12);
    let steps = recorder.steps.lock().unwrap();
    let rates: Vec<f64> = steps.iter().map(|m| m.reward_cache_hit_rate).collect();
    assert!(rates.iter().all(|r| (0.0..=1.0).contains(r)), "{rates:?}");
    assert!(
        rates.iter().any(|r| *r > 0.0),
        "the testkit's short completions repeat: {rates:?}"
    );
}

/// Counts its calls and takes 200 ms over each, so that identical samples overlap.
#[derive(Default)]
struct SlowCounting(std::sync::atomic::AtomicUsize);

impl areal_sdk::RewardVerifier for SlowCounting {
    fn name(&self) -> &str {
        "slow-counting"
    }

    fn verify(
        &self,
        input: &RewardInput,
        _ctx: &areal_sdk::VerifyContext,
    ) -> Result<areal_sdk::Reward, areal_sdk::PluginError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(200));
        if input.completion == "fail" {
            return Err(areal_sdk::PluginError::failed("slow-counting", "as asked"));
        }
        Ok(areal_sdk::Reward::new(1.0, Verdict::Accepted))
    }

    fn cache_identity(&self) -> Option<String> {
        Some("1".into())
    }
}

/// A group whose completions agree is sent to the cache all at once: the first sample is
/// verified and the others wait for its reward instead of being verified again; when that
/// verification fails, each of them is verified on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_samples_in_flight_together_are_verified_once() {
    let verifier = Arc::new(SlowCounting::default());
    let service = Arc::new(RewardService::from_config(
        verifier.clone(),
        &areal_core::RewardServiceConfig {
            threads: 8,
            cache: true,
            cache_dir: String::new(),
            ..Default::default()
        },
    ));
    let group = |completion: &'static str| {
        (1..=8u64)
            .map(|id| {
                let service = service.clone();
                let mut sample = input(id);
                sample.completion = completion.into();
                tokio::spawn(async move { service.verify(sample).await })
            })
            .collect::<Vec<_>>()
    };
    let mut cached = 0;
    for job in group("same") {
        let verified = job.await.unwrap();
        assert_eq!(verified.reward.verdict, Verdict::Accepted);
        cached += usize::from(verified.cached);
    }
    assert_eq!(verifier.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(cached, 7);
    assert_eq!(service.cache().unwrap().stats(), (7, 8));
    for job in group("fail") {
        assert_eq!(job.await.unwrap().reward.verdict, Verdict::Error);
    }
    assert_eq!(verifier.0.load(std::sync::atomic::Ordering::SeqCst), 1 + 8);
}
