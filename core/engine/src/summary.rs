//! What a run reports at its end: `summary.json`.

use std::path::PathBuf;

use areal_sdk::PolicyVersion;
use serde::Serialize;

use crate::context::RunContext;
use crate::metrics::{EvalMetrics, WarmupReport};
use crate::rl::RlOutcome;

/// The outcome of a run; written to `summary.json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSummary {
    /// Held-out accuracy before training (if evaluated).
    pub baseline_accuracy: Option<f64>,
    /// Held-out accuracy after training (if evaluated).
    pub final_accuracy: Option<f64>,
    /// Seconds from the start of the run to the end.
    pub wall_seconds: f64,
    /// Training steps done.
    pub steps: u64,
    /// The run stopped before `train.steps` because `train.max_seconds` had passed.
    pub stopped_early: bool,
    /// The run was asked to stop (a signal) before it was done: what it had done is saved.
    pub interrupted: bool,
    /// The saved checkpoint, relative to the run folder (`checkpoint`); `None` when there is
    /// no run folder, the policy cannot save, or saving failed (the run then fails too).
    pub checkpoint: Option<PathBuf>,
    /// Final policy version.
    pub policy_version: PolicyVersion,
    /// η.
    pub max_staleness: u64,
    /// Algorithm name.
    pub algorithm: String,
    /// Run seed.
    pub seed: u64,
    /// Mean reward of the first step's batch.
    pub reward_mean_first: f64,
    /// Mean reward of the last step's batch.
    pub reward_mean_last: f64,
    /// Largest per-token version lag trained on.
    pub token_lag_max: u64,
    /// Mean per-token version lag over all trained tokens.
    pub token_lag_mean: f64,
    /// Groups accepted.
    pub groups_accepted: u64,
    /// Groups rejected (failed or filtered).
    pub groups_rejected: u64,
    /// Samples lost to verifier failures.
    pub reward_failures: u64,
    /// Seconds the supervised warm-up took (when it ran; a reused one reports its original
    /// time), 0 without warm-up.
    pub warmup_seconds: f64,
    /// The warm-up, if there was one.
    pub warmup: Option<WarmupReport>,
    /// Every evaluation.
    pub evals: Vec<EvalMetrics>,
    /// Seconds from the start of RL (after warm-up and the baseline evaluation) to the end of
    /// the last step; evaluations in between included.
    pub rl_seconds: f64,
    /// Generated tokens trained on per second of `rl_seconds`.
    pub trained_tokens_per_s: f64,
    /// Fraction of `rl_seconds` the trainer spent computing steps.
    pub train_busy: f64,
    /// Fraction of `rl_seconds` the generator spent computing (`None` when it does not
    /// measure it).
    pub gen_busy: Option<f64>,
    /// Mean milliseconds of the weight-update protocol (new weights ready to generators
    /// resumed).
    pub weight_sync_ms_mean: f64,
    /// Mean milliseconds from an interruption to decoding running again, over the updates
    /// that interrupted something (`None` when none did or not measured).
    pub resume_ms_mean: Option<f64>,
    /// Samples trained on, each once (the run stops if a sample id comes back).
    pub samples_trained: u64,
    /// Samples whose server failed while it had them, sent again to another (remote
    /// generators and rewards; 0 in process).
    pub reissued_samples: u64,
    /// Servers found dead, unreachable or out of time while taking work.
    pub endpoint_failures: u64,
}

/// The summary of a run whose RL stage did `outcome`.
pub(crate) fn summarise(
    ctx: &RunContext,
    outcome: &RlOutcome,
    warmup: Option<WarmupReport>,
) -> RunSummary {
    let (config, steps, rl) = (&ctx.config, &outcome.steps, &outcome.clock);
    let evals = ctx.evals.clone();
    let counts = ctx.controller.counts();
    let tokens: usize = steps.iter().map(|m| m.trained_tokens).sum();
    let lag_sum: f64 = steps
        .iter()
        .map(|m| m.staleness.token_lag_mean * m.trained_tokens as f64)
        .sum();
    let rl_seconds = rl.seconds();
    let train_ms: f64 = steps.iter().map(|m| m.train_ms).sum();
    let (gen_busy, resume_ms_mean) = rl.totals();
    let runner = ctx.controller.runner();
    let faults = runner.generator().stats().faults + runner.rewards().verifier().faults();
    RunSummary {
        baseline_accuracy: evals.first().map(|e| e.accuracy),
        final_accuracy: evals.last().map(|e| e.accuracy),
        wall_seconds: ctx.wall_s(),
        steps: steps.len() as u64,
        stopped_early: rl.stopped_early,
        interrupted: false,
        checkpoint: None,
        policy_version: steps.last().map_or(0, |m| m.policy_version),
        max_staleness: config.rollout.max_staleness,
        algorithm: ctx.algorithm.clone(),
        seed: config.seed,
        reward_mean_first: steps.first().map_or(0.0, |m| m.reward_mean),
        reward_mean_last: steps.last().map_or(0.0, |m| m.reward_mean),
        token_lag_max: steps
            .iter()
            .map(|m| m.staleness.token_lag_max)
            .max()
            .unwrap_or(0),
        token_lag_mean: if tokens > 0 {
            lag_sum / tokens as f64
        } else {
            0.0
        },
        groups_accepted: counts.accepted,
        groups_rejected: counts.rejected,
        reward_failures: steps.iter().map(|m| m.reward_failures).sum(),
        warmup_seconds: warmup.as_ref().map_or(0.0, |w| w.seconds),
        warmup,
        evals,
        rl_seconds,
        trained_tokens_per_s: tokens as f64 / rl_seconds.max(1e-9),
        train_busy: (train_ms / 1e3 / rl_seconds.max(1e-9)).min(1.0),
        gen_busy,
        weight_sync_ms_mean: steps.iter().map(|m| m.weight_sync_ms).sum::<f64>()
            / steps.len().max(1) as f64,
        resume_ms_mean,
        samples_trained: outcome.trained.len() as u64,
        reissued_samples: faults.reissued_samples,
        endpoint_failures: faults.endpoint_failures,
    }
}
