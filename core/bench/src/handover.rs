//! `areal bench handover`: the time of one weight hand-over on disk to a server of SGLang's or
//! vLLM's HTTP API (`areal serve generator --api ...`, a child process running the burn
//! generator), for the built-in model and a random model with Qwen2.5-0.5B's exact
//! architecture: the checkpoint folder written, the server's load (the burn model built from
//! `config.json` and `model.safetensors`), and the version the server reports checked.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use areal_sdk::{Generator, WeightUpdate};
use areal_serve::{GeneratorFleet, GeneratorFleetOptions, InferenceApi};
use clap::Args;

use super::stats::median;

#[derive(Debug, Args)]
pub(crate) struct BenchHandoverArgs {
    /// The APIs to time.
    #[arg(long, value_delimiter = ',', default_value = "sglang,vllm")]
    apis: Vec<String>,
    /// Hand-overs timed per model and API (the table gives the median and the range).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Skip the random model of Qwen2.5-0.5B's size (about 2 GB in f32).
    #[arg(long)]
    skip_large: bool,
    /// Also write the report (markdown) to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A random model with Qwen2.5-0.5B's architecture, as the trainer hands it over.
fn qwen_update() -> anyhow::Result<WeightUpdate> {
    let config: areal_model::ModelConfig = serde_json::from_str(super::smoke::QWEN25_05B)?;
    config.check().map_err(|e| anyhow::anyhow!(e))?;
    let device = areal_sdk_train::burn::tensor::Device::flex();
    let model = areal_model::Transformer::new(&config, 5, &device);
    let tensors = areal_model::hf::export(&model);
    Ok(WeightUpdate::new(0, tensors).with_architecture(serde_json::to_value(&config)?))
}

/// The built-in job's model, as the trainer hands it over.
fn built_in_update() -> anyhow::Result<WeightUpdate> {
    let (config, plugins) = areal_core::resolve(&areal_core::ConfigLoader::new())?;
    drop(config);
    let weights = plugins.policy.weights();
    Ok(WeightUpdate::new(0, weights).with_architecture(plugins.policy.architecture()))
}

struct Row {
    write_ms: Vec<f64>,
    total_ms: Vec<f64>,
}

/// Time `rounds` hand-overs of `update` to one fresh server of `api`.
fn time_api(
    api: InferenceApi,
    update: &WeightUpdate,
    rounds: usize,
    logs: &std::path::Path,
) -> anyhow::Result<Row> {
    // a short context and few rows keep the server's cache small for the large model
    let args: Vec<OsString> = [
        "--api",
        api.name(),
        "--set",
        "generator.max_len=256",
        "--set",
        "generator.max_batch=4",
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    let (mut servers, urls) = crate::start_servers("generator", 1, &args, logs)?;
    let url = urls
        .into_iter()
        .next()
        .context("the server did not start")?;
    let dir = tempfile::tempdir_in(logs)?;
    let options: GeneratorFleetOptions = serde_json::from_value(serde_json::json!({
        "endpoints": [url],
        "weights_dir": dir.path(),
        "probe_interval_s": 0.05,
    }))?;
    let runtime = areal_cli::internal::runtime()?;
    let client = GeneratorFleet::new(api.name(), &options, None)?;
    let scratch = tempfile::tempdir_in(logs)?;
    let mut row = Row {
        write_ms: Vec::new(),
        total_ms: Vec::new(),
    };
    runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !client.report().contains("ready") {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the server never took work: {}",
                client.report()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // the first load builds the model and its cache: not timed
        for version in 0..=rounds as u64 {
            let update = WeightUpdate {
                version,
                ..update.clone()
            };
            // the write alone, to a folder of the same filesystem
            let started = Instant::now();
            areal_sdk_train::weights_file::write_safetensors(
                &scratch.path().join("model.safetensors"),
                &update.tensors,
                &Default::default(),
            )?;
            let write_ms = started.elapsed().as_secs_f64() * 1e3;
            let started = Instant::now();
            client.update_weights(update).await?;
            let total_ms = started.elapsed().as_secs_f64() * 1e3;
            anyhow::ensure!(
                client
                    .report()
                    .contains(&format!("holding version {version}")),
                "the server did not take version {version}: {}",
                client.report()
            );
            if version > 0 {
                row.write_ms.push(write_ms);
                row.total_ms.push(total_ms);
            }
        }
        Ok(())
    })?;
    drop(client);
    servers.stop();
    Ok(row)
}

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(super) fn run(args: BenchHandoverArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let apis = args
        .apis
        .iter()
        .map(|a| match a.as_str() {
            "sglang" => Ok(InferenceApi::Sglang),
            "vllm" => Ok(InferenceApi::Vllm),
            other => anyhow::bail!("--apis: {other:?} is neither sglang nor vllm"),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let scratch = tempfile::tempdir()?;
    let mut report = String::new();
    let mut emit = |line: String| {
        println!("{line}");
        let _ = writeln!(report, "{line}");
    };
    eprintln!(
        "one server (`areal serve generator --api ...`, the burn generator) on loopback; the \
         client writes each version as a checkpoint folder in a temporary directory, the server \
         loads it and reports the version; {} timed hand-overs per row after one untimed",
        args.rounds
    );
    let mut models: Vec<(&str, Arc<WeightUpdate>)> =
        vec![("built-in", Arc::new(built_in_update()?))];
    if !args.skip_large {
        eprintln!("making a random model with Qwen2.5-0.5B's architecture");
        models.push((
            "Qwen2.5-0.5B architecture, random",
            Arc::new(qwen_update()?),
        ));
    }
    emit("| model | parameters | MB (f32) | API | write folder (ms) | hand-over: write + load + version check (ms) | range (ms) |".into());
    emit("|---|---|---|---|---|---|---|".into());
    for (name, update) in &models {
        let params: usize = update.tensors.iter().map(|t| t.data.len()).sum();
        for &api in &apis {
            let row = time_api(api, update, args.rounds, scratch.path())
                .with_context(|| format!("the {name} model through the {} API", api.name()))?;
            let lo = row.total_ms.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = row.total_ms.iter().copied().fold(0.0, f64::max);
            emit(format!(
                "| {name} | {params} | {:.1} | {} | {:.1} | {:.1} | {lo:.1}–{hi:.1} |",
                params as f64 * 4.0 / 1e6,
                api.name(),
                median(&row.write_ms),
                median(&row.total_ms),
            ));
        }
    }
    if let Some(path) = &args.out {
        std::fs::write(path, &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
