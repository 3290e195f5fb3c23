//! The RL stage: batches from the controller, steps on the compute worker, new weights back
//! to the generators, evaluations and resume checkpoints on the way.

use std::sync::atomic::Ordering;
use std::time::Instant;

use areal_sdk::{Generator, GeneratorStats, PolicyVersion, TrajectoryGroup, Verdict};

use crate::context::RunContext;
use crate::error::EngineError;
use crate::ids::IdRanges;
use crate::metrics::{ClockTotals, RlTotals, StepMetrics, WarmupReport, percentile, staleness};
use crate::resume::{RlProgress, Stage};
use crate::trainer::StepReport;

/// What the RL stage did.
pub(crate) struct RlOutcome {
    /// The totals of every step (those before a resume included; its clock and faults are
    /// the earlier processes', [`RlOutcome::clock`] and the plugins' counters add this one's).
    pub(crate) totals: RlTotals,
    /// The RL clock (stopped early or not).
    pub(crate) clock: RlClock,
    /// The last policy version.
    pub(crate) version: PolicyVersion,
    /// The id of every sample trained on.
    pub(crate) trained: IdRanges,
}

/// Train up to `train.steps` steps (fewer when `train.max_seconds` passes or a stop is asked),
/// from `from` (a checkpoint's progress; the worker and the controller were restored to it)
/// or from the start. With `start` false (asked to stop before RL), nothing is admitted or
/// trained. `warmup` is the warm-up's report, for the checkpoints.
pub(crate) async fn train(
    ctx: &mut RunContext,
    start: bool,
    from: Option<RlProgress>,
    warmup: Option<&WarmupReport>,
) -> Result<RlOutcome, EngineError> {
    let t = ctx.config.train.clone();
    let every = ctx.config.checkpoint.every;
    let runner = ctx.controller.runner().clone();
    let resumed = from.is_some();
    let (first_step, mut version, mut totals, mut trained_ids) = match from {
        Some(p) => (p.step, p.version, p.totals, p.trained),
        None => (0, 0, RlTotals::default(), IdRanges::new()),
    };
    if start && !resumed {
        ctx.worker.start_rl().await?;
    }
    // RL starts now: generation may run ahead from here.
    let mut clock = RlClock::start(runner.generator().as_ref(), totals.clock.clone());
    if start {
        if !resumed {
            ctx.log.rl_started(ctx.wall_s());
        }
        ctx.observer.on_weights(&ctx.worker.weights(version).await?);
        if !resumed {
            let rollout = ctx.controller.snapshot();
            let progress = progress(first_step, version, warmup, &totals, &trained_ids, rollout);
            crate::resume::save(ctx, progress, None).await?;
        }
        ctx.controller.start();
    }
    let counters = &runner.counters;
    let mut generated = (
        Instant::now(),
        counters.generated_tokens.load(Ordering::Relaxed),
    );
    for step in first_step + 1..=t.steps {
        if !start || ctx.interrupt.is_requested() {
            break;
        }
        let wait = Instant::now();
        // A stop asked while waiting for the batch drops this step.
        let Some(groups) = ctx.controller.next_batch(&ctx.interrupt).await? else {
            break;
        };
        let wait_ms = wait.elapsed().as_secs_f64() * 1e3;
        check_once(&mut trained_ids, &groups)?;

        let trained = ctx.worker.train(groups, version).await?;
        ctx.observer.on_trained(&trained.groups, version);

        let due = every > 0 && (step % every == 0 || step == t.steps);
        let sync = Instant::now();
        let rollout = ctx.controller.publish(trained.weights.clone(), due).await?;
        let weight_sync_ms = sync.elapsed().as_secs_f64() * 1e3;
        ctx.observer.on_weights(&trained.weights);
        let (gen_busy, resume_ms) = clock.step(runner.generator().as_ref());

        let now = (
            Instant::now(),
            counters.generated_tokens.load(Ordering::Relaxed),
        );
        let gen_tokens_per_s =
            (now.1 - generated.1) as f64 / (now.0 - generated.0).as_secs_f64().max(1e-9);
        generated = now;
        let train_ms = trained.train_ms;
        let mut metrics = step_metrics(ctx, &trained.groups, version, trained.report);
        version += 1;
        metrics.step = step;
        metrics.gen_tokens_per_s = gen_tokens_per_s;
        metrics.train_tokens_per_s = metrics.packed_tokens as f64 / (train_ms / 1e3).max(1e-9);
        (metrics.wait_ms, metrics.train_ms, metrics.weight_sync_ms) =
            (wait_ms, train_ms, weight_sync_ms);
        (metrics.gen_busy, metrics.resume_ms) = (gen_busy, resume_ms);
        tracing::info!(
            target: "areal::train",
            step,
            policy_version = version,
            reward_mean = metrics.reward_mean,
            token_lag_max = metrics.staleness.token_lag_max,
            loss = metrics.loss,
            "step"
        );
        ctx.log.record("step", &metrics)?;
        ctx.observer.on_step(&metrics);
        totals.add(&metrics);
        let out_of_time = t.max_seconds > 0.0 && step < t.steps && clock.seconds() >= t.max_seconds;
        let every_eval = ctx.config.eval.every;
        if !out_of_time
            && ctx.config.eval.enabled
            && every_eval > 0
            && step % every_eval == 0
            && step != t.steps
        {
            ctx.eval(step, version).await?;
        }
        if let Some(rollout) = rollout {
            let so_far = so_far(ctx, &totals, &clock);
            let progress = progress(step, version, warmup, &so_far, &trained_ids, rollout);
            crate::resume::save(ctx, progress, None).await?;
        }
        if out_of_time {
            tracing::info!(target: "areal::train", step, seconds = clock.seconds(), "train.max_seconds reached; stopping");
            clock.stopped_early = true;
            break;
        }
    }
    // Stopped by a signal: the state as it is now, partial samples included, so that a resume
    // goes on from here.
    if start && ctx.interrupt.is_requested() {
        let rollout = ctx.controller.final_snapshot().await?;
        let so_far = so_far(ctx, &totals, &clock);
        let progress = progress(
            totals.steps,
            version,
            warmup,
            &so_far,
            &trained_ids,
            rollout,
        );
        crate::resume::save(ctx, progress, None).await?;
    }
    Ok(RlOutcome {
        totals,
        clock,
        version,
        trained: trained_ids,
    })
}

/// `totals` (whose clock and faults are those of the run's earlier processes) with this
/// process's added, as a checkpoint keeps them.
fn so_far(ctx: &RunContext, totals: &RlTotals, clock: &RlClock) -> RlTotals {
    let runner = ctx.controller.runner();
    let faults = runner.generator().stats().faults + runner.rewards().verifier().faults();
    RlTotals {
        clock: clock.totals_so_far(),
        reissued_samples: totals.reissued_samples + faults.reissued_samples,
        endpoint_failures: totals.endpoint_failures + faults.endpoint_failures,
        ..totals.clone()
    }
}

/// A checkpoint's stage after `step` steps.
fn progress(
    step: u64,
    version: PolicyVersion,
    warmup: Option<&WarmupReport>,
    totals: &RlTotals,
    trained: &IdRanges,
    rollout: crate::rollout::RolloutSnapshot,
) -> Stage {
    Stage::Rl(Box::new(RlProgress {
        step,
        version,
        warmup: warmup.cloned(),
        totals: totals.clone(),
        trained: trained.clone(),
        rollout,
    }))
}

/// Record the sample ids of `groups`, refusing one already trained on: a sample re-issued
/// after a server failed, resubmitted after an interruption, or restored by a resume, must
/// come back once. (The samples an episode split into share its id, in its group.)
fn check_once(trained: &mut IdRanges, groups: &[TrajectoryGroup]) -> Result<(), EngineError> {
    for group in groups {
        let ids: std::collections::BTreeSet<u64> =
            group.samples.iter().map(|s| s.sample_id).collect();
        for id in ids {
            if !trained.insert(id) {
                return Err(EngineError::internal(format!(
                    "sample {id} came back to be trained a second time"
                )));
            }
        }
    }
    Ok(())
}

/// Wall time and generator counters since RL started, and since the previous step.
pub(crate) struct RlClock {
    /// Stopped by `train.max_seconds`.
    pub(crate) stopped_early: bool,
    /// The run's earlier processes.
    before: ClockTotals,
    started: Instant,
    at_start: GeneratorStats,
    last: (Instant, GeneratorStats),
}

impl RlClock {
    pub(crate) fn start(generator: &dyn Generator, before: ClockTotals) -> Self {
        let (now, stats) = (Instant::now(), generator.stats());
        Self {
            stopped_early: false,
            before,
            started: now,
            at_start: stats,
            last: (now, stats),
        }
    }

    /// A step ended: the generator's busy fraction and mean resume time since the previous.
    pub(crate) fn step(&mut self, generator: &dyn Generator) -> (Option<f64>, Option<f64>) {
        let now = (Instant::now(), generator.stats());
        let since = busy_and_resume(&self.last, &now);
        self.last = now;
        since
    }

    /// Seconds of RL up to the end of the last step, earlier processes included.
    pub(crate) fn seconds(&self) -> f64 {
        self.before.seconds + (self.last.0 - self.started).as_secs_f64()
    }

    /// Everything so far, earlier processes included.
    pub(crate) fn totals_so_far(&self) -> ClockTotals {
        let (from, to) = (&self.at_start, &self.last.1);
        let busy = to.busy_seconds.zip(from.busy_seconds).map(|(b, a)| b - a);
        ClockTotals {
            seconds: self.seconds(),
            busy_seconds: match (self.before.busy_seconds, busy) {
                (Some(a), Some(b)) => Some(a + b),
                (None, b) if self.before.seconds == 0.0 => b,
                _ => None,
            },
            resumes: self.before.resumes + to.resumes.saturating_sub(from.resumes),
            resume_seconds: self.before.resume_seconds + (to.resume_seconds - from.resume_seconds),
        }
    }

    /// Busy fraction and mean resume time over the whole of RL.
    pub(crate) fn totals(&self) -> (Option<f64>, Option<f64>) {
        let t = self.totals_so_far();
        let busy = t
            .busy_seconds
            .map(|b| (b / t.seconds.max(1e-9)).clamp(0.0, 1.0));
        let resume = (t.resumes > 0).then(|| t.resume_seconds * 1e3 / t.resumes as f64);
        (busy, resume)
    }
}

/// The generator's busy fraction and mean resume milliseconds between two readings.
fn busy_and_resume(
    from: &(Instant, GeneratorStats),
    to: &(Instant, GeneratorStats),
) -> (Option<f64>, Option<f64>) {
    let wall = (to.0 - from.0).as_secs_f64().max(1e-9);
    let busy =
        to.1.busy_seconds
            .zip(from.1.busy_seconds)
            .map(|(b, a)| ((b - a) / wall).clamp(0.0, 1.0));
    let resumes = to.1.resumes.saturating_sub(from.1.resumes);
    let resume =
        (resumes > 0).then(|| (to.1.resume_seconds - from.1.resume_seconds) * 1e3 / resumes as f64);
    (busy, resume)
}

/// The metrics of a step that trained `groups` on version `version`; the caller fills in
/// the step number, rates and timings.
pub(crate) fn step_metrics(
    ctx: &RunContext,
    groups: &[TrajectoryGroup],
    version: PolicyVersion,
    report: StepReport,
) -> StepMetrics {
    let counters = &ctx.controller.runner().counters;
    let samples: Vec<_> = groups.iter().flat_map(|g| &g.samples).collect();
    let n = samples.len().max(1) as f64;
    // the policy's tokens: an episode's environment tokens are read, not trained on
    let lengths: Vec<usize> = samples.iter().map(|s| s.completion.sampled_len()).collect();
    let latencies = counters.drain_latencies();
    let counts = ctx.controller.counts();
    let episodes = counters.episodes.swap(0, Ordering::Relaxed);
    let per_episode = |count: u64| count as f64 / episodes.max(1) as f64;
    StepMetrics {
        policy_version: version + 1,
        wall_s: ctx.wall_s(),
        reward_mean: samples.iter().map(|s| s.reward.total()).sum::<f64>() / n,
        accepted_fraction: samples
            .iter()
            .filter(|s| s.reward.verdict == Verdict::Accepted)
            .count() as f64
            / n,
        groups: groups.len(),
        samples: samples.len(),
        trained_tokens: lengths.iter().sum(),
        packed_tokens: report.packed_tokens,
        response_len_mean: lengths.iter().sum::<usize>() as f64 / n,
        response_len_max: lengths.iter().copied().max().unwrap_or(0),
        staleness: staleness(groups, version),
        reward_latency_p50_ms: percentile(&latencies, 50.0),
        reward_latency_p99_ms: percentile(&latencies, 99.0),
        reward_cache_hit_rate: {
            let asked = counters.rewards.swap(0, Ordering::Relaxed);
            let hits = counters.reward_cache_hits.swap(0, Ordering::Relaxed);
            if asked == 0 {
                0.0
            } else {
                hits as f64 / asked as f64
            }
        },
        buffer_size: ctx.controller.buffered(),
        running: counts.running,
        accepted_total: counts.accepted,
        rejected_total: counts.rejected,
        reward_failures: counters.reward_failures.swap(0, Ordering::Relaxed),
        interrupted_samples: counters.interruptions.swap(0, Ordering::Relaxed),
        episodes,
        turns_per_episode: per_episode(counters.turns.swap(0, Ordering::Relaxed)),
        tool_call_fraction: per_episode(counters.episodes_calling_tools.swap(0, Ordering::Relaxed)),
        tool_calls: counters.tool_calls.swap(0, Ordering::Relaxed),
        tool_errors: counters.tool_errors.swap(0, Ordering::Relaxed),
        retokenization_checked: counters.retokenization_checked.swap(0, Ordering::Relaxed),
        retokenization_mismatches: counters
            .retokenization_mismatches
            .swap(0, Ordering::Relaxed),
        retokenization_drift: counters.retokenization_drift.swap(0, Ordering::Relaxed),
        episode_splits: counters.episode_splits.swap(0, Ordering::Relaxed),
        loss: report.loss,
        grad_norm: report.grad_norm,
        microbatches: report.microbatches,
        on_policy_logprob_gap: report.on_policy_logprob_gap,
        off_policy: report.off_policy,
        samples_withheld: report.withheld_samples,
        algorithm: report.stats,
        sample_ids: samples
            .iter()
            .map(|s| s.sample_id)
            .collect::<IdRanges>()
            .ranges(),
        ..StepMetrics::default()
    }
}

#[cfg(test)]
mod tests {
    use areal_sdk::{Completion, FinishReason, Reward, Trajectory, Verdict};

    use super::*;

    fn group(group_id: u64, sample_ids: &[u64]) -> TrajectoryGroup {
        TrajectoryGroup {
            group_id,
            item_id: "x".into(),
            prompt_ids: vec![1],
            admitted_at: 0,
            samples: sample_ids
                .iter()
                .map(|&sample_id| Trajectory {
                    sample_id,
                    completion: Completion::empty(FinishReason::Stop),
                    reward: Reward::new(0.0, Verdict::WrongAnswer),
                })
                .collect(),
        }
    }

    #[test]
    fn a_sample_id_trained_twice_stops_the_run_naming_it() {
        let mut trained = IdRanges::new();
        check_once(&mut trained, &[group(0, &[0, 1]), group(1, &[4, 5])]).unwrap();
        check_once(&mut trained, &[group(2, &[8, 9])]).unwrap();
        assert_eq!(trained.len(), 6);
        let e = check_once(&mut trained, &[group(3, &[12]), group(1, &[5])]).unwrap_err();
        assert!(e.to_string().contains("sample 5 came back"), "{e}");
    }
}
