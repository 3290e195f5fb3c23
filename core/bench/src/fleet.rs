//! `areal bench fleet`: one trainer driving N generator servers (child processes on loopback,
//! each the testkit bigram generator with a per-token delay standing for a GPU's decode step):
//! rollout throughput against N × one server's; and the time to push one weight update to N
//! servers, for the built-in model and a random model of half a billion parameters.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use areal_sdk::{Generator, NamedTensor, WeightUpdate};
use clap::Args;

use areal_cli::internal::{Servers, endpoints};

#[derive(Debug, Args)]
pub(crate) struct BenchFleetArgs {
    /// Generator server counts of the throughput table.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    servers: Vec<usize>,
    /// Milliseconds each server takes per token of a sample (a GPU's decode step).
    #[arg(long, default_value_t = 50.0)]
    token_delay_ms: f64,
    /// Samples each server decodes at once (the trainer keeps N times this many in flight).
    #[arg(long, default_value_t = 16)]
    per_server: usize,
    /// Tokens a sample may have.
    #[arg(long, default_value_t = 16)]
    max_new_tokens: usize,
    /// Samples per training step, in units of the samples in flight (a step every so many
    /// sample times: the weight-update protocol runs once per step).
    #[arg(long, default_value_t = 1)]
    batch_factor: usize,
    /// Training steps per server count, at least 4 (the first two fill the pipeline and are
    /// not timed).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u64).range(4..))]
    steps: u64,
    /// Server counts of the weight-push table.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    push_servers: Vec<usize>,
    /// Parameters of the random model whose push is timed (0 skips it).
    #[arg(long, default_value_t = 500_000_000)]
    push_params: u64,
    /// Also write the report (markdown) to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What the trainer saw of each step: (seconds since the first, rollouts accepted, tokens
/// trained so far, milliseconds of the weight-update protocol).
#[derive(Default)]
struct Trace {
    steps: Mutex<Vec<(f64, u64, u64, f64)>>,
    started: std::sync::OnceLock<Instant>,
}

impl areal_core::Observer for Trace {
    fn on_step(&self, metrics: &areal_core::StepMetrics) {
        let t = self
            .started
            .get_or_init(Instant::now)
            .elapsed()
            .as_secs_f64();
        let mut steps = self.steps.lock().expect("trace lock");
        let tokens = steps.last().map_or(0, |s| s.2) + metrics.trained_tokens as u64;
        steps.push((t, metrics.accepted_total, tokens, metrics.weight_sync_ms));
    }
}

/// One row of the throughput table.
struct Throughput {
    rollouts_per_s: f64,
    tokens_per_s: f64,
    step_s: f64,
    sync_ms: f64,
    /// Cores the trainer process used (its controller, transport and training).
    trainer_cores: f64,
    /// Fraction of the machine's cores busy (the trainer and every server).
    machine_busy: f64,
}

/// CPU seconds this process has used (Linux `/proc/self/stat`; 0 elsewhere).
fn process_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // fields after the command name, which ends with the last ')'
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name
    (ticks(11) + ticks(12)) / 100.0
}

/// (busy, total) jiffies of the whole machine (Linux `/proc/stat`).
fn machine_jiffies() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let values: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = values.iter().take(8).sum();
    let idle = values.get(3).unwrap_or(&0.0) + values.get(4).unwrap_or(&0.0);
    (total - idle, total)
}

/// Start `n` generator servers of `config` with `sets`.
fn start_servers(
    n: usize,
    config: &Path,
    sets: &[String],
    logs: &Path,
) -> anyhow::Result<(Servers, Vec<String>)> {
    let mut args: Vec<OsString> = vec!["--config".into(), config.into()];
    for set in sets {
        args.extend(["--set".into(), set.into()]);
    }
    crate::start_servers("generator", n, &args, logs)
}

/// Rollouts and tokens per second with `n` servers.
fn throughput(
    args: &BenchFleetArgs,
    n: usize,
    config: &Path,
    logs: &Path,
) -> anyhow::Result<Throughput> {
    let delay_us = (args.token_delay_ms * 1e3).round() as u64;
    // the servers refuse samples longer than their config's rollout.max_new_tokens
    let (mut servers, urls) = start_servers(
        n,
        config,
        &[
            format!("generator.token_delay_us={delay_us}"),
            format!("rollout.max_new_tokens={}", args.max_new_tokens),
        ],
        logs,
    )?;
    let in_flight = args.per_server * n;
    let loader = areal_core::ConfigLoader::new()
        .toml(areal_testkit::CONFIG, Path::new("sdk/testkit/testkit.toml"))?
        .set_all([
            "generator.kind=remote".to_owned(),
            format!(
                "generator.endpoints={}",
                endpoints(&urls.iter().map(String::as_str).collect::<Vec<_>>())
            ),
            "rollout.group_size=1".to_owned(),
            format!("rollout.batch_size={}", in_flight * args.batch_factor),
            format!("rollout.max_concurrent={in_flight}"),
            "rollout.max_staleness=4".to_owned(),
            format!("rollout.max_new_tokens={}", args.max_new_tokens),
            format!("train.steps={}", args.steps),
            "eval.enabled=false".to_owned(),
        ])?;
    let (config, plugins) = areal_core::resolve(&loader)?;
    let trace = Arc::new(Trace::default());
    let options = areal_core::RunOptions {
        observer: trace.clone(),
        ..areal_core::RunOptions::default()
    };
    let (cpu0, machine0, wall0) = (process_cpu_s(), machine_jiffies(), Instant::now());
    areal_cli::internal::runtime()?.block_on(areal_core::run(config, plugins, options))?;
    let (cpu1, machine1, wall) = (process_cpu_s(), machine_jiffies(), wall0.elapsed());
    servers.stop();
    let steps = trace.steps.lock().expect("trace lock");
    let (t0, a0, k0, _) = steps[1];
    let (t1, a1, k1, _) = steps[steps.len() - 1];
    let seconds = (t1 - t0).max(1e-9);
    let timed = &steps[2..];
    Ok(Throughput {
        rollouts_per_s: (a1 - a0) as f64 / seconds,
        tokens_per_s: (k1 - k0) as f64 / seconds,
        step_s: seconds / timed.len() as f64,
        sync_ms: timed.iter().map(|s| s.3).sum::<f64>() / timed.len() as f64,
        trainer_cores: (cpu1 - cpu0) / wall.as_secs_f64().max(1e-9),
        machine_busy: (machine1.0 - machine0.0) / (machine1.1 - machine0.1).max(1.0),
    })
}

/// A square bigram table, so that the testkit servers accept the update.
fn table() -> NamedTensor {
    NamedTensor {
        name: areal_testkit::TABLE.into(),
        shape: vec![4, 4],
        data: vec![-(4f32.ln()); 16],
    }
}

/// `params` random values in tensors of at most 2^24.
fn random_model(params: u64) -> Vec<NamedTensor> {
    const PART: u64 = 1 << 24;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut tensors = Vec::new();
    let mut left = params;
    while left > 0 {
        let n = left.min(PART);
        left -= n;
        let data = (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04
            })
            .collect();
        tensors.push(NamedTensor {
            name: format!("layers.{}.weight", tensors.len()),
            shape: vec![n as usize],
            data,
        });
    }
    tensors
}

/// Seconds to push `tensors` to `n` servers (streamed, checked, loaded, acknowledged).
fn push(
    tensors: &Arc<Vec<NamedTensor>>,
    n: usize,
    config: &Path,
    logs: &Path,
) -> anyhow::Result<f64> {
    let (mut servers, urls) = start_servers(n, config, &[], logs)?;
    let runtime = areal_cli::internal::runtime()?;
    let options: areal_serve::GeneratorFleetOptions =
        serde_json::from_value(serde_json::json!({ "endpoints": urls, "probe_interval_s": 0.05 }))?;
    let remote = areal_serve::GeneratorFleet::new("remote", &options, None)?;
    let seconds = runtime.block_on(async {
        remote
            .update_weights(WeightUpdate::new(0, vec![table()]))
            .await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while remote.report().matches("holding version 0").count() < n {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the servers never took the first weights: {}",
                remote.report()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let update = WeightUpdate {
            version: 1,
            tensors: tensors.clone(),
            architecture: Arc::new(serde_json::Value::Null),
            adapter: None,
        };
        let started = Instant::now();
        remote.update_weights(update).await?;
        let seconds = started.elapsed().as_secs_f64();
        anyhow::ensure!(
            remote.report().matches("holding version 1").count() == n,
            "not every server took the weights: {}",
            remote.report()
        );
        Ok(seconds)
    })?;
    drop(remote);
    servers.stop();
    Ok(seconds)
}

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(super) fn run(args: BenchFleetArgs) -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let config = scratch.path().join("testkit.toml");
    std::fs::write(&config, areal_testkit::CONFIG)?;
    let logs = scratch.path().join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut report = String::new();
    let mut emit = |line: String| {
        println!("{line}");
        let _ = writeln!(report, "{line}");
    };
    eprintln!(
        "each server: the testkit bigram generator, {} ms a token, {} samples at once, up to {} \
         tokens a sample; one trainer (testkit bigram policy, one sample per group, η = 4, \
         {}× the samples in flight per step), {} steps per row, the first two not timed",
        args.token_delay_ms, args.per_server, args.max_new_tokens, args.batch_factor, args.steps
    );
    emit("| generator servers | samples in flight | rollouts/s | tokens/s | ideal tokens/s (N × one server) | of ideal | seconds a step | weight update (ms) | trainer cores | machine busy |".into());
    emit("|---|---|---|---|---|---|---|---|---|---|".into());
    let mut one: Option<f64> = None;
    for &n in &args.servers {
        let row = throughput(&args, n, &config, &logs)
            .with_context(|| format!("the run with {n} servers"))?;
        let single = *one.get_or_insert(row.tokens_per_s / n as f64);
        let ideal = single * n as f64;
        emit(format!(
            "| {n} | {} | {:.0} | {:.0} | {ideal:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.0}% |",
            n * args.per_server,
            row.rollouts_per_s,
            row.tokens_per_s,
            row.tokens_per_s / ideal,
            row.step_s,
            row.sync_ms,
            row.trainer_cores,
            100.0 * row.machine_busy,
        ));
    }

    emit(String::new());
    emit("| model | parameters | MB | servers | seconds | GB/s sent (all servers) |".into());
    emit("|---|---|---|---|---|---|".into());
    let (default_config, plugins) = areal_core::resolve(&areal_core::ConfigLoader::new())?;
    drop(default_config);
    let mut built_in = plugins.policy.weights();
    built_in.push(table());
    let mut models = vec![("built-in transformer", Arc::new(built_in))];
    if args.push_params > 0 {
        eprintln!("making a random model of {} parameters", args.push_params);
        let mut random = random_model(args.push_params);
        random.push(table());
        models.push(("random", Arc::new(random)));
    }
    for (name, tensors) in &models {
        let params: usize = tensors.iter().map(|t| t.data.len()).sum();
        let bytes = params as f64 * 4.0;
        for &n in &args.push_servers {
            let seconds = push(tensors, n, &config, &logs)
                .with_context(|| format!("pushing the {name} model to {n} servers"))?;
            emit(format!(
                "| {name} | {params} | {:.1} | {n} | {seconds:.3} | {:.2} |",
                bytes / 1e6,
                bytes * n as f64 / seconds / 1e9
            ));
        }
    }
    if let Some(path) = &args.out {
        std::fs::write(path, &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
