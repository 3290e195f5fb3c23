//! One run of the bench: trained through the same path as `areal train`, its weights kept at
//! fixed step intervals and evaluated afterwards on all cores.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use areal_core::eval::{EvalSpec, Evaluator};
use areal_core::{ConfigLoader, Observer, RunOptions, RunSummary};
use areal_sdk::{Split, WeightUpdate};

use super::results::{CurvePoint, RunKey, RunRecord};
use super::{AsyncVsSyncArgs, algorithm_sets};

/// Keeps the weights RL starts from and every `every`-th step's, with the RL time each was
/// ready at.
pub(super) struct Snapshots {
    pub(super) every: u64,
    pub(super) started: Mutex<Option<Instant>>,
    pub(super) taken: Mutex<Vec<(u64, f64, WeightUpdate)>>,
    pub(super) last: Mutex<Option<(u64, f64, WeightUpdate)>>,
}

impl Snapshots {
    pub(super) fn new(every: u64) -> Self {
        Self {
            every,
            started: Mutex::new(None),
            taken: Mutex::new(Vec::new()),
            last: Mutex::new(None),
        }
    }

    /// Take every kept snapshot, the last weights included, in step order. (The run may
    /// still hold the observer for a moment while its tasks wind down.)
    pub(super) fn take(&self) -> Vec<(u64, f64, WeightUpdate)> {
        let mut taken = std::mem::take(&mut *self.taken.lock().expect("snapshot lock"));
        if let Some(last) = self.last.lock().expect("snapshot lock").take()
            && taken.last().is_none_or(|t| t.0 != last.0)
        {
            taken.push(last);
        }
        taken
    }
}

impl Observer for Snapshots {
    fn on_weights(&self, update: &WeightUpdate) {
        let now = Instant::now();
        let started = *self
            .started
            .lock()
            .expect("snapshot lock")
            .get_or_insert(now);
        let step = update.version;
        let point = (step, (now - started).as_secs_f64(), update.clone());
        if step.is_multiple_of(self.every) {
            self.taken
                .lock()
                .expect("snapshot lock")
                .push(point.clone());
        }
        *self.last.lock().expect("snapshot lock") = Some(point);
    }
}

pub(super) fn one_run(
    args: &AsyncVsSyncArgs,
    key: &RunKey,
    (gen_threads, train_threads): (usize, usize),
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<RunRecord> {
    let minibatches = if key.minibatches == 1 {
        String::new()
    } else {
        format!("-mb{}", key.minibatches)
    };
    let name = format!(
        "{}-{}{minibatches}-eta{}-seed{}",
        key.workload.name(),
        key.algorithm,
        key.max_staleness,
        key.seed
    );
    let mut sets: Vec<String> = key
        .workload
        .overrides()
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    sets.extend([
        format!("seed={}", key.seed),
        format!("rollout.max_staleness={}", key.max_staleness),
        format!("train.minibatches={}", key.minibatches),
        format!("generator.threads={gen_threads}"),
        format!("train.threads={train_threads}"),
        format!("train.max_seconds={}", args.budget_s),
        "eval.enabled=false".into(),
    ]);
    sets.extend(algorithm_sets(&key.algorithm));
    sets.extend(args.set.iter().cloned());
    let (config, plugins) = areal_core::resolve(&ConfigLoader::new().set_all(&sets)?)?;
    let snapshots = Arc::new(Snapshots::new(args.eval_every));
    let summary: RunSummary = runtime.block_on(areal_core::run(
        config,
        plugins,
        RunOptions {
            out_dir: Some(args.out.join("runs").join(&name)),
            observer: snapshots.clone(),
            started: Instant::now(),
            // a run the bench did not finish (not in results.json) is done again
            overwrite: true,
            ..RunOptions::default()
        },
    ))?;
    // evaluation after the run, on all cores: it costs the run nothing
    let (eval_config, eval_plugins) = areal_core::resolve(
        &ConfigLoader::new()
            .set_all(&sets)?
            .set("generator.threads=0")?,
    )?;
    let spec = EvalSpec::greedy(&eval_config, Split::Eval, 0);
    let evaluator = Evaluator::new(&eval_config, eval_plugins)?;
    let mut curve = Vec::new();
    for (step, wall_s, weights) in snapshots.take() {
        let outcome = runtime.block_on(evaluator.evaluate(weights, &spec))?;
        curve.push(CurvePoint {
            step,
            wall_s,
            accuracy: outcome.accuracy,
        });
    }
    Ok(RunRecord {
        key: key.clone(),
        time_to_target_s: None,
        reached: None,
        final_accuracy: curve.last().map_or(0.0, |p| p.accuracy),
        gen_busy: summary.gen_busy,
        train_busy: summary.train_busy,
        tokens_per_s: summary.trained_tokens_per_s,
        steps: summary.steps,
        wall_s: summary.rl_seconds,
        stopped_early: summary.stopped_early,
        gen_threads,
        train_threads,
        token_lag_mean: summary.token_lag_mean,
        token_lag_max: summary.token_lag_max,
        weight_sync_ms: summary.weight_sync_ms_mean,
        resume_ms: summary.resume_ms_mean,
        staleness_abs_mean: summary.staleness_abs_mean,
        curve,
    })
}
