//! The built-in job's pipeline on tiny budgets: warm-up to a plateau (and its cache), RL on
//! the transformer through the burn generator, the run folder, and evaluating a checkpoint.

use areal_core::eval::{EvalSpec, evaluate_checkpoint};
use areal_core::{ConfigLoader, Plugins, RunOptions, run};
use areal_sdk::{SamplingParams, Split};

use super::within_limit;

fn tiny(cache: &std::path::Path) -> areal_core::Config {
    ConfigLoader::new()
        .set_all([
            "task.eval_items=24",
            "task.validation_items=16",
            "task.max_terms=4",
            "warmup.eval_every=10",
            "warmup.max_steps=30",
            "warmup.batch_size=8",
            &format!("warmup.cache_dir={}", cache.display()),
            "train.steps=3",
            "eval.every=2",
            "rollout.batch_size=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=30",
        ])
        .unwrap()
        .load()
        .unwrap()
}

/// Run `config` into the run folder `out`.
async fn run_into(config: &areal_core::Config, out: &std::path::Path) -> areal_core::RunSummary {
    let options = RunOptions {
        out_dir: Some(out.to_owned()),
        ..RunOptions::default()
    };
    within_limit(run(
        config.clone(),
        Plugins::build(config).unwrap(),
        options,
    ))
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_pipeline_runs_end_to_end_and_reuses_its_warm_up() {
    let cache = tempfile::tempdir().unwrap();
    let runs = tempfile::tempdir().unwrap();
    let config = tiny(cache.path());
    let first = runs.path().join("first");
    let summary = run_into(&config, &first).await;

    let warmup = summary.warmup.clone().expect("the default job warms up");
    assert!(!warmup.cached);
    assert!(warmup.steps > 0 && warmup.steps <= 30);
    assert_eq!(warmup.curve.len() as u64, warmup.steps.div_ceil(10));
    let best = warmup
        .curve
        .iter()
        .map(|m| m.validation_accuracy)
        .fold(f64::NEG_INFINITY, f64::max);
    let best_at = warmup
        .curve
        .iter()
        .find(|m| m.validation_accuracy == best)
        .unwrap()
        .step;
    assert_eq!(
        warmup.best_step, best_at,
        "the warm-up ends with its best validation weights"
    );
    assert_eq!(warmup.best_validation_accuracy, best);
    let (first_eval, last_eval) = (&warmup.curve[0], warmup.curve.last().unwrap());
    assert!(
        last_eval.validation_loss < 0.8 * first_eval.validation_loss,
        "supervised warm-up does not learn: validation loss {} → {}",
        first_eval.validation_loss,
        last_eval.validation_loss
    );
    assert!(summary.warmup_seconds > 0.0 && summary.warmup_seconds < summary.wall_seconds);
    assert_eq!(summary.steps, 3);
    assert_eq!(summary.evals.len(), 3, "before, after step 2, after step 3");
    assert!(summary.evals.iter().all(|e| e.items == 24));
    for file in [
        "config.toml",
        "metrics.jsonl",
        "summary.json",
        "accuracy.png",
        "checkpoint/config.json",
        "checkpoint/model.safetensors",
        "checkpoint/tokenizer.json",
    ] {
        assert!(
            first.join(file).exists(),
            "{file} missing from the run folder"
        );
    }
    let events: Vec<_> = std::fs::read_dir(&first)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        })
        .collect();
    assert_eq!(events.len(), 1);
    let records = areal_core::tensorboard::read_records(&events[0]).unwrap();
    let has = |tag: &str| {
        records
            .iter()
            .any(|r| r.windows(tag.len()).any(|w| w == tag.as_bytes()))
    };
    assert!(has("eval/accuracy") && has("step/reward_mean") && has("warmup/validation_accuracy"));

    // the final checkpoint evaluates to the run's final accuracy
    let spec = EvalSpec {
        split: Split::Eval,
        max_items: 0,
        samples: 1,
        sampling: SamplingParams::greedy(),
        max_new_tokens: config.rollout.max_new_tokens,
        concurrency: config.rollout.max_concurrent * config.rollout.group_size,
        batched: false,
    };
    let outcome = evaluate_checkpoint(
        &config,
        Plugins::build(&config).unwrap(),
        &first.join("checkpoint"),
        &spec,
    )
    .await
    .unwrap();
    assert_eq!(Some(outcome.accuracy), summary.final_accuracy);

    // the burn generator measures how busy it was
    let busy = summary
        .gen_busy
        .expect("the burn generator measures its busy time");
    assert!(busy > 0.0 && busy <= 1.0, "{busy}");

    // a second run with the same settings reuses the warm-up and starts where it ended, also
    // with each side on a thread pool of its own (not part of what the warm-up depends on)
    let second = runs.path().join("second");
    let mut own_threads = config.clone();
    own_threads.train.threads = 1;
    own_threads.generator = {
        let mut section = config.generator.clone();
        section["threads"] = 1.into();
        section
    };
    let again = run_into(&own_threads, &second).await;
    let reused = again.warmup.clone().unwrap();
    assert!(reused.cached);
    assert_eq!(
        reused.seconds, warmup.seconds,
        "a reused warm-up reports its original time"
    );
    assert_eq!(reused.curve, warmup.curve);
    assert_eq!(again.warmup_seconds, summary.warmup_seconds);
    assert_eq!(
        again.evals[0].accuracy, summary.evals[0].accuracy,
        "the same baseline"
    );
}

/// A cached warm-up cut short (a full disk, a kill) once failed every later run with those
/// settings; a cache folder that cannot be written once failed the run after its warm-up.
/// Now a damaged cache is warmed up again and replaced, and an unwritable one only costs
/// the next run its warm-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_unwritable_warm_up_cache_costs_only_time() {
    let cache = tempfile::tempdir().unwrap();
    let runs = tempfile::tempdir().unwrap();
    let mut config = tiny(cache.path());
    config.train.steps = 1;
    config.eval.enabled = false;
    let first = run_into(&config, &runs.path().join("first")).await;
    assert!(!first.warmup.unwrap().cached);
    let cached: Vec<std::path::PathBuf> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        cached.len(),
        1,
        "one cache folder, no partial one: {cached:?}"
    );
    let weights = cached[0].join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();

    let second = run_into(&config, &runs.path().join("second")).await;
    assert!(
        !second.warmup.unwrap().cached,
        "a truncated cache is not reused"
    );
    let third = run_into(&config, &runs.path().join("third")).await;
    assert!(
        third.warmup.unwrap().cached,
        "the second run replaced the damaged cache"
    );

    // a cache folder that cannot be created: the run goes on without a cache
    let blocker = cache.path().join("a-file");
    std::fs::write(&blocker, b"not a folder").unwrap();
    config.warmup.cache_dir = blocker.join("warmup").display().to_string();
    let unwritable = run_into(&config, &runs.path().join("unwritable")).await;
    assert_eq!(unwritable.steps, 1);
    assert!(!unwritable.warmup.unwrap().cached);
}

/// `[prompt] format = "chat"`: every prompt the run trains on is the task's text as the user's
/// message in the checkpoint's chat format (here a template over the task's own characters,
/// so that the character tokenizer can read it), with the system message first; warm-up,
/// RL and evaluation all run on such prompts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_prompts_are_rendered_with_the_checkpoints_template() {
    use areal_model::{TransformerOptions, TransformerPolicy};
    use areal_sdk_train::Policy;
    let defaults = areal_core::Config::default();
    let alphabet = defaults.policy["alphabet"].as_str().unwrap();
    let checkpoint = tempfile::tempdir().unwrap();
    let options = TransformerOptions {
        hidden_size: 32,
        layers: 1,
        max_positions: 128,
        ..TransformerOptions::default()
    };
    let device = areal_sdk_train::burn::tensor::Device::flex();
    let policy = TransformerPolicy::fresh(&options, alphabet, 4, &device).unwrap();
    policy.save(checkpoint.path()).unwrap();
    let template = "{% for m in messages %}{{ m.role[0] }}{{ m.content }},{% endfor %}\
                    {% if add_generation_prompt %}a{% endif %}";
    std::fs::write(
        checkpoint.path().join("tokenizer_config.json"),
        serde_json::json!({ "chat_template": template }).to_string(),
    )
    .unwrap();
    let config = ConfigLoader::new()
        .set_all([
            "policy={ kind = \"transformer\" }",
            &format!("policy.path={}", checkpoint.path().display()),
            "prompt.format=chat",
            "prompt.system=s",
            "task.eval_items=4",
            "task.validation_items=4",
            "task.max_terms=3",
            "warmup.eval_every=2",
            "warmup.max_steps=2",
            "warmup.batch_size=4",
            "warmup.cache_dir=",
            "train.steps=2",
            "rollout.batch_size=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=12",
        ])
        .unwrap()
        .load()
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let (summary, recorder) = super::run_recorded(config, Some(out.path())).await;
    let summary = summary.unwrap();
    assert_eq!(summary.steps, 2);
    let tokenizer = policy.tokenizer();
    let trained = recorder.trained.lock().unwrap();
    let groups: Vec<_> = trained.iter().flat_map(|(_, g)| g).collect();
    assert_eq!(groups.len(), 4);
    for group in groups {
        let text = tokenizer.decode(&group.prompt_ids).unwrap();
        let inner = text
            .strip_prefix("ss,u")
            .and_then(|t| t.strip_suffix(",a"))
            .unwrap_or_else(|| panic!("{text:?} is not in the chat format"));
        assert!(inner.contains('='), "{text:?}: the task's prompt is inside");
    }
}
