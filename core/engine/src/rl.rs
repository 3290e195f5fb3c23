//! The RL stage: batches from the controller, steps on the compute worker, new weights back
//! to the generators, evaluations on the way.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use areal_sdk::{Generator, GeneratorStats, PolicyVersion, TrajectoryGroup, Verdict};

use crate::context::RunContext;
use crate::error::EngineError;
use crate::metrics::{StepMetrics, percentile, staleness};
use crate::trainer::StepReport;

/// What the RL stage did.
pub(crate) struct RlOutcome {
    /// Every step's metrics.
    pub(crate) steps: Vec<StepMetrics>,
    /// The RL clock (stopped early or not).
    pub(crate) clock: RlClock,
    /// The last policy version.
    pub(crate) version: PolicyVersion,
    /// The id of every sample trained on.
    pub(crate) trained: HashSet<u64>,
}

/// Train `train.steps` steps (fewer when `train.max_seconds` passes or a stop is asked).
/// With `start` false (asked to stop before RL), nothing is admitted or trained.
pub(crate) async fn train(ctx: &mut RunContext, start: bool) -> Result<RlOutcome, EngineError> {
    let t = ctx.config.train.clone();
    let runner = ctx.controller.runner().clone();
    if start {
        ctx.worker.start_rl().await?;
    }
    // RL starts now: generation may run ahead from here.
    let mut clock = RlClock::start(runner.generator().as_ref());
    if start {
        ctx.log.rl_started(ctx.wall_s());
        ctx.observer.on_weights(&ctx.worker.weights(0).await?);
        ctx.controller.start();
    }
    let counters = &runner.counters;
    let mut version: PolicyVersion = 0;
    let mut steps = Vec::new();
    let mut trained_ids = HashSet::new();
    let mut generated = (
        Instant::now(),
        counters.generated_tokens.load(Ordering::Relaxed),
    );
    for step in 1..=t.steps {
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

        let sync = Instant::now();
        ctx.controller.publish(trained.weights.clone()).await?;
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
        steps.push(metrics);
        if t.max_seconds > 0.0 && step < t.steps && clock.seconds() >= t.max_seconds {
            tracing::info!(target: "areal::train", step, seconds = clock.seconds(), "train.max_seconds reached; stopping");
            clock.stopped_early = true;
            break;
        }
        let every = ctx.config.eval.every;
        if ctx.config.eval.enabled && every > 0 && step % every == 0 && step != t.steps {
            ctx.eval(step, version).await?;
        }
    }
    Ok(RlOutcome {
        steps,
        clock,
        version,
        trained: trained_ids,
    })
}

/// Record the sample ids of `groups`, refusing one already trained on: a sample re-issued
/// after a server failed, or resubmitted after an interruption, must come back once.
fn check_once(trained: &mut HashSet<u64>, groups: &[TrajectoryGroup]) -> Result<(), EngineError> {
    for sample in groups.iter().flat_map(|g| &g.samples) {
        if !trained.insert(sample.sample_id) {
            return Err(EngineError::internal(format!(
                "sample {} came back to be trained a second time",
                sample.sample_id
            )));
        }
    }
    Ok(())
}

/// Wall time and generator counters since RL started, and since the previous step.
pub(crate) struct RlClock {
    /// Stopped by `train.max_seconds`.
    pub(crate) stopped_early: bool,
    started: Instant,
    at_start: GeneratorStats,
    last: (Instant, GeneratorStats),
}

impl RlClock {
    pub(crate) fn start(generator: &dyn Generator) -> Self {
        let (now, stats) = (Instant::now(), generator.stats());
        Self {
            stopped_early: false,
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

    /// Seconds from the start of RL to the end of the last step.
    pub(crate) fn seconds(&self) -> f64 {
        (self.last.0 - self.started).as_secs_f64()
    }

    /// Busy fraction and mean resume time over the whole of RL.
    pub(crate) fn totals(&self) -> (Option<f64>, Option<f64>) {
        busy_and_resume(&(self.started, self.at_start), &self.last)
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
    let lengths: Vec<usize> = samples.iter().map(|s| s.completion.len()).collect();
    let latencies = counters.drain_latencies();
    let counts = ctx.controller.counts();
    StepMetrics {
        policy_version: version + 1,
        wall_s: ctx.wall_s(),
        reward_mean: samples.iter().map(|s| s.reward.value).sum::<f64>() / n,
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
        buffer_size: ctx.controller.buffered(),
        running: counts.running,
        accepted_total: counts.accepted,
        rejected_total: counts.rejected,
        reward_failures: counters.reward_failures.swap(0, Ordering::Relaxed),
        interrupted_samples: counters.interruptions.swap(0, Ordering::Relaxed),
        loss: report.loss,
        grad_norm: report.grad_norm,
        microbatches: report.microbatches,
        on_policy_logprob_gap: report.on_policy_logprob_gap,
        algorithm: report.stats,
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
        let mut trained = HashSet::new();
        check_once(&mut trained, &[group(0, &[0, 1]), group(1, &[4, 5])]).unwrap();
        check_once(&mut trained, &[group(2, &[8, 9])]).unwrap();
        assert_eq!(trained.len(), 6);
        let e = check_once(&mut trained, &[group(3, &[12]), group(1, &[5])]).unwrap_err();
        assert!(e.to_string().contains("sample 5 came back"), "{e}");
    }
}
