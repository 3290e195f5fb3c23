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
    /// Samples admitted (every group started); each is trained, dropped or pending:
    /// `samples_admitted = samples_trained + samples_dropped + samples_pending`.
    pub samples_admitted: u64,
    /// Samples dropped: in groups that failed or were filtered, or whose reward was lost, or
    /// left out for `rollout.max_lag`.
    pub samples_dropped: u64,
    /// Of which left out for `rollout.max_lag` (in this process: not kept across a resume).
    #[serde(default)]
    pub samples_past_max_lag: u64,
    /// Samples that trained no token for their lag (`rollout.max_lag_policy = "withhold"`).
    #[serde(default)]
    pub samples_withheld: u64,
    /// Samples generated or generating but not trained when the run ended (generation runs
    /// ahead of training).
    pub samples_pending: u64,
    /// Mismatch over the run: mean |log π_trainer − log π_generator| over the tokens sampled
    /// by the trainer's version of their step (every step's first mini-batch at least).
    #[serde(default)]
    pub mismatch_abs_mean: Option<f64>,
    /// The largest such difference.
    #[serde(default)]
    pub mismatch_abs_max: Option<f64>,
    /// Mean k3 estimate of KL(π_generator ‖ π_trainer) over those tokens.
    #[serde(default)]
    pub mismatch_kl_k3: Option<f64>,
    /// Staleness over the run: mean |log π_prox − log π_behav| over the tokens trained with a
    /// lag of 1 or more.
    #[serde(default)]
    pub staleness_abs_mean: Option<f64>,
    /// Mean k3 estimate of KL(π_behav ‖ π_prox) over those tokens.
    #[serde(default)]
    pub staleness_kl_k3: Option<f64>,
    /// How many times the run was resumed (`areal train --resume`).
    pub resumes: u64,
    /// Resume checkpoints written (`checkpoint.every`).
    pub checkpoints_written: u64,
    /// Mean milliseconds to write one.
    pub checkpoint_ms_mean: f64,
    /// Largest milliseconds to write one.
    pub checkpoint_ms_max: f64,
    /// Bytes of the largest one.
    pub checkpoint_bytes: u64,
}

/// The summary of a run whose RL stage did `outcome`.
pub(crate) fn summarise(
    ctx: &RunContext,
    outcome: &RlOutcome,
    warmup: Option<WarmupReport>,
) -> RunSummary {
    let (config, t, rl) = (&ctx.config, &outcome.totals, &outcome.clock);
    let evals = ctx.evals.clone();
    let counts = ctx.controller.counts();
    let ledger = ctx.controller.ledger();
    let rl_seconds = rl.seconds();
    let (gen_busy, resume_ms_mean) = rl.totals();
    let runner = ctx.controller.runner();
    let faults = runner.generator().stats().faults + runner.rewards().verifier().faults();
    let c = &ctx.checkpoints;
    RunSummary {
        baseline_accuracy: evals.first().map(|e| e.accuracy),
        final_accuracy: evals.last().map(|e| e.accuracy),
        wall_seconds: ctx.wall_s(),
        steps: t.steps,
        stopped_early: rl.stopped_early,
        interrupted: false,
        checkpoint: None,
        policy_version: t.policy_version,
        max_staleness: config.rollout.max_staleness,
        algorithm: ctx.algorithm.clone(),
        seed: config.seed,
        reward_mean_first: t.reward_mean_first,
        reward_mean_last: t.reward_mean_last,
        token_lag_max: t.token_lag_max,
        token_lag_mean: if t.trained_tokens > 0 {
            t.token_lag_sum / t.trained_tokens as f64
        } else {
            0.0
        },
        groups_accepted: counts.accepted,
        groups_rejected: counts.rejected,
        reward_failures: t.reward_failures,
        warmup_seconds: warmup.as_ref().map_or(0.0, |w| w.seconds),
        warmup,
        evals,
        rl_seconds,
        trained_tokens_per_s: t.trained_tokens as f64 / rl_seconds.max(1e-9),
        train_busy: (t.train_ms / 1e3 / rl_seconds.max(1e-9)).min(1.0),
        gen_busy,
        weight_sync_ms_mean: t.weight_sync_ms / t.steps.max(1) as f64,
        resume_ms_mean,
        samples_trained: outcome.trained.len(),
        reissued_samples: t.reissued_samples + faults.reissued_samples,
        endpoint_failures: t.endpoint_failures + faults.endpoint_failures,
        samples_admitted: ledger.admitted,
        samples_dropped: ledger.dropped,
        samples_past_max_lag: ledger.lag_dropped,
        samples_withheld: t.samples_withheld,
        samples_pending: ledger.pending,
        mismatch_abs_mean: t.mismatch.means().map(|m| m.0),
        mismatch_abs_max: t.mismatch.means().map(|_| t.mismatch.abs_max),
        mismatch_kl_k3: t.mismatch.means().map(|m| m.1),
        staleness_abs_mean: t.staleness.means().map(|m| m.0),
        staleness_kl_k3: t.staleness.means().map(|m| m.1),
        resumes: ctx.resumes,
        checkpoints_written: c.written,
        checkpoint_ms_mean: c.ms_sum / c.written.max(1) as f64,
        checkpoint_ms_max: c.ms_max,
        checkpoint_bytes: c.bytes,
    }
}
