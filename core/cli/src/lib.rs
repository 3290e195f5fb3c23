//! The `areal` command line, as a library.
//!
//! Plugins register themselves at link time, so the binary must link every plugin crate it
//! offers. This crate links the built-in ones; a user's own crate adds theirs and calls
//! [`main`]:
//!
//! ```no_run
//! // src/main.rs of a user's crate that depends on areal-cli and on its own plugin crate
//! use my_reward_plugin as _; // links the plugin's registrations
//!
//! fn main() -> std::process::ExitCode {
//!     areal_cli::main()
//! }
//! # mod my_reward_plugin {}
//! ```

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use areal_core::{ConfigError, ConfigLoader, EvalMetrics, Observer, RunOptions, StepMetrics};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

mod bench;
mod grade;
mod launch;
mod serve;
mod workers;

// The built-in plugins: naming the crates links their registrations.
use areal_algo_ppo as _;
use areal_gen_burn as _;
use areal_model as _;
use areal_reward_code as _;
use areal_reward_math as _;
use areal_reward_plugin as _;
use areal_serve as _;
use areal_tasks as _;
use areal_testkit as _;

/// Fully asynchronous RL for language models on reasoning tasks.
#[derive(Debug, Parser)]
#[command(name = "areal", version, about, long_about = None)]
pub struct Cli {
    /// Log more (-v: info, -vv: debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train with asynchronous RL (the built-in default config unless told otherwise).
    Train(TrainArgs),
    /// List every registered plugin by kind.
    Plugins {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the resolved config (defaults, file and overrides merged) as TOML.
    Config(ConfigCommandArgs),
    /// Evaluate a checkpoint on the task's held-out split: greedy pass@1, or pass@k sampled.
    Eval(EvalArgs),
    /// Grade answers outside training (code: LiveCodeBench records in the wasm sandbox;
    /// math: answers against references; reward: any config's `[reward]` over samples).
    #[command(subcommand)]
    Grade(grade::GradeCommand),
    /// Benchmarks that print tables (areal bench --help lists each, with what it measures).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Serve a plugin of a config over gRPC (generator, reward), for runs in other processes
    /// or on other machines.
    #[command(subcommand)]
    Serve(serve::ServeCommand),
    /// Start servers and a trainer together (`local`: child processes on loopback).
    #[command(subcommand)]
    Launch(launch::LaunchCommand),
}

#[derive(Debug, Args)]
struct EvalArgs {
    /// A checkpoint folder (e.g. `runs/NAME/checkpoint`).
    checkpoint: PathBuf,
    /// The run's config; by default the `config.toml` next to the checkpoint, if any.
    #[command(flatten)]
    config: ConfigArgs,
    /// Which held-out split.
    #[arg(long, default_value = "eval", value_parser = ["eval", "validation"])]
    split: String,
    /// Completions per item: 1 is greedy pass@1; more are sampled for pass@k.
    #[arg(short, long, default_value_t = 1)]
    k: usize,
    /// Sampling temperature for k > 1 (default: the run's `rollout.temperature`).
    #[arg(long)]
    temperature: Option<f32>,
    /// Evaluate at most this many items (0: all).
    #[arg(long, default_value_t = 0)]
    max_items: usize,
    /// Print this many graded completions.
    #[arg(long, default_value_t = 0)]
    show: usize,
}

#[derive(Debug, Args)]
struct ConfigCommandArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Also build every plugin, as `areal train` would, so that plugin options are checked
    /// too (a remote plugin's endpoints are not contacted).
    #[arg(long)]
    check: bool,
}

#[derive(Clone, Debug, Args)]
struct ConfigArgs {
    /// A TOML config file merged over the built-in defaults.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override one key, e.g. `--set rollout.max_staleness=0` (repeatable, applied in order).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// The run's seed (same as `--set seed=N`), from 0 to 2^63 − 1.
    #[arg(long, value_parser = clap::value_parser!(u64).range(..=i64::MAX as u64))]
    seed: Option<u64>,
}

impl ConfigArgs {
    /// The same options as command-line arguments (for a child process).
    fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        if let Some(path) = &self.config {
            args.push("--config".into());
            args.push(path.clone().into_os_string());
        }
        for set in &self.set {
            args.push("--set".into());
            args.push(set.into());
        }
        if let Some(seed) = self.seed {
            args.push("--seed".into());
            args.push(seed.to_string().into());
        }
        args
    }
}

#[derive(Debug, Args)]
struct TrainArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Run folder; by default `runs/<UTC timestamp>`.
    #[arg(long, conflicts_with = "resume")]
    out: Option<PathBuf>,
    /// Go on with the run in this folder from its newest sound checkpoint, with its own
    /// `config.toml` (a run killed, or stopped by a signal).
    #[arg(long, value_name = "RUN_DIR")]
    resume: Option<PathBuf>,
    /// With --resume: apply --config/--set although they change the run's config (each change
    /// is listed; `policy` and `rollout.group_size` can never change), and go on although the
    /// task's data changed.
    #[arg(long, requires = "resume")]
    allow_config_change: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// Run the command line with the process arguments; prints the error chain and returns a
/// non-zero exit code on failure (2 for a bad config or command line, as clap's own).
pub fn main() -> ExitCode {
    main_from(std::env::args_os())
}

/// [`main`] with explicit arguments (the first is the program name).
pub fn main_from<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let started = Instant::now();
    let cli = Cli::parse_from(args);
    init_tracing(cli.verbose);
    match dispatch(cli, started) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.downcast_ref::<Interrupted>().is_some() => {
            #[allow(clippy::print_stderr, reason = "messages for the user, on stderr")]
            {
                eprintln!("{error}");
            }
            ExitCode::from(130)
        }
        Err(error) => {
            let bad_config = error.downcast_ref::<ConfigError>().is_some()
                || error.downcast_ref::<UsageError>().is_some();
            #[allow(clippy::print_stderr, reason = "messages for the user, on stderr")]
            {
                eprintln!("error: {error}");
                for cause in error.chain().skip(1) {
                    eprintln!("  caused by: {cause}");
                }
            }
            ExitCode::from(if bad_config { 2 } else { 1 })
        }
    }
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

#[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
fn dispatch(cli: Cli, started: Instant) -> anyhow::Result<()> {
    match cli.command {
        Command::Plugins { json } => {
            print_plugins(json);
            Ok(())
        }
        Command::Config(args) => {
            let loader = loader(&args.config)?;
            let config = if args.check {
                areal_core::resolve(&loader)?.0
            } else {
                loader.load()?
            };
            print!("{}", config.to_toml());
            Ok(())
        }
        Command::Train(args) => train(args, started),
        Command::Eval(args) => eval(args),
        Command::Grade(command) => grade::run(command),
        Command::Bench(command) => bench::run(command),
        Command::Serve(command) => serve::run(command),
        Command::Launch(command) => launch::run(command, started),
    }
}

#[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
fn print_plugins(json: bool) {
    let plugins = areal_core::registered_plugins();
    if json {
        let list: Vec<_> = plugins
            .iter()
            .map(|p| serde_json::json!({"kind": p.kind, "name": p.name, "description": p.description}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&list).expect("plugins serialise")
        );
        return;
    }
    let width = plugins
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!("{:<10} {:<width$} DESCRIPTION", "KIND", "NAME");
    for p in plugins {
        println!("{:<10} {:<width$} {}", p.kind, p.name, p.description);
    }
}

fn loader(args: &ConfigArgs) -> Result<ConfigLoader, ConfigError> {
    let mut loader = ConfigLoader::new();
    if let Some(path) = &args.config {
        loader = loader.file(path)?;
    }
    loader = loader.set_all(&args.set)?;
    if let Some(seed) = args.seed {
        loader = loader.set(&format!("seed={seed}"))?;
    }
    Ok(loader)
}

/// The config of the run in `dir` (its `config.toml`), with `args` on top only if they change
/// nothing, or `allow` says the changes are meant (then each is logged); `policy` and
/// `rollout.group_size` never change.
fn resume_loader(dir: &Path, args: &ConfigArgs, allow: bool) -> anyhow::Result<ConfigLoader> {
    let own = dir.join("config.toml");
    if !own.exists() {
        anyhow::bail!(
            "{} is not a run folder (it has no config.toml): --resume takes the folder of a run",
            dir.display()
        );
    }
    let run = ConfigLoader::new().file(&own)?;
    let run_config = run.load()?;
    let mut loader = run;
    if let Some(path) = &args.config {
        loader = loader.file(path)?;
    }
    loader = loader.set_all(&args.set)?;
    if let Some(seed) = args.seed {
        loader = loader.set(&format!("seed={seed}"))?;
    }
    let changes = match areal_core::resume_changes(&run_config, &loader.load()?, allow) {
        Ok(changes) => changes,
        Err(areal_core::ResumeRefusal::Fixed(list)) => anyhow::bail!(
            "resuming {} cannot change what its checkpoints were trained with:\n{list}",
            dir.display()
        ),
        Err(areal_core::ResumeRefusal::NotAllowed(list)) => anyhow::bail!(
            "the config given differs from the run's own ({}):\n{list}\nresume without --config/--set, or add --allow-config-change to change it on purpose",
            own.display()
        ),
    };
    for change in &changes {
        tracing::warn!(target: "areal::train", key = %change.key, before = %change.before, after = %change.after, "config changed on resume");
    }
    Ok(loader)
}

/// The async runtime of every command: two worker threads (the engine's own threads for
/// rewards, training and decoding come on top).
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("areal-rt")
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// With `reward_service.workers`, start the worker processes and verify through them instead
/// of with `verifier` (which stays the name and cache identity); the workers live as long as
/// what is returned.
pub(crate) fn in_workers(
    config: &areal_core::Config,
    verifier: &mut Arc<dyn areal_sdk::RewardVerifier>,
    dir: Option<&Path>,
) -> anyhow::Result<Option<workers::RewardWorkers>> {
    Ok(
        workers::start(config, verifier, dir)?.map(|(through, workers)| {
            *verifier = through;
            workers
        }),
    )
}

fn train(args: TrainArgs, started: Instant) -> anyhow::Result<()> {
    let loader = match &args.resume {
        Some(dir) => resume_loader(dir, &args.config, args.allow_config_change)?,
        None => loader(&args.config)?,
    };
    let (config, mut plugins) = areal_core::resolve(&loader)?;
    let out = match (&args.resume, args.out) {
        (Some(dir), _) => dir.clone(),
        (None, Some(out)) => out,
        (None, None) => Path::new("runs").join(utc_timestamp()),
    };
    let _workers = in_workers(
        &config,
        &mut plugins.verifier,
        Some(&out.join("reward-workers")),
    )?;
    let steps = config.train.steps;
    let observer: Arc<dyn Observer> = if args.quiet {
        Arc::new(areal_core::Quiet)
    } else {
        let warmup_steps = config.warmup.enabled.then_some(config.warmup.max_steps);
        Arc::new(Progress::new(steps, warmup_steps))
    };
    let runtime = runtime()?;
    let stop = areal_core::StopRequest::new();
    let watch_signals = {
        let _in_runtime = runtime.enter();
        stop_on_signals(stop.clone())
    };
    runtime.spawn(watch_signals);
    let summary = runtime.block_on(areal_core::run(
        config,
        plugins,
        RunOptions {
            out_dir: Some(out.clone()),
            observer: observer.clone(),
            started,
            stop,
            resume: args.resume.is_some(),
            allow_changes: args.allow_config_change,
        },
    ))?;
    drop(observer);
    #[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
    {
        let acc = |a: Option<f64>| a.map_or("-".to_owned(), |a| format!("{:.3}", a));
        let warmup = match &summary.warmup {
            Some(w) if w.cached => format!(", warm-up of {:.0} s reused", w.seconds),
            Some(w) => format!(", warm-up {:.0} s included", w.seconds),
            None => String::new(),
        };
        println!(
            "trained {} step{} in {:.1} s{warmup} ({}, η = {}): held-out accuracy {} → {}, reward {:.3} → {:.3}",
            summary.steps,
            if summary.steps == 1 { "" } else { "s" },
            summary.wall_seconds,
            summary.algorithm,
            summary.max_staleness,
            acc(summary.baseline_accuracy),
            acc(summary.final_accuracy),
            summary.reward_mean_first,
            summary.reward_mean_last,
        );
        if summary.resumes > 0 {
            println!(
                "resumed {} time{}",
                summary.resumes,
                if summary.resumes == 1 { "" } else { "s" }
            );
        }
        println!("run folder: {}", out.display());
    }
    if summary.interrupted {
        return Err(Interrupted {
            steps: summary.steps,
            dir: out,
        }
        .into());
    }
    Ok(())
}

/// A command line that asks for what cannot be: a flag's value out of its range, flags that
/// do not go together. Exit status 2, as for the usage errors clap finds itself and a bad
/// config: one rule for everything that is wrong before any work starts.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// `Err(UsageError)` with the formatted message.
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err($crate::UsageError(format!($($arg)*)).into())
    };
}
pub(crate) use usage;

/// A run stopped by a signal, its checkpoint and summary saved: exit status 130.
#[derive(Debug, thiserror::Error)]
#[error("interrupted after {steps} steps; the checkpoint and summary are saved; go on with `areal train --resume {}`", dir.display())]
struct Interrupted {
    steps: u64,
    dir: PathBuf,
}

/// SIGINT or SIGTERM stop the run cleanly (the step in progress finishes, the checkpoint and
/// summary are written); a second one exits at once. The handlers are installed when this is
/// called (inside the runtime), not when the returned future first runs, so a signal sent as
/// soon as the run starts is already caught.
#[cfg(unix)]
fn stop_on_signals(
    stop: areal_core::StopRequest,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        let (Ok(mut interrupt), Ok(mut terminate)) = handlers else {
            return;
        };
        let mut received = 0;
        loop {
            let name = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            received += 1;
            #[allow(clippy::print_stderr, reason = "messages for the user, on stderr")]
            if received == 1 {
                eprintln!(
                    "{name}: stopping after the step in progress, then saving the checkpoint and summary (again to quit at once)"
                );
                stop.request();
            } else {
                eprintln!("{name} again: quitting at once");
                std::process::exit(130);
            }
        }
    }
}

/// Ctrl-C stops the run cleanly; a second one exits at once.
#[cfg(not(unix))]
fn stop_on_signals(
    stop: areal_core::StopRequest,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.request();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    }
}

fn eval(args: EvalArgs) -> anyhow::Result<()> {
    let mut config_args = args.config;
    if config_args.config.is_none() {
        // a checkpoint inside a run folder: use that run's config
        let beside = args.checkpoint.parent().map(|p| p.join("config.toml"));
        config_args.config = beside.filter(|p| p.exists());
    }
    let (config, mut plugins) = areal_core::resolve(&loader(&config_args)?)?;
    let _workers = in_workers(&config, &mut plugins.verifier, None)?;
    let split = if args.split == "validation" {
        areal_sdk::Split::Validation
    } else {
        areal_sdk::Split::Eval
    };
    let k = args.k.max(1);
    let sampling = if k == 1 {
        areal_sdk::SamplingParams::greedy()
    } else {
        areal_sdk::SamplingParams {
            temperature: args.temperature.unwrap_or(config.rollout.temperature),
            top_p: config.rollout.top_p,
            seed: config.seed,
        }
    };
    let spec = areal_core::eval::EvalSpec {
        samples: k,
        sampling,
        ..areal_core::eval::EvalSpec::greedy(&config, split, args.max_items)
    };
    let runtime = runtime()?;
    let outcome = runtime.block_on(areal_core::eval::evaluate_checkpoint(
        &config,
        plugins,
        &args.checkpoint,
        &spec,
    ))?;
    #[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
    {
        for item in outcome.results.iter().take(args.show) {
            for g in &item.completions {
                println!(
                    "{}  {}{}  [{}]",
                    item.item_id,
                    item.prompt,
                    g.completion,
                    g.verdict.as_str()
                );
            }
        }
        if k == 1 {
            println!(
                "{}: greedy pass@1 {:.3} on {} {} items (reward {:.3})",
                args.checkpoint.display(),
                outcome.accuracy,
                outcome.items,
                split.as_str(),
                outcome.reward_mean
            );
        } else {
            println!(
                "{}: pass@1 {:.3}, pass@{k} {:.3} on {} {} items, {k} samples each at temperature {}",
                args.checkpoint.display(),
                outcome.accuracy,
                outcome.pass_at_k,
                outcome.items,
                split.as_str(),
                spec.sampling.temperature
            );
        }
        println!(
            "{}",
            serde_json::to_string(&outcome).expect("the outcome serialises")
        );
    }
    Ok(())
}

/// A progress bar on a terminal; a line every few steps otherwise (logs, CI). The bar counts
/// warm-up steps (up to `warmup.max_steps`; it may stop earlier at its plateau), then RL steps.
struct Progress {
    bar: Option<ProgressBar>,
    every: u64,
    steps: u64,
}

impl Progress {
    fn new(steps: u64, warmup_steps: Option<u64>) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(warmup_steps.unwrap_or(steps));
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>7} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
                )
                .expect("valid template"),
            );
            bar.set_prefix(if warmup_steps.is_some() {
                "warm-up"
            } else {
                "RL"
            });
            bar.enable_steady_tick(std::time::Duration::from_millis(500));
            bar
        });
        Self {
            bar,
            every: (steps / 20).max(1),
            steps,
        }
    }

    /// Switch the bar from warm-up to RL steps (idempotent).
    fn rl_phase(&self) {
        if let Some(bar) = &self.bar
            && bar.prefix() != "RL"
        {
            bar.set_prefix("RL");
            bar.set_length(self.steps);
            bar.set_position(0);
            bar.set_message("");
        }
    }

    #[allow(clippy::print_stderr, reason = "messages for the user, on stderr")]
    fn line(&self, text: String) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}

impl Observer for Progress {
    fn on_step(&self, m: &StepMetrics) {
        // What a step costs on each side: generation, verification, training.
        let msg = format!(
            "v{} reward {:.3} lag≤{} gen {:.0} tok/s, reward p50 {:.0} ms, train {:.0} ms",
            m.policy_version,
            m.reward_mean,
            m.staleness.token_lag_max,
            m.gen_tokens_per_s,
            m.reward_latency_p50_ms,
            m.train_ms
        );
        self.rl_phase();
        match &self.bar {
            Some(bar) => {
                bar.set_position(m.step);
                bar.set_message(msg);
            }
            None if m.step.is_multiple_of(self.every) => {
                self.line(format!("step {} {msg}", m.step))
            }
            None => {}
        }
    }

    fn on_warmup(&self, m: &areal_core::WarmupMetrics) {
        if let Some(bar) = &self.bar {
            bar.set_position(m.step);
            bar.set_message(format!("validation accuracy {:.3}", m.validation_accuracy));
        }
        self.line(format!(
            "warm-up step {}: loss {:.3}, validation loss {:.3}, accuracy {:.3} ({:.0} s, {:.0} tokens/s)",
            m.step, m.loss, m.validation_loss, m.validation_accuracy, m.seconds, m.tokens_per_s
        ));
    }

    fn on_eval(&self, m: &EvalMetrics) {
        self.rl_phase();
        self.line(format!(
            "eval after step {} (v{}): accuracy {:.3}, reward {:.3} on {} held-out items",
            m.step, m.policy_version, m.accuracy, m.reward_mean, m.items
        ));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `YYYYMMDD-HHMMSS` in UTC.
fn utc_timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // civil-from-days (Howard Hinnant's algorithm)
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamp_has_the_documented_shape() {
        let t = super::utc_timestamp();
        assert_eq!(t.len(), 15, "{t}");
        assert_eq!(&t[8..9], "-");
        assert!(
            t[..8].chars().all(|c| c.is_ascii_digit()) && t[..4] >= *"2024",
            "{t}"
        );
    }
}
