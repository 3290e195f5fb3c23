//! The `areal` command line, as a library.
//!
//! Plugins register themselves at link time, so the binary must link every plugin crate it
//! offers. This crate links the built-in ones; a user's own crate adds theirs and calls
//! [`main`] (the `areal` binary itself also links the testkit's plugins and adds `areal bench`,
//! with [`main_with`]):
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
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use areal_core::ConfigError;
use clap::{Parser, Subcommand};

mod configs;
mod eval;
mod grade;
mod launch;
mod lora;
mod plugins;
mod progress;
mod serve;
mod signals;
mod train;

// The built-in plugins: naming the crates links their registrations.
use areal_algo_ppo as _;
use areal_gen_burn as _;
use areal_model as _;
use areal_reward_code as _;
use areal_reward_math as _;
use areal_reward_plugin as _;
use areal_serve as _;
use areal_tasks as _;
use areal_tools as _;

/// Fully asynchronous RL for language models on reasoning tasks.
#[derive(Debug, Parser)]
#[command(name = "areal", version, long_about = None)]
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
    Train(train::TrainArgs),
    /// List every registered plugin by kind.
    Plugins {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the resolved config (defaults, file and overrides merged) as TOML.
    Config(configs::ConfigCommandArgs),
    /// Evaluate a checkpoint on the task's held-out split: greedy pass@1, or pass@k sampled.
    Eval(eval::EvalArgs),
    /// Grade answers outside training (code: LiveCodeBench records in the wasm sandbox;
    /// math: answers against references; reward: any config's `[reward]` over samples).
    #[command(subcommand)]
    Grade(grade::GradeCommand),
    /// Serve a plugin of a config over gRPC (generator, reward), for runs in other processes
    /// or on other machines.
    #[command(subcommand)]
    Serve(serve::ServeCommand),
    /// Start servers and a trainer together (`local`: child processes on loopback).
    #[command(subcommand)]
    Launch(launch::LaunchCommand),
    /// LoRA adapters outside training (`merge`: an adapter folded into its base).
    #[command(subcommand)]
    Lora(lora::LoraCommand),
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
    main_with(args, &[])
}

/// A command a binary adds to the command line: the `areal` binary adds `bench` (the
/// `areal-bench` crate) this way, so that a user's own binary, built on [`main`], links no
/// benchmark code.
pub struct Extension {
    /// The subcommand: its name, help and arguments (`-v` comes with it).
    pub command: fn() -> clap::Command,
    /// Run it with its own matches.
    pub run: fn(&clap::ArgMatches) -> anyhow::Result<()>,
}

/// [`main_from`] with `extensions` added to the commands.
pub fn main_with<I, T>(args: I, extensions: &[Extension]) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::{CommandFactory, FromArgMatches};
    let started = Instant::now();
    let mut command = Cli::command();
    let mut added = Vec::new();
    for extension in extensions {
        let sub = (extension.command)();
        added.push((sub.get_name().to_owned(), extension.run));
        command = command.subcommand(sub);
    }
    let matches = command.get_matches_from(args);
    init_tracing(matches.get_count("verbose"));
    let outcome = match matches.subcommand().and_then(|(name, sub)| {
        added
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, run)| (run, sub))
    }) {
        Some((run, sub)) => run(sub),
        None => match Cli::from_arg_matches(&matches) {
            Ok(cli) => dispatch(cli, started),
            Err(e) => e.exit(),
        },
    };
    exit_code(outcome)
}

/// The exit status of a command's outcome, its error chain printed: 130 for a run stopped
/// by a signal, 2 for a bad config or command line (as clap's own), 1 for anything else.
fn exit_code(outcome: anyhow::Result<()>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.downcast_ref::<train::Interrupted>().is_some() => {
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

/// What `areal-bench` shares with the commands (the runtime, config options, server
/// processes, the `lcb` reward in workers): not a stable API.
#[doc(hidden)]
pub mod internal {
    pub use crate::configs::{ConfigArgs, loader};
    pub use crate::grade::code::{lcb_workers, verify_record};
    pub use crate::runtime;
    pub use crate::train::utc_timestamp;
    pub use areal_core::processes::{ServerProcesses as Servers, endpoints};
    pub use areal_core::reward_workers::{CALLS_PER_WORKER, RewardWorkers};
}

fn init_tracing(verbose: u8) {
    // wasmtime-wasi opens an `info` span (and formats its fields) for every WASI call a
    // sandboxed program makes: ~3 % of a grading worker's CPU (reward workers run with `-v`),
    // and nothing a user reads
    let default = match verbose {
        0 => "warn",
        1 => "info,wasmtime_wasi=warn",
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

fn dispatch(cli: Cli, started: Instant) -> anyhow::Result<()> {
    match cli.command {
        Command::Plugins { json } => {
            plugins::print(json);
            Ok(())
        }
        Command::Config(args) => configs::run(args),
        Command::Train(args) => train::run(args, started),
        Command::Eval(args) => eval::run(args),
        Command::Grade(command) => grade::run(command),
        Command::Serve(command) => serve::run(command),
        Command::Launch(command) => launch::run(command, started),
        Command::Lora(command) => lora::run(command),
    }
}

/// The async runtime of every command: two worker threads (the engine's own threads for
/// rewards, training and decoding come on top).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    runtime_with(2)
}

/// [`runtime`] with `threads` worker threads.
pub(crate) fn runtime_with(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("areal-rt")
        .enable_all()
        .build()
        .context("cannot start the async runtime")
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
