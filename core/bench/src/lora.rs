//! `areal bench lora`: what LoRA adapters cost and save against full weights, for the built-in
//! model and the ~10 M and ~100 M configs of `areal bench model`:
//!
//! - a training step (forward, backward, AdamW on 8 sequences of 128 tokens): its time and the
//!   peak memory of a process doing nothing else (each measured in a child process of its own,
//!   `VmHWM`);
//! - one weight hand-over: its bytes and time in process (the burn generator), to 4 generator
//!   servers over gRPC (child processes on loopback) and to a server of SGLang's API over disk
//!   (a child process; the checkpoint or adapter folder written, loaded, its version checked);
//! - generation (32 sequences, 64 new tokens, the burn generator) with the adapter merged into
//!   the weights and beside them.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use areal_gen_burn::{AdapterMode, BurnGenerator, BurnGeneratorOptions};
use areal_model::{AdapterConfig, LoraOptions, ModelConfig, Transformer, TransformerPolicy};
use areal_sdk::{GenerateRequest, Generator, SamplingParams, WeightUpdate};
use areal_sdk_train::burn::optim::AdamWConfig;
use areal_sdk_train::burn::tensor::Device;
use areal_sdk_train::{PackedBatch, Policy};
use areal_serve::{GeneratorFleet, GeneratorFleetOptions};
use clap::Args;

use super::model::{config, ids};
use super::stats::median;
use areal_cli::internal::Servers;

#[derive(Debug, Args)]
pub(crate) struct BenchLoraArgs {
    /// Configs: `built-in 0.1M`, `10M`, `100M` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "built-in 0.1M,10M,100M")]
    configs: Vec<String>,
    /// The adapters' rank (on all seven projections).
    #[arg(long, default_value_t = 8)]
    rank: usize,
    /// Timed rounds per figure (the median is kept), after one untimed.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Also write the report (markdown) to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// (internal) Time training steps of one config here and print JSON: `CONFIG:RANK`
    /// (rank 0: full weights).
    #[arg(long, hide = true)]
    child: Option<String>,
}

fn adapter_config(rank: usize) -> AdapterConfig {
    AdapterConfig::from_options(&LoraOptions {
        rank,
        ..LoraOptions::default()
    })
    .expect("a valid rank")
}

/// A policy of `config` on `device`, with rank-`rank` adapters on (none: rank 0) whose `B` is
/// not zero, so that they change what the model computes.
fn policy(config: &ModelConfig, rank: usize, device: &Device) -> anyhow::Result<TransformerPolicy> {
    let tokenizer = areal_model::char_tokenizer("ab")?;
    let mut policy = TransformerPolicy::new(
        config.clone(),
        Transformer::new(config, 3, device),
        tokenizer,
        device.clone(),
    );
    if rank > 0 {
        let adapter = adapter_config(rank);
        // fresh adapters from a first policy (dropped before the second is built)
        let mut tensors = {
            let mut first = policy;
            first.set_lora(adapter.clone(), None, 4);
            first.start_rl()?;
            first.adapter().context("adapters are on")?.tensors
        };
        for t in tensors.iter_mut().filter(|t| t.name.contains("lora_B")) {
            for (i, v) in t.data.iter_mut().enumerate() {
                *v = ((i % 7) as f32 - 3.0) * 1e-3;
            }
        }
        policy = TransformerPolicy::new(
            config.clone(),
            Transformer::new(config, 3, device),
            areal_model::char_tokenizer("ab")?,
            device.clone(),
        );
        policy.set_lora(adapter, Some(tensors), 0);
        policy.start_rl()?;
    }
    Ok(policy)
}

/// The process's peak resident memory (`VmHWM`), in MiB.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// In a child: `rounds` training steps of `name` at `rank`, after one untimed; prints
/// `{"seconds": median, "peak_mib": ...}`.
#[allow(clippy::print_stdout, reason = "the child's answer is its stdout")]
fn child(spec: &str, rounds: usize) -> anyhow::Result<()> {
    let (name, rank) = spec.rsplit_once(':').context("--child CONFIG:RANK")?;
    let rank: usize = rank.parse()?;
    let config = config(name)?;
    let device = Device::flex().autodiff();
    let mut policy = policy(&config, rank, &device)?;
    let mut optimizer = AdamWConfig::new().init();
    let (batch, len) = (8, 128);
    let mut packed = PackedBatch::new(1.0);
    for s in ids(batch, len, config.vocab_size, 3).chunks(len) {
        packed.push(s);
    }
    let mut step = || -> anyhow::Result<f64> {
        let started = Instant::now();
        let loss = policy.logprobs(&packed)?.mean().neg();
        policy.backward(loss)?;
        policy.step(&mut optimizer, 1e-4, None)?;
        Ok(started.elapsed().as_secs_f64())
    };
    step()?;
    let times = (0..rounds)
        .map(|_| step())
        .collect::<anyhow::Result<Vec<_>>>()?;
    println!(
        "{}",
        serde_json::json!({ "seconds": median(&times), "peak_mib": peak_rss_mib() })
    );
    Ok(())
}

/// A training step of `name` at `rank` in a child process: (seconds, peak MiB).
fn train_in_child(name: &str, rank: usize, rounds: usize) -> anyhow::Result<(f64, f64)> {
    let exe = std::env::current_exe().context("cannot find the areal binary")?;
    let out = std::process::Command::new(exe)
        .args(["bench", "lora", "--rounds", &rounds.to_string(), "--child"])
        .arg(format!("{name}:{rank}"))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "the training child of {name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok((
        answer["seconds"].as_f64().unwrap_or(f64::NAN),
        answer["peak_mib"].as_f64().unwrap_or(f64::NAN),
    ))
}

/// Bytes an update sends: the adapter's, or every tensor's.
fn bytes(update: &WeightUpdate, full: bool) -> usize {
    let values = match (&update.adapter, full) {
        (Some(adapter), false) => adapter.len(),
        _ => update.tensors.iter().map(|t| t.data.len()).sum(),
    };
    values * 4
}

/// The median time of handing `updates` (after the first, untimed: it brings the base) to
/// `generator`, checking each version took.
async fn hand_over(generator: &dyn Generator, updates: &[WeightUpdate]) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    for (i, update) in updates.iter().enumerate() {
        let started = Instant::now();
        generator.update_weights(update.clone()).await?;
        if i > 0 {
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(median(&times))
}

/// `rounds + 1` updates of the policy at versions `from..`: the same weights (or base and
/// adapter), a new version each.
fn versions(policy: &TransformerPolicy, rounds: usize, full: bool, from: u64) -> Vec<WeightUpdate> {
    let first = if full {
        WeightUpdate::new(0, policy.weights()).with_architecture(policy.architecture())
    } else {
        policy.weight_update(0)
    };
    (from..=from + rounds as u64)
        .map(|version| WeightUpdate {
            version,
            ..first.clone()
        })
        .collect()
}

fn burn(adapters: AdapterMode) -> anyhow::Result<BurnGenerator> {
    let options = BurnGeneratorOptions {
        max_batch: 32,
        max_len: Some(128),
        adapters,
        ..BurnGeneratorOptions::default()
    };
    Ok(BurnGenerator::new(&options, Device::flex())?)
}

/// Start `n` servers of `areal serve generator` with `args`; their URLs.
fn servers(n: usize, args: &[&str], logs: &Path) -> anyhow::Result<(Servers, Vec<String>)> {
    let mut args: Vec<OsString> = args.iter().map(OsString::from).collect();
    for set in ["generator.max_len=128", "generator.max_batch=4"] {
        args.extend(["--set".into(), set.into()]);
    }
    crate::start_servers("generator", n, &args, logs)
}

fn fleet(
    kind: &str,
    urls: Vec<String>,
    weights_dir: Option<&Path>,
) -> anyhow::Result<GeneratorFleet> {
    let options: GeneratorFleetOptions = serde_json::from_value(serde_json::json!({
        "endpoints": urls,
        "weights_dir": weights_dir,
        "probe_interval_s": 0.05,
    }))?;
    Ok(GeneratorFleet::new(kind, &options, None)?)
}

async fn ready(fleet: &GeneratorFleet, servers: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while fleet.report().matches("ready").count() < servers {
        anyhow::ensure!(
            Instant::now() < deadline,
            "servers never took work: {}",
            fleet.report()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Tokens per second of 32 sequences of 64 new tokens on `generator`.
async fn generation(generator: &BurnGenerator, vocab: usize) -> anyhow::Result<f64> {
    let requests: Vec<GenerateRequest> = (0..32u64)
        .map(|i| GenerateRequest {
            sample_id: i,
            input_ids: ids(1, 16, vocab, i + 10),
            max_new_tokens: 64,
            sampling: SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                seed: i,
            },
            stop_token_ids: vec![],
        })
        .collect();
    let started = Instant::now();
    let mut tokens = 0;
    for c in generator.generate_batch(requests).await {
        tokens += c?.len();
    }
    Ok(tokens as f64 / started.elapsed().as_secs_f64())
}

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(super) fn run(args: BenchLoraArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    anyhow::ensure!(args.rank >= 1, "--rank must be at least 1");
    if let Some(spec) = &args.child {
        return child(spec, args.rounds);
    }
    let rank = args.rank;
    let scratch = tempfile::tempdir()?;
    let runtime = areal_cli::internal::runtime()?;
    let mut report = String::new();
    let mut emit = |line: String| {
        println!("{line}");
        let _ = writeln!(report, "{line}");
    };
    emit(format!(
        "LoRA rank {rank} on all seven projections against full weights; burn's CPU backend, {} threads; medians of {} rounds",
        rayon::current_num_threads(),
        args.rounds
    ));
    emit(String::new());
    let mut training = Vec::new();
    let mut handover = Vec::new();
    let mut decoding = Vec::new();
    for name in &args.configs {
        let config = config(name)?;
        eprintln!("{name}: training steps (child processes)");
        let (full_s, full_mib) = train_in_child(name, 0, args.rounds)?;
        let (lora_s, lora_mib) = train_in_child(name, rank, args.rounds)?;
        training.push(format!(
            "| {name} | {} | {:.3} | {:.3} | {:.2}× | {:.0} | {:.0} | {:.2}× |",
            config.num_parameters(),
            full_s,
            lora_s,
            lora_s / full_s,
            full_mib,
            lora_mib,
            lora_mib / full_mib
        ));

        let device = Device::flex();
        let policy = policy(&config, rank, &device)?;
        let full = versions(&policy, args.rounds, true, 0);
        let adapted = versions(&policy, args.rounds, false, args.rounds as u64 + 1);
        let (full_bytes, adapter_bytes) = (bytes(&full[0], true), bytes(&adapted[0], false));
        // in process: the update built (export) and loaded by the burn generator
        eprintln!("{name}: hand-overs in process");
        let in_process = |updates: &[WeightUpdate], full: bool| -> anyhow::Result<f64> {
            let generator = burn(AdapterMode::Merged)?;
            runtime.block_on(async {
                let mut times = Vec::new();
                for (i, u) in updates.iter().enumerate() {
                    let started = Instant::now();
                    // what the trainer does each step: export, then hand over
                    let update = if full {
                        WeightUpdate::new(u.version, policy.weights())
                            .with_architecture(policy.architecture())
                    } else {
                        policy.weight_update(u.version)
                    };
                    generator.update_weights(update).await?;
                    if i > 0 {
                        times.push(started.elapsed().as_secs_f64() * 1e3);
                    }
                }
                Ok(median(&times))
            })
        };
        let (full_in, lora_in) = (in_process(&full, true)?, in_process(&adapted, false)?);
        eprintln!("{name}: hand-overs to 4 gRPC servers");
        let (servers_grpc, urls) = servers(4, &[], scratch.path())?;
        let (full_grpc, lora_grpc) = runtime.block_on(async {
            let remote = fleet("remote", urls, None)?;
            ready(&remote, 4).await?;
            let full_ms = hand_over(&remote, &full).await?;
            let lora_ms = hand_over(&remote, &adapted).await?;
            Ok::<_, anyhow::Error>((full_ms, lora_ms))
        })?;
        drop(servers_grpc);
        eprintln!("{name}: hand-overs to an SGLang-API server over disk");
        let (servers_api, urls) = servers(1, &["--api", "sglang"], scratch.path())?;
        let disk = tempfile::tempdir_in(scratch.path())?;
        let (full_api, lora_api) = runtime.block_on(async {
            let api = fleet("sglang", urls, Some(disk.path()))?;
            ready(&api, 1).await?;
            let full_ms = hand_over(&api, &full).await?;
            let lora_ms = hand_over(&api, &adapted).await?;
            Ok::<_, anyhow::Error>((full_ms, lora_ms))
        })?;
        drop(servers_api);
        handover.push(format!(
            "| {name} | {:.2} | {:.3} | {:.2}% | {full_in:.1} / {lora_in:.1} | {full_grpc:.1} / {lora_grpc:.1} | {full_api:.1} / {lora_api:.1} |",
            full_bytes as f64 / 1e6,
            adapter_bytes as f64 / 1e6,
            100.0 * adapter_bytes as f64 / full_bytes as f64,
        ));

        eprintln!("{name}: generation merged and unmerged");
        let mut speeds = Vec::new();
        for mode in [AdapterMode::Merged, AdapterMode::Unmerged] {
            let generator = burn(mode)?;
            let update = Arc::new(adapted[0].clone());
            let tps = runtime.block_on(async {
                generator.update_weights((*update).clone()).await?;
                generation(&generator, config.vocab_size).await?;
                let mut tps = Vec::new();
                for _ in 0..args.rounds {
                    tps.push(generation(&generator, config.vocab_size).await?);
                }
                Ok::<_, anyhow::Error>(median(&tps))
            })?;
            speeds.push(tps);
        }
        decoding.push(format!(
            "| {name} | {:.0} | {:.0} | {:.2}× |",
            speeds[0],
            speeds[1],
            speeds[1] / speeds[0]
        ));
    }
    emit("Training step (8 × 128 tokens, forward + backward + AdamW; peak memory of a process doing only that):".into());
    emit(String::new());
    emit(format!(
        "| config | parameters | full (s) | rank {rank} (s) | ratio | full peak (MiB) | rank {rank} peak (MiB) | ratio |"
    ));
    emit("|---|---:|---:|---:|---:|---:|---:|---:|".into());
    training.into_iter().for_each(&mut emit);
    emit(String::new());
    emit("One weight hand-over, full weights / adapter only (ms; after a first update that brings the base):".into());
    emit(String::new());
    emit("| config | full (MB) | adapter (MB) | adapter ÷ full | in process | 4 gRPC servers | SGLang API over disk |".into());
    emit("|---|---:|---:|---:|---:|---:|---:|".into());
    handover.into_iter().for_each(&mut emit);
    emit(String::new());
    emit(
        "Generation with the adapter (burn generator, 32 sequences × 64 new tokens, tokens/s):"
            .into(),
    );
    emit(String::new());
    emit("| config | merged | unmerged | unmerged ÷ merged |".into());
    emit("|---|---:|---:|---:|".into());
    decoding.into_iter().for_each(&mut emit);
    if let Some(path) = &args.out {
        std::fs::write(path, &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
