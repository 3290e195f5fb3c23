//! The `math` task and the `math` reward through the whole pipeline: problems read from a
//! JSONL file in MATH's format, a warm-up on boxed answers, RL rewarded by the maths
//! verifier, and evaluation on the held-out problems.

use std::io::Write;

use areal_core::{ConfigLoader, Plugins, RunOptions, run};
use areal_sdk::Split;

use super::within_limit;

/// Two-digit additions as MATH-style records (`id`, `problem`, `answer`).
fn write_problems(path: &std::path::Path) {
    let mut file = std::fs::File::create(path).unwrap();
    for a in 10..40 {
        for b in 1..10 {
            writeln!(
                file,
                r#"{{"id": "add-{a}-{b}", "problem": "{a}+{b}", "answer": "{}"}}"#,
                a + b
            )
            .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_math_task_trains_and_evaluates_with_the_math_reward() {
    let dir = tempfile::tempdir().unwrap();
    let problems = dir.path().join("additions.jsonl");
    write_problems(&problems);
    let config = ConfigLoader::new()
        .set_all([
            "task.kind=math",
            &format!("task.path={}", problems.display()),
            "task.template={problem}=",
            "reward.kind=math",
            "policy.alphabet=0123456789+=\\boxed{}",
            "policy.max_positions=32",
            "warmup.eval_every=20",
            "warmup.max_steps=200",
            "warmup.batch_size=16",
            &format!("warmup.cache_dir={}", dir.path().join("warmup").display()),
            "train.steps=4",
            "eval.every=2",
            "rollout.batch_size=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=16",
        ])
        .unwrap()
        .load()
        .unwrap();
    let plugins = Plugins::build(&config).unwrap();
    let held_out = plugins.task.len(Split::Eval).unwrap();
    assert!(held_out >= 5, "{held_out} eval problems");
    let options = RunOptions {
        out_dir: Some(dir.path().join("run")),
        ..RunOptions::default()
    };
    let summary = within_limit(run(config, plugins, options)).await.unwrap();

    assert_eq!(summary.steps, 4);
    assert_eq!(
        summary.reward_failures, 0,
        "the maths verifier never failed"
    );
    assert_eq!(summary.evals.len(), 3, "before, after step 2, after step 4");
    assert!(summary.evals.iter().all(|e| e.items == held_out));
    // The warm-up teaches the boxed format and some sums; the verifier must see the right ones
    // (0.15 of the 13 held-out problems on this machine, after 200 steps).
    let warmup = summary.warmup.expect("the math task has demonstrations");
    assert!(
        warmup.best_validation_accuracy > 0.0,
        "no validation problem solved after the warm-up: the verifier reads none of `\\boxed{{..}}`"
    );
    assert!(summary.final_accuracy.is_some());
}
