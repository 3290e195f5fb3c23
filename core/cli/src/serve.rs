//! `areal serve`: a plugin of a config served over gRPC for runs on other processes or machines.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use areal_serve::{Listen, token_from_env};
use clap::{Args, Subcommand};

use crate::{ConfigArgs, loader, runtime};

#[derive(Debug, Subcommand)]
pub(crate) enum ServeCommand {
    /// Serve the config's `[reward]` plugin (any registered reward) on its
    /// `reward_service.threads` threads; clients use `[reward] kind = "remote"` with
    /// `endpoints = ["http://ADDR"]`. Runs until SIGINT or SIGTERM.
    Reward(ServeArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Address to listen on. Any address but loopback needs a shared token.
    #[arg(long, default_value = "127.0.0.1:50061")]
    listen: SocketAddr,
    /// A file holding the shared token (else `AREAL_TOKEN`); every call must carry it.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

pub(crate) fn run(command: ServeCommand) -> anyhow::Result<()> {
    match command {
        ServeCommand::Reward(args) => serve_reward(args),
    }
}

fn token(file: Option<&PathBuf>) -> anyhow::Result<Option<String>> {
    let Some(path) = file else {
        return Ok(token_from_env());
    };
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    Ok(Some(token.trim().to_owned()).filter(|t| !t.is_empty()))
}

#[allow(clippy::print_stdout)]
fn serve_reward(args: ServeArgs) -> anyhow::Result<()> {
    let listen = Listen {
        addr: args.listen,
        token: token(args.token_file.as_ref())?,
    };
    // refuse a bad address before building anything
    listen.check()?;
    let (config, verifier) = areal_core::resolve_reward(&loader(&args.config)?)?;
    let threads = config.reward_service.threads;
    let name = verifier.name().to_owned();
    let runtime = runtime()?;
    runtime.block_on(areal_serve::serve_reward(
        verifier,
        threads,
        listen,
        |addr| {
            // one line a launcher (or a user) can wait for
            println!("serving reward {name} on {addr} ({threads} threads)");
        },
        async {
            let _ = tokio::signal::ctrl_c().await;
        },
    ))?;
    Ok(())
}
