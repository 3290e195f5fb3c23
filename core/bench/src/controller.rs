//! `areal bench controller`: the engine alone (controller, group runner, reward service,
//! buffer, trainer loop) on the testkit's near-zero-cost plugins; rollouts per second.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use clap::Args;

use super::stats::median;

#[derive(Debug, Args)]
pub(crate) struct BenchControllerArgs {
    /// Rollouts allowed in flight at once (`rollout.max_concurrent`); η is set so that the
    /// staleness rule admits this many.
    #[arg(long, value_delimiter = ',', default_value = "10000")]
    in_flight: Vec<usize>,
    /// Groups per training step (`rollout.batch_size`); one sample per group.
    #[arg(long, default_value_t = 2500)]
    batch: usize,
    /// Training steps per run, at least 4 (the first two are not timed: they fill the
    /// pipeline).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(4..))]
    steps: u64,
    /// Runs per setting; the table shows the median.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

/// What the controller bench records of a run.
#[derive(Default)]
struct ControllerTrace {
    /// (wall seconds since the run started, rollouts accepted so far) after each step.
    steps: std::sync::Mutex<Vec<(f64, u64, f64)>>,
    /// Largest number of rollouts running at once.
    max_running: std::sync::atomic::AtomicU64,
    started: std::sync::OnceLock<Instant>,
}

impl areal_core::Observer for ControllerTrace {
    fn on_admission(&self, counts: &areal_core::AdmissionCounts) {
        self.max_running
            .fetch_max(counts.running, std::sync::atomic::Ordering::Relaxed);
    }

    fn on_step(&self, metrics: &areal_core::StepMetrics) {
        let t = self
            .started
            .get_or_init(Instant::now)
            .elapsed()
            .as_secs_f64();
        self.steps
            .lock()
            .expect("trace lock")
            .push((t, metrics.accepted_total, metrics.train_ms));
    }
}

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(super) fn run(args: BenchControllerArgs) -> anyhow::Result<()> {
    let runtime = areal_cli::internal::runtime()?;
    eprintln!(
        "testkit plugins (bigram model, successor task and reward), 1 sample of 1 token per \
         rollout, {} rollouts per step, {} steps, {} runs per setting, 2 runtime threads",
        args.batch, args.steps, args.rounds
    );
    println!(
        "| in flight (max_concurrent) | η | rollouts/s (median) | min – max | peak running | trainer share |"
    );
    println!("|---|---|---|---|---|---|");
    for &in_flight in &args.in_flight {
        let eta = in_flight.div_ceil(args.batch);
        let mut rates = Vec::new();
        let (mut peak, mut trainer_share) = (0u64, Vec::new());
        for _ in 0..args.rounds {
            let loader = areal_core::ConfigLoader::new()
                .toml(
                    areal_testkit::CONFIG,
                    std::path::Path::new("sdk/testkit/testkit.toml"),
                )?
                .set_all([
                    &format!("rollout.batch_size={}", args.batch),
                    "rollout.group_size=1",
                    "rollout.max_new_tokens=1",
                    &format!("rollout.max_concurrent={in_flight}"),
                    &format!("rollout.max_staleness={eta}"),
                    &format!("train.steps={}", args.steps),
                    "eval.enabled=false",
                ])?;
            let (config, plugins) = areal_core::resolve(&loader)?;
            let trace = Arc::new(ControllerTrace::default());
            let options = areal_core::RunOptions {
                observer: trace.clone(),
                ..areal_core::RunOptions::default()
            };
            runtime.block_on(areal_core::run(config, plugins, options))?;
            let steps = trace.steps.lock().expect("trace lock");
            let (t0, a0, _) = steps[1];
            let (t1, a1, _) = steps[steps.len() - 1];
            rates.push((a1 - a0) as f64 / (t1 - t0));
            let train_s: f64 = steps[2..].iter().map(|s| s.2).sum::<f64>() / 1e3;
            trainer_share.push(train_s / (t1 - t0));
            peak = peak.max(trace.max_running.load(Ordering::Relaxed));
        }
        rates.sort_by(f64::total_cmp);
        println!(
            "| {in_flight} | {eta} | {:.0} | {:.0} – {:.0} | {peak} | {:.0}% |",
            median(&rates),
            rates[0],
            rates[rates.len() - 1],
            100.0 * median(&trainer_share),
        );
    }
    Ok(())
}
