//! End-to-end tests of the engine with the testkit plugins: real async runs over real threads.

use std::sync::{Arc, Mutex};

use areal_core::{
    AdmissionCounts, Config, ConfigLoader, EngineError, Observer, Plugins, RunOptions, RunSummary,
    StepMetrics, run,
};
use areal_sdk::{PolicyVersion, TrajectoryGroup, WeightUpdate};
// Link the plugin crates whose registrations these tests use.
use areal_algo_ppo as _;
use areal_gen_burn as _;
use areal_model as _;
use areal_reward_math as _;
use areal_tasks as _;
use areal_testkit as _;

mod episodes;
mod interruption;
mod math;
mod pipeline;
mod rewards;
mod trainer;

/// The testkit run (see `areal_testkit::CONFIG`) with `overrides`.
fn config(overrides: &[&str]) -> Config {
    ConfigLoader::new()
        .toml(areal_testkit::CONFIG, std::path::Path::new("testkit.toml"))
        .unwrap()
        .set_all(overrides)
        .unwrap()
        .load()
        .unwrap()
}

#[derive(Default)]
struct Recorder {
    admissions: Mutex<Vec<AdmissionCounts>>,
    trained: Mutex<Vec<(PolicyVersion, Vec<TrajectoryGroup>)>>,
    steps: Mutex<Vec<StepMetrics>>,
}

impl Observer for Recorder {
    fn on_admission(&self, counts: &AdmissionCounts) {
        self.admissions.lock().unwrap().push(*counts);
    }
    fn on_trained(&self, groups: &[TrajectoryGroup], version: PolicyVersion) {
        self.trained
            .lock()
            .unwrap()
            .push((version, groups.to_vec()));
    }
    fn on_step(&self, metrics: &StepMetrics) {
        self.steps.lock().unwrap().push(metrics.clone());
    }
}

async fn run_recorded(
    config: Config,
    out: Option<&std::path::Path>,
) -> (Result<RunSummary, EngineError>, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let plugins = Plugins::build(&config).unwrap();
    let options = RunOptions {
        out_dir: out.map(|p| p.to_owned()),
        observer: recorder.clone(),
        ..RunOptions::default()
    };
    (within_limit(run(config, plugins, options)).await, recorder)
}

/// A run that deadlocks fails the test instead of hanging it.
/// An error and its cause, as `areal` prints them.
fn chain(err: &EngineError) -> String {
    format!(
        "{err}: {}",
        std::error::Error::source(err)
            .map(|s| s.to_string())
            .unwrap_or_default()
    )
}

async fn within_limit<T>(run: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(600), run)
        .await
        .expect("the run did not finish within 10 minutes")
}

/// The default config trains the bigram policy through every stage, asynchronously, and it
/// learns: sampled reward from ~0.02 to above 0.9, greedy held-out accuracy from 0 to 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testkit_run_learns_through_every_stage() {
    let dir = tempfile::tempdir().unwrap();
    let (summary, recorder) = run_recorded(config(&[]), Some(dir.path())).await;
    let summary = summary.unwrap();
    assert_eq!(summary.steps, 60);
    assert_eq!(summary.policy_version, 60);
    assert_eq!(summary.baseline_accuracy, Some(0.0));
    assert_eq!(summary.final_accuracy, Some(1.0));
    assert!(summary.reward_mean_first < 0.25, "{summary:?}");
    assert!(summary.reward_mean_last > 0.9, "{summary:?}");
    // Generation ran ahead of training: stale data was trained. (The rule bounds how far
    // generation runs ahead, not the lag of a group that finishes late, so no upper bound.)
    assert!(summary.token_lag_max >= 1, "{summary:?}");
    assert!(summary.groups_accepted >= 60 * 8);

    // Every step reported, in order, with consistent numbers.
    let steps = recorder.steps.lock().unwrap();
    assert_eq!(steps.len(), 60);
    for (i, m) in steps.iter().enumerate() {
        assert_eq!(m.step, i as u64 + 1);
        assert_eq!(m.policy_version, i as u64 + 1);
        assert_eq!(m.groups, 8);
        assert_eq!(m.samples, 32);
        assert!(m.trained_tokens > 0 && m.train_tokens_per_s > 0.0);
        assert!(m.reward_latency_p99_ms >= m.reward_latency_p50_ms);
        assert!(
            m.on_policy_logprob_gap < 1e-4,
            "generator and trainer disagree: {}",
            m.on_policy_logprob_gap
        );
        assert!(m.algorithm.contains_key("clip_fraction"));
    }

    assert!(steps.iter().any(|m| m.reward_latency_p50_ms > 0.0));

    // The run folder.
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let resolved: Config = ConfigLoader::new()
        .toml(&read("config.toml"), std::path::Path::new("config.toml"))
        .unwrap()
        .load()
        .unwrap();
    assert_eq!(resolved, config(&[]));
    let lines: Vec<serde_json::Value> = read("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |kind: &str| lines.iter().filter(|l| l["event"] == kind).count();
    assert_eq!(count("step"), 60);
    assert_eq!(
        count("eval"),
        7,
        "before, every 10 steps and after the last"
    );
    let written: serde_json::Value = serde_json::from_str(&read("summary.json")).unwrap();
    assert_eq!(written["final_accuracy"], 1.0);
    assert_eq!(written["algorithm"], "decoupled-ppo");
    assert!(dir.path().join("checkpoint/bigram.json").exists());
}

/// Issue 32: the admission rule lets a group be trained with a lag past η (η + 1 through
/// remote generators, η + 2 in process were measured: a long-tailed group finishes late);
/// `rollout.max_lag` bounds the lag of every token trained, by leaving groups past it out
/// (`drop`: with η = 4 and a bound of 2, the groups generated furthest ahead are dropped) or
/// by slowing generation down and waiting for stragglers (`wait`). Generation jittered so
/// that groups finish far apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_lag_bounds_the_lag_of_every_token_trained() {
    for policy in ["drop", "wait"] {
        let config = config(&[
            "rollout.max_staleness=4",
            "rollout.max_lag=2",
            &format!("rollout.max_lag_policy=\"{policy}\""),
            "train.steps=16",
            "generator.token_delay_us=200",
            "generator.jitter=0.9",
            "eval.enabled=false",
        ]);
        let (summary, recorder) = run_recorded(config, None).await;
        let summary = summary.unwrap();
        assert_eq!(summary.steps, 16, "{policy}");
        assert!(summary.token_lag_max <= 2, "{policy}: {summary:?}");
        for (version, groups) in recorder.trained.lock().unwrap().iter() {
            for s in groups.iter().flat_map(|g| &g.samples) {
                let oldest = s.completion.versions.iter().min().unwrap();
                assert!(
                    version - oldest <= 2,
                    "{policy}: version {oldest} trained at {version}"
                );
            }
        }
        assert_eq!(
            summary.samples_admitted,
            summary.samples_trained + summary.samples_dropped + summary.samples_pending,
            "{policy}: every sample accounted for"
        );
        assert!(summary.samples_past_max_lag <= summary.samples_dropped);
        if policy == "drop" {
            assert!(summary.samples_past_max_lag > 0, "{summary:?}");
        }
    }
}

/// `withhold`: the same jittered run trains every group, and exactly its samples with a token
/// past the bound are withheld (they train no token); nothing is dropped for its lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_lag_withholds_exactly_the_samples_past_it() {
    let config = config(&[
        "rollout.max_staleness=4",
        "rollout.max_lag=1",
        "rollout.max_lag_policy=\"withhold\"",
        "train.steps=16",
        "generator.token_delay_us=200",
        "generator.jitter=0.9",
        "eval.enabled=false",
    ]);
    let (summary, recorder) = run_recorded(config, None).await;
    let summary = summary.unwrap();
    assert_eq!(summary.steps, 16);
    assert_eq!(summary.samples_past_max_lag, 0, "{summary:?}");
    let trained = recorder.trained.lock().unwrap();
    let steps = recorder.steps.lock().unwrap();
    let mut withheld = 0;
    for ((version, groups), m) in trained.iter().zip(steps.iter()) {
        let past = groups
            .iter()
            .flat_map(|g| &g.samples)
            .filter(|s| s.completion.sampled_versions().any(|v| version - v > 1))
            .count();
        assert_eq!(m.samples_withheld, past, "step {}", m.step);
        let stale = m.off_policy.as_ref().expect("decoupled-ppo recomputes");
        assert!(stale.mismatch.abs_max < 1e-4, "{stale:?}");
        withheld += past;
    }
    assert!(withheld > 0, "the jitter put samples past the bound");
    assert_eq!(summary.samples_withheld, withheld as u64);
    assert!(summary.staleness_abs_mean.unwrap() > 0.0, "{summary:?}");
    assert!(summary.mismatch_abs_max.unwrap() < 1e-4, "{summary:?}");
}

/// η = 0 is synchronous RL through the same code path: every trained token was sampled by
/// the version being trained, even when samples finish in random order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_runs_train_only_on_policy_tokens() {
    let config = config(&[
        "rollout.max_staleness=0",
        "train.steps=12",
        "generator.token_delay_us=100",
        "generator.jitter=0.9",
        "eval.enabled=false",
    ]);
    let (summary, recorder) = run_recorded(config, None).await;
    let summary = summary.unwrap();
    assert_eq!(summary.token_lag_max, 0);
    let trained = recorder.trained.lock().unwrap();
    assert_eq!(trained.len(), 12);
    for (version, groups) in trained.iter() {
        for sample in groups.iter().flat_map(|g| &g.samples) {
            assert!(
                sample.completion.versions.iter().all(|v| v == version),
                "{:?} at {version}",
                sample.completion.versions
            );
        }
        assert!(groups.iter().all(|g| g.admitted_at == *version));
    }
    for m in recorder.steps.lock().unwrap().iter() {
        assert_eq!(
            m.interrupted_samples, 0,
            "nothing is in flight at a synchronous weight update"
        );
        assert!(m.on_policy_logprob_gap < 1e-5);
    }
}

/// The admission rule holds at every submission of real runs, whatever the group size,
/// batch size, η, concurrency limit and finish order.
#[test]
fn admission_rule_holds_in_real_runs() {
    use proptest::prelude::*;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 12,
        ..ProptestConfig::default()
    });
    let strategy = (1usize..5, 1usize..5, 0u64..4, 1usize..10, 0u64..3);
    runner
        .run(&strategy, |(batch, group, eta, concurrent, seed)| {
            let config = config(&[
                &format!("rollout.batch_size={batch}"),
                &format!("rollout.group_size={group}"),
                &format!("rollout.max_staleness={eta}"),
                &format!("rollout.max_concurrent={concurrent}"),
                &format!("seed={seed}"),
                "train.steps=8",
                "generator.token_delay_us=50",
                "generator.jitter=1.0",
                "eval.enabled=false",
            ]);
            let (summary, recorder) = runtime.block_on(run_recorded(config, None));
            let summary = summary.unwrap();
            let admissions = recorder.admissions.lock().unwrap();
            prop_assert!(admissions.len() as u64 >= 8 * batch as u64);
            for c in admissions.iter() {
                prop_assert!(
                    c.accepted + c.running <= (eta + c.version + 1) * batch as u64,
                    "{c:?} breaks the rule with B = {batch}, η = {eta}"
                );
                prop_assert!(
                    c.running <= concurrent as u64,
                    "{c:?} exceeds max_concurrent {concurrent}"
                );
            }
            for (version, groups) in recorder.trained.lock().unwrap().iter() {
                prop_assert_eq!(groups.len(), batch);
                let ids: Vec<u64> = groups.iter().map(|g| g.group_id).collect();
                prop_assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first: {ids:?}");
                prop_assert!(groups.iter().all(|g| g.samples.len() == group));
                prop_assert!(groups.iter().all(|g| g.admitted_at <= *version));
            }
            if eta == 0 {
                prop_assert_eq!(summary.token_lag_max, 0);
            }
            Ok(())
        })
        .unwrap();
}

/// Generation errors reject groups; too many in a row stop the run with the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_generator_stops_the_run_with_its_error() {
    let config = config(&["rollout.max_consecutive_failures=5", "eval.enabled=false"]);
    let mut plugins = Plugins::build(&config).unwrap();
    plugins.generator = Arc::new(interruption::Broken);
    let err = within_limit(run(config, plugins, RunOptions::default()))
        .await
        .unwrap_err();
    let chain = chain(&err);
    assert!(
        chain.contains("rollout.max_consecutive_failures"),
        "{chain}"
    );
    assert!(chain.contains("the model server is down"), "{chain}");
}

/// Plugins that panic cost the groups they were working on, not their admission slots and
/// not the run: the generator panics on some samples, the task on some items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_plugins_cost_only_their_groups() {
    let config = config(&[
        "train.steps=6",
        "eval.enabled=false",
        "rollout.max_staleness=1",
        // instant task failures outrun successful generations; do not stop the run for them
        "rollout.max_consecutive_failures=1000000",
    ]);
    let mut plugins = Plugins::build(&config).unwrap();
    plugins.generator = Arc::new(interruption::Panicky {
        inner: areal_testkit::BigramGenerator::new(Default::default()),
        every: 7,
    });
    plugins.task = Arc::new(interruption::PanickyTask {
        inner: plugins.task.clone(),
        every: 3,
    });
    let summary = within_limit(run(config, plugins, RunOptions::default()))
        .await
        .unwrap();
    assert_eq!(summary.steps, 6);
    // 6 steps × 8 groups accepted, while about two in three groups fail
    assert!(summary.groups_rejected > 48, "{summary:?}");
}

/// The largest staleness bound once wrapped `(η + i + 1) · B` to a tiny limit: the run
/// deadlocked with 0 steps. It is no bound at all, and the run trains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_staleness_bound_trains() {
    let config = config(&[
        "rollout.max_staleness=9223372036854775807",
        "train.steps=10",
        "eval.enabled=false",
    ]);
    let (summary, _) = run_recorded(config, None).await;
    let summary = summary.unwrap();
    assert_eq!(summary.steps, 10);
    assert_eq!(summary.max_staleness, i64::MAX as u64);
}

/// A plugin that fails to build for a reason other than one option is filed under its
/// section, never under an empty key.
#[test]
fn plugin_failures_are_filed_under_their_section() {
    let config = config(&[
        "policy.kind=transformer",
        "policy.alphabet=abcdefgh",
        "policy.hidden_size=1000000",
        "generator.kind=burn",
    ]);
    let Err(EngineError::Build { errors }) = Plugins::build(&config) else {
        panic!("expected a build error");
    };
    let loader = ConfigLoader::new();
    for e in &errors {
        let problem = loader.problem_from_plugin_error(e);
        assert!(!problem.key.is_empty(), "{e}");
    }
    assert!(
        errors.iter().any(|e| e.to_string().contains("`policy`")),
        "{errors:?}"
    );
}

/// Plugins that cannot be built are all reported, each with its config key.
#[test]
fn plugin_build_errors_are_all_reported() {
    let config = config(&[
        "algorithm.kind=decoupled-ppo",
        "algorithm.eps_clip=2.0",
        "task.letters=40",
        "generator.kind=vllm",
        "reward.threads=3",
    ]);
    let Err(EngineError::Build { errors }) = Plugins::build(&config) else {
        panic!("expected build errors");
    };
    let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    let all = text.join("\n");
    for needle in [
        "`algorithm.eps_clip`",
        "`task.letters`",
        "`generator.kind`",
        "`reward.threads`",
        "(known: burn, testkit-bigram)",
    ] {
        assert!(all.contains(needle), "{needle} missing from:\n{all}");
    }
    assert_eq!(errors.len(), 4, "{all}");
}

/// A chat format needs a model with a chat template: without one the run is refused before
/// anything runs, naming the key; a system message without the chat format is a config error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_format_without_a_chat_template_is_refused_by_its_key() {
    let (result, recorder) = run_recorded(config(&["prompt.format=chat"]), None).await;
    let error = chain(&result.unwrap_err());
    assert!(
        error.contains("prompt.format = \"chat\" needs the model's chat template"),
        "{error}"
    );
    assert!(recorder.steps.lock().unwrap().is_empty());
    let error = ConfigLoader::new()
        .toml(areal_testkit::CONFIG, std::path::Path::new("testkit.toml"))
        .unwrap()
        .set_all(["prompt.system=be brief"])
        .unwrap()
        .load()
        .unwrap_err()
        .to_string();
    assert!(error.contains("prompt.system"), "{error}");
}

#[test]
fn a_bad_generator_device_is_named_with_its_key() {
    let config = config(&["generator.kind=burn", "generator.device=tpu"]);
    let Err(EngineError::Build { errors }) = Plugins::build(&config) else {
        panic!("expected a build error");
    };
    let all: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    let all = all.join("\n");
    assert_eq!(errors.len(), 1, "{all}");
    assert!(
        all.contains("`generator.device`") && all.contains("\"tpu\""),
        "{all}"
    );
}

/// DAPO's dynamic filtering in a real run: a group whose rewards are all equal is dropped and
/// counted as rejected, so it frees its admission slot; the rule holds and only groups with a
/// learning signal are trained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filtered_groups_are_rejected_and_the_rule_still_holds() {
    let config = config(&[
        "algorithm.kind=dapo",
        "train.steps=6",
        "eval.enabled=false",
        "rollout.max_staleness=1",
    ]);
    let batch = config.rollout.batch_size as u64;
    let (summary, recorder) = run_recorded(config, None).await;
    let summary = summary.unwrap();
    assert_eq!(summary.steps, 6);
    assert!(summary.groups_rejected > 0, "{summary:?}");
    for c in recorder.admissions.lock().unwrap().iter() {
        assert!(
            c.accepted + c.running <= (1 + c.version + 1) * batch,
            "{c:?} breaks the rule"
        );
    }
    for (_, groups) in recorder.trained.lock().unwrap().iter() {
        for g in groups {
            let first = g.samples[0].reward.value;
            assert!(
                g.samples.iter().any(|s| s.reward.value != first),
                "group {} with equal rewards was trained",
                g.group_id
            );
        }
    }
}

/// `train.max_seconds` ends a run after the step that passes it, with the final evaluation
/// as usual; the observer sees the weights RL starts from and then every step's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_limit_ends_the_run_after_the_step_that_passes_it() {
    #[derive(Default)]
    struct Versions(Mutex<Vec<PolicyVersion>>);
    impl Observer for Versions {
        fn on_weights(&self, update: &WeightUpdate) {
            self.0.lock().unwrap().push(update.version);
        }
    }
    let config = config(&[
        "train.steps=1000000",
        "train.max_seconds=0.5",
        "generator.token_delay_us=200",
        "eval.every=0",
    ]);
    let versions = Arc::new(Versions::default());
    let options = RunOptions {
        observer: versions.clone(),
        ..RunOptions::default()
    };
    let plugins = Plugins::build(&config).unwrap();
    let summary = within_limit(run(config, plugins, options)).await.unwrap();
    assert!(summary.stopped_early);
    assert!(summary.steps >= 1 && summary.steps < 1_000_000);
    assert!(
        summary.rl_seconds >= 0.5 && summary.rl_seconds < 5.0,
        "{}",
        summary.rl_seconds
    );
    let seen = versions.0.lock().unwrap().clone();
    assert_eq!(seen, (0..=summary.steps).collect::<Vec<_>>());
    assert_eq!(summary.evals.len(), 2, "before and after");
    assert_eq!(summary.evals[1].step, summary.steps);
    // the testkit generator does not measure its busy time; the trainer's is always known
    assert_eq!(summary.gen_busy, None);
    assert!(summary.train_busy > 0.0 && summary.train_busy <= 1.0);
    assert!(summary.trained_tokens_per_s > 0.0);
}

/// An algorithm that needs what the policy cannot give is a build error naming both.
#[test]
fn a_critic_needs_a_policy_with_a_value_head() {
    let critic = config(&["algorithm.kind=ppo-critic"]);
    let Err(EngineError::Build { errors }) = Plugins::build(&critic) else {
        panic!("expected a build error");
    };
    let all: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(
        all[0].contains("`algorithm.kind`")
            && all[0].contains("ppo-critic needs a critic")
            && all[0].contains("testkit-bigram"),
        "{all:?}"
    );
    // the bigram policy can be copied, so a KL penalty to a reference policy works
    assert!(Plugins::build(&config(&["algorithm.kind=grpo"])).is_ok());
}
