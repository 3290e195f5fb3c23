//! `areal serve`: a plugin of a config served over gRPC for runs on other processes or machines.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use areal_serve::{Listen, ServerTls, token_from_env};
use clap::{Args, Subcommand};

use crate::configs::{ConfigArgs, loader};
use crate::runtime;

#[derive(Debug, Subcommand)]
pub(crate) enum ServeCommand {
    /// Serve the config's `[generator]` plugin (any registered generator); runs use
    /// `[generator] kind = "remote"` with `endpoints = ["http://ADDR", ...]`, or with
    /// `--api sglang|vllm` the `sglang` or `vllm` generator (and any client of those HTTP
    /// APIs). Runs until SIGINT or SIGTERM.
    Generator(GeneratorArgs),
    /// Serve the config's `[reward]` plugin (any registered reward) on its
    /// `reward_service.threads` threads; runs use `[reward] kind = "remote"` with
    /// `endpoints = ["http://ADDR", ...]`. Runs until SIGINT or SIGTERM.
    Reward(RewardArgs),
    /// Serve the config's `[[tools]]` (any registered tools), a session per episode kept on the
    /// server between its calls; runs use `[[tools]] kind = "remote"` with `endpoints =
    /// ["http://ADDR", ...]` and `tool = NAME`. Runs until SIGINT or SIGTERM.
    Tools(ToolsArgs),
}

// Two structs with literal defaults: clap keeps a derived default in one static per field,
// which a const-generic struct would share between its kinds.
#[derive(Debug, Args)]
pub(crate) struct GeneratorArgs {
    /// Address to listen on (port 0 picks a free one). Any address but loopback needs a
    /// shared token.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// The API to serve: areal-rs's gRPC service, or the subset of SGLang's or vLLM's HTTP
    /// API that RL uses (generation by token ids with logprobs, pause and resume, weights
    /// loaded from a checkpoint folder, /tokenize with the config's policy tokenizer).
    #[arg(long, value_enum, default_value = "grpc")]
    api: Api,
    /// With --api sglang|vllm: a checkpoint folder (`config.json` + `model.safetensors`) to
    /// load before serving, as those servers start with `--model`; else the first weights
    /// come from the client.
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    common: ServeArgs,
}

/// The API `areal serve generator` speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Api {
    /// areal-rs's gRPC service (the `remote` generator).
    Grpc,
    /// SGLang's native HTTP API.
    Sglang,
    /// vLLM's token-in/token-out and RL routes.
    Vllm,
}

#[derive(Debug, Args)]
pub(crate) struct RewardArgs {
    /// Address to listen on (port 0 picks a free one). Any address but loopback needs a
    /// shared token.
    #[arg(long, default_value = "127.0.0.1:50061")]
    listen: SocketAddr,
    #[command(flatten)]
    common: ServeArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ToolsArgs {
    /// Address to listen on (port 0 picks a free one). Any address but loopback needs a
    /// shared token.
    #[arg(long, default_value = "127.0.0.1:50071")]
    listen: SocketAddr,
    /// Sessions kept at once, all tools together (more are refused until some close; the
    /// `python` tool keeps at most 1024 interpreters per process).
    #[arg(long, default_value_t = 1024)]
    max_sessions: usize,
    /// Seconds a session may go uncalled before it is dropped (a client that died).
    #[arg(long, default_value_t = 600.0)]
    idle_s: f64,
    /// Threads that run the tools' calls.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[command(flatten)]
    common: ServeArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
    /// A file holding the shared token (else `AREAL_TOKEN`); every call must carry it.
    #[arg(long)]
    pub(crate) token_file: Option<PathBuf>,
    /// Serve TLS with this certificate chain (PEM); clients use `https://` endpoints and
    /// `tls_ca_file`.
    #[arg(long, requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Also stop when standard input closes (a launcher's pipe: the server ends with the
    /// launcher, however that ends).
    #[arg(long, hide = true)]
    pub(crate) until_stdin_closes: bool,
}

pub(crate) fn run(command: ServeCommand) -> anyhow::Result<()> {
    match command {
        ServeCommand::Generator(args) => serve_generator(args),
        ServeCommand::Reward(args) => serve_reward(args),
        ServeCommand::Tools(args) => serve_tools(args),
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

fn listen(addr: SocketAddr, args: &ServeArgs) -> anyhow::Result<Listen> {
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(ServerTls::from_files(cert, key)?),
        _ => None,
    };
    let listen = Listen {
        addr,
        token: token(args.token_file.as_ref())?,
        tls,
    };
    // refuse a bad address before building anything
    listen.check()?;
    Ok(listen)
}

/// SIGINT, SIGTERM, or (when asked) standard input closing. Installed inside the runtime.
fn shutdown(until_stdin_closes: bool) -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        let stdin_closed = async {
            if until_stdin_closes {
                // a thread of its own, not the runtime's blocking pool: the process must not
                // wait for it to exit when a signal ends the server
                let (closed, on_closed) = tokio::sync::oneshot::channel::<()>();
                let _ = std::thread::Builder::new()
                    .name("areal-stdin".into())
                    .spawn(move || {
                        let mut sink = [0u8; 64];
                        let mut stdin = std::io::stdin().lock();
                        while std::io::Read::read(&mut stdin, &mut sink).is_ok_and(|n| n > 0) {}
                        let _ = closed.send(());
                    });
                let _ = on_closed.await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        #[cfg(unix)]
        let terminated = async {
            match terminate {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let terminated = std::future::pending::<()>();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminated => {}
            () = stdin_closed => {}
        }
    }
}

#[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
fn serve_generator(
    GeneratorArgs {
        listen: addr,
        api,
        model,
        common: args,
    }: GeneratorArgs,
) -> anyhow::Result<()> {
    if api == Api::Grpc && model.is_some() {
        crate::usage!(
            "--model is for --api sglang|vllm; a gRPC server gets its weights from the run"
        );
    }
    let listen = listen(addr, &args)?;
    let (config, generator) = areal_core::resolve_generator(&loader(&args.config)?)?;
    let name = generator.name().to_owned();
    let runtime = runtime()?;
    let shutdown = {
        let _in_runtime = runtime.enter();
        shutdown(args.until_stdin_closes)
    };
    let http_api = match api {
        Api::Grpc => None,
        Api::Sglang => Some(areal_serve::InferenceApi::Sglang),
        Api::Vllm => Some(areal_serve::InferenceApi::Vllm),
    };
    if let Some(http_api) = http_api {
        let tokenizer = match areal_core::policy_tokenizer(&config) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(target: "areal::serve", error = %e, "no tokenizer from the config's [policy]: /tokenize is not served, and clients cannot check tokenizers");
                None
            }
        };
        let served = runtime.block_on(areal_serve::serve_inference_api(
            http_api,
            generator,
            config.rollout.max_new_tokens,
            tokenizer,
            model.as_deref(),
            listen,
            |addr| {
                // one line a launcher (or a user) can wait for
                println!(
                    "serving generator {name} on {addr} (the {} HTTP API)",
                    http_api.name()
                );
            },
            shutdown,
        ));
        // what is still running (a weight load a stalled client started) does not hold the exit
        runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        served?;
        return Ok(());
    }
    let served = runtime.block_on(areal_serve::serve_generator(
        generator,
        config.rollout.max_new_tokens,
        listen,
        |addr| {
            // one line a launcher (or a user) can wait for
            println!("serving generator {name} on {addr}");
        },
        shutdown,
    ));
    // what is still running (a weight load a stalled client started) does not hold the exit
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served?;
    Ok(())
}

#[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
fn serve_reward(
    RewardArgs {
        listen: addr,
        common: args,
    }: RewardArgs,
) -> anyhow::Result<()> {
    let listen = listen(addr, &args)?;
    let (config, mut verifier) = areal_core::resolve_reward(&loader(&args.config)?)?;
    let _workers = areal_core::reward_workers::in_workers(&config, &mut verifier, None)?;
    let threads = config.reward_service.threads;
    let name = verifier.name().to_owned();
    // The async side only moves calls to and from the verifier threads: a server with one
    // verifier thread (a reward worker) needs one async thread, and a second would only add
    // wake-ups across threads on the cores the verifiers use.
    let runtime = crate::runtime_with(threads.min(2))?;
    let shutdown = {
        let _in_runtime = runtime.enter();
        shutdown(args.until_stdin_closes)
    };
    let served = runtime.block_on(areal_serve::serve_reward(
        verifier,
        &config.reward_service,
        listen,
        |addr| {
            // one line a launcher (or a user) can wait for
            println!("serving reward {name} on {addr} ({threads} threads)");
        },
        shutdown,
    ));
    // what is still running (a weight load a stalled client started) does not hold the exit
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served?;
    Ok(())
}

#[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
fn serve_tools(
    ToolsArgs {
        listen: addr,
        max_sessions,
        idle_s,
        threads,
        common: args,
    }: ToolsArgs,
) -> anyhow::Result<()> {
    if !(idle_s.is_finite() && idle_s > 0.0) {
        anyhow::bail!("--idle-s must be a positive number of seconds, found {idle_s}");
    }
    if max_sessions == 0 {
        anyhow::bail!("--max-sessions must be at least 1");
    }
    let listen = listen(addr, &args)?;
    let (_, tools) = areal_core::resolve_tools(&loader(&args.config)?)?;
    if tools.is_empty() {
        anyhow::bail!("the config has no [[tools]] to serve");
    }
    let names: Vec<String> = tools.iter().map(|t| t.schema().name).collect();
    let runtime = crate::runtime_with(threads.max(1))?;
    let shutdown = {
        let _in_runtime = runtime.enter();
        shutdown(args.until_stdin_closes)
    };
    let options = areal_serve::ToolServerOptions {
        max_sessions,
        idle: std::time::Duration::from_secs_f64(idle_s),
    };
    let served = runtime.block_on(areal_serve::serve_tools(
        tools,
        options,
        listen,
        |addr| {
            // one line a launcher (or a user) can wait for
            println!("serving tools {} on {addr}", names.join(", "));
        },
        shutdown,
    ));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served?;
    Ok(())
}
