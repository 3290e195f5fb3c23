//! `areal bench`: measured tables, never pass/fail. One module per bench (`areal bench --help`
//! lists them, each with what it measures); every bench that trains builds its runs through
//! [`areal_core::resolve`], as `areal train` does; their statistics come from `stats`.
//!
//! A crate of its own, linked by the `areal` binary only (as an [`areal_cli::Extension`]), so
//! that a user's own binary links no benchmark code.

use clap::Subcommand;

mod async_vs_sync;
mod audit;
mod controller;
mod fleet;
mod handover;
mod heavy;
mod lora;
mod math;
mod model;
mod proxy;
mod resume;
mod reward;
mod sandbox;
mod smoke;
mod stats;
mod tools;

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Grade reference solutions in the wasm sandbox (on threads of this process, and in
    /// worker processes) and with native Python (a fresh process per problem, and per test)
    /// at each count; print latency, throughput, start-up and execution time, the ratios and
    /// the scaling; `--set heavy` for CPU-heavy programs and their wasm ÷ native time each.
    Sandbox(sandbox::BenchSandboxArgs),
    /// The engine alone: the controller, rollout workflows, reward service, buffer and trainer
    /// loop on the testkit's near-zero-cost plugins (a bigram model, one generated token per
    /// rollout), with thousands of rollouts in flight; prints rollouts per second.
    Controller(controller::BenchControllerArgs),
    /// One trainer driving N generator servers (child processes on loopback, each the
    /// testkit bigram generator with a per-token delay standing for a GPU's decode step):
    /// rollout throughput against N × one server's; and the time to push one weight update
    /// to N servers for the built-in model and a random model of 0.5 B parameters.
    Fleet(fleet::BenchFleetArgs),
    /// The time of one weight hand-over on disk to a server of SGLang's or vLLM's HTTP API
    /// (`areal serve generator --api ...`): the checkpoint folder written, loaded by the
    /// server and its version checked, for the built-in model and a random model with
    /// Qwen2.5-0.5B's architecture.
    Handover(handover::BenchHandoverArgs),
    /// A real-size smoke test: a random model with Qwen2.5-0.5B's exact config built, saved,
    /// loaded, generating with the burn generator, one RL step (backward, AdamW) and saved
    /// again; the time of each part and the memory after it.
    Smoke(smoke::BenchSmokeArgs),
    /// The transformer in burn's CPU backend against PyTorch eager on the same configs (the
    /// built-in 0.1 M model, ~10 M and ~100 M parameters): prefill and cached-decode tokens/s
    /// at batch 1 and 32, training tokens/s (forward, backward, AdamW).
    Model(model::BenchModelArgs),
    /// Asynchronous against synchronous RL on real workloads: time to a target accuracy,
    /// final accuracy, how busy each side is, for η = 0 (synchronous) and η > 0 over seeds,
    /// plus the naive-PPO staleness ablation; writes results.json, plots and a table.
    AsyncVsSync(async_vs_sync::AsyncVsSyncArgs),
    /// Real batches of the built-in job with several mini-batches and η > 0, recorded as the
    /// algorithm receives them, for `plugins/algo-ppo/tests/fixtures/audit.py` to check each
    /// PPO variant's loss and gradient against numpy's Eq. 5; checks the proximal recompute
    /// (π_θ = π_prox in each step's first mini-batch, not after).
    AuditObjective(audit::BenchAuditArgs),
    /// The maths verifier on MATH-500 answers: verifications per second at each thread count
    /// on pairs that are equal but written differently and on perturbed (unequal) pairs, with
    /// Math-Verify (Python) on the same pairs when it is installed.
    Math(math::BenchMathArgs),
    /// A job killed K times at random moments (SIGKILL) and resumed each time, against the
    /// same job left alone, in deterministic mode and by default: final weights' sha256,
    /// samples lost or trained twice, steps trained again; and the time and size of one
    /// checkpoint for the job's model and a ~10 M-parameter one.
    Resume(resume::BenchResumeArgs),
    /// What a reward costs per sample in each form — compiled in, a WASM component, a Python
    /// file in the sandbox, the same Python function in a native process — at each thread
    /// count, on the built-in task's samples: latency, throughput, the ratios.
    Reward(reward::BenchRewardArgs),
    /// What an agent's `python` tool call costs: a call in a session (one sandboxed
    /// interpreter kept alive, its names persisting to the next call) against a fresh
    /// `python3` process per call, for a trivial call and a ~50 ms computation: p50, p99.
    Tools(tools::BenchToolsArgs),
    /// What the agent proxy costs: a turn's latency over loopback against the generator
    /// alone, sessions per second at 1, 8 and 64 concurrent agents, and a burst of
    /// `/rl/start_session` past what the run admits (429s with Retry-After).
    Proxy(proxy::BenchProxyArgs),
    /// LoRA adapters against full weights for the built-in model and the ~10 M and ~100 M
    /// configs: a training step's time and peak memory, one weight hand-over's bytes and
    /// time (in process, to 4 gRPC servers, to an SGLang-API server over disk), generation
    /// with the adapter merged and unmerged.
    Lora(lora::BenchLoraArgs),
}

fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Sandbox(args) => sandbox::run(args),
        BenchCommand::Controller(args) => controller::run(args),
        BenchCommand::Fleet(args) => fleet::run(args),
        BenchCommand::Handover(args) => handover::run(args),
        BenchCommand::Smoke(args) => smoke::run(args),
        BenchCommand::Model(args) => model::run(args),
        BenchCommand::AsyncVsSync(args) => async_vs_sync::run(args),
        BenchCommand::AuditObjective(args) => audit::run(args),
        BenchCommand::Math(args) => math::run(args),
        BenchCommand::Resume(args) => resume::run(args),
        BenchCommand::Reward(args) => reward::run(args),
        BenchCommand::Tools(args) => tools::run(args),
        BenchCommand::Proxy(args) => proxy::run(args),
        BenchCommand::Lora(args) => lora::run(args),
    }
}

/// Print a bench's `report` (markdown) and write it to `markdown` when given.
#[allow(clippy::print_stdout, reason = "results on stdout")]
fn publish(report: &str, markdown: Option<&std::path::Path>) -> anyhow::Result<()> {
    use anyhow::Context;
    println!("{report}");
    if let Some(path) = markdown {
        std::fs::write(path, report).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Start `n` servers of `areal serve KIND` (this binary) with `args`, their logs in `logs`;
/// the servers and their URLs, once every one listens.
fn start_servers(
    kind: &'static str,
    n: usize,
    args: &[std::ffi::OsString],
    logs: &std::path::Path,
) -> anyhow::Result<(areal_cli::internal::Servers, Vec<String>)> {
    use anyhow::Context;
    let exe = std::env::current_exe().context("cannot find the areal binary")?;
    let mut servers = areal_cli::internal::Servers::default();
    for _ in 0..n {
        servers.start(&exe, kind, args, logs)?;
    }
    let urls = servers
        .wait_listening(std::time::Duration::from_secs(300))?
        .into_iter()
        .map(|(_, url)| url)
        .collect();
    Ok((servers, urls))
}

/// `areal bench` as a command of the `areal` command line.
pub fn extension() -> areal_cli::Extension {
    use clap::{FromArgMatches, Subcommand as _};
    areal_cli::Extension {
        command: || {
            BenchCommand::augment_subcommands(
                clap::Command::new("bench")
                    .about("Benchmarks that print tables (areal bench --help lists each, with what it measures)")
                    .subcommand_required(true)
                    .arg_required_else_help(true),
            )
        },
        run: |matches| run(BenchCommand::from_arg_matches(matches)?),
    }
}
