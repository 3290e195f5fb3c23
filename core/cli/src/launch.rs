//! `areal launch local`: generator and reward servers as child processes on loopback, then
//! the trainer in this process with `remote` plugins on them.
//!
//! No server outlives the launcher: each reads a pipe from it as its standard input and stops
//! when that closes, which happens however the launcher ends (the run's end, an error, Ctrl-C,
//! even SIGKILL). Each runs in a process group of its own, so Ctrl-C reaches the trainer
//! alone, which stops cleanly (checkpoint and summary saved) before the servers are stopped.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use crate::configs::loader;
use crate::train::{TrainArgs, utc_timestamp};
use areal_core::processes::{ServerProcesses as Servers, endpoints};

#[derive(Debug, Subcommand)]
pub(crate) enum LaunchCommand {
    /// Start generator and reward servers as child processes on loopback, then train on them
    /// (`[generator]` and `[reward]` become `remote` with their endpoints); every server stops
    /// with the run: at its end, on an error, on Ctrl-C. Their logs go to `RUN/servers/`.
    Local(LocalArgs),
}

#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    /// Generator servers (`areal serve generator`) to start; 0 generates in process.
    #[arg(long, default_value_t = 1)]
    generators: usize,
    /// Reward servers (`areal serve reward`) to start; 0 verifies in process.
    #[arg(long, default_value_t = 0)]
    reward_servers: usize,
    /// Seconds to wait for every server to listen.
    #[arg(long, default_value_t = 300.0)]
    start_timeout_s: f64,
    /// Override one key of the trainer's side only, after `[generator]` and `[reward]`
    /// became `remote` on the servers: the remote clients' own options, which the servers do
    /// not have, e.g. `--trainer-set generator.grace_s=120` or `--trainer-set
    /// generator.weights_dir=/shared/weights` (repeatable, applied in order, after `--set`,
    /// which goes to both sides).
    #[arg(long = "trainer-set", value_name = "KEY=VALUE")]
    trainer_set: Vec<String>,
    #[command(flatten)]
    train: TrainArgs,
}

pub(crate) fn run(command: LaunchCommand, started: Instant) -> anyhow::Result<()> {
    match command {
        LaunchCommand::Local(args) => local(args, started),
    }
}

/// The config the servers of a launched run serve, in its `servers/` folder.
const SERVED_CONFIG: &str = "config.toml";

/// The most servers of one kind `launch local` starts.
const MAX_SERVERS: usize = 256;

fn local(mut args: LocalArgs, started: Instant) -> anyhow::Result<()> {
    if args.generators == 0 && args.reward_servers == 0 {
        crate::usage!("nothing to launch: give --generators N and/or --reward-servers M");
    }
    if args.generators > MAX_SERVERS || args.reward_servers > MAX_SERVERS {
        crate::usage!("at most {MAX_SERVERS} servers of each kind");
    }
    if !(args.start_timeout_s > 0.0 && args.start_timeout_s <= 86_400.0) {
        crate::usage!(
            "--start-timeout-s must be between 0 and 86400, found {}",
            args.start_timeout_s
        );
    }
    let out = args
        .train
        .resume
        .clone()
        .or_else(|| args.train.out.clone())
        .unwrap_or_else(|| Path::new("runs").join(utc_timestamp()));
    let logs = out.join(areal_core::LAUNCH_DIR);
    // The run's own config.toml says `kind = "remote"`; what the servers serve is kept beside
    // their logs, so that a resumed run's servers serve the same.
    let served = logs.join(SERVED_CONFIG);
    let mut server_config = args.train.config.clone();
    if args.train.resume.is_some() {
        if !served.exists() {
            bail!(
                "{} has no {}: the run was not started by `areal launch local`; resume it with `areal train --resume`",
                out.display(),
                served.display()
            );
        }
        server_config.config = Some(served.clone());
    }
    // a bad config fails here, before any server starts
    let config = loader(&server_config)?.load()?;
    if args.train.resume.is_none() {
        // a new run's folder is checked before the servers' logs go in (as the run checks it)
        areal_core::prepare_run_folder(&out, args.train.overwrite)?;
    }
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    if args.train.resume.is_none() {
        areal_core::atomic::write(&served, config.to_toml().as_bytes())
            .with_context(|| format!("cannot write {}", served.display()))?;
    }
    let exe = std::env::current_exe().context("cannot find the areal binary")?;
    let mut servers = Servers::default();
    let kinds = std::iter::repeat_n("generator", args.generators)
        .chain(std::iter::repeat_n("reward", args.reward_servers));
    for kind in kinds {
        servers.start(&exe, kind, &server_config.to_args(), &logs)?;
    }
    let urls = servers.wait_listening(Duration::from_secs_f64(args.start_timeout_s))?;
    let set = &mut args.train.config.set;
    for kind in ["generator", "reward"] {
        let of_kind: Vec<&str> = urls
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, url)| url.as_str())
            .collect();
        if !of_kind.is_empty() {
            set.push(format!("{kind}.kind=remote"));
            set.push(format!("{kind}.endpoints={}", endpoints(&of_kind)));
            if kind == "reward" {
                // the servers start the worker processes the config asks for, not the trainer
                set.push("reward_service.workers=0".into());
            }
        }
    }
    set.extend(args.trainer_set.iter().cloned());
    tracing::info!(target: "areal::launch", servers = urls.len(), "servers listening; training");
    if args.train.resume.is_none() {
        args.train.out = Some(out);
    }
    let result = crate::train::run(args.train, started);
    servers.stop();
    result
}
