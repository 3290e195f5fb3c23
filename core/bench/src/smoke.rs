//! `areal bench smoke`: a real-size smoke test. A random model with Qwen2.5-0.5B's exact
//! config is built, saved, loaded, generates with the burn generator, takes one RL step
//! (decoupled PPO's loss on its own samples, backward, AdamW) and is saved again; the time of
//! each part and the process's memory after it are printed.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use areal_model::{ModelConfig, Transformer, TransformerPolicy};
use areal_sdk::{GenerateRequest, Generator, SamplingParams, WeightUpdate};
use areal_sdk_train::burn::optim::AdamWConfig;
use areal_sdk_train::burn::tensor::Device;
use areal_sdk_train::{PackedBatch, Policy};
use clap::Args;

#[derive(Debug, Args)]
pub(crate) struct BenchSmokeArgs {
    /// Tokens each of the two samples generates.
    #[arg(long, default_value_t = 16)]
    new_tokens: usize,
    /// Where to save the checkpoints (a temporary folder by default); about 2 GB each.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Also write the report (markdown) to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Qwen2.5-0.5B's `config.json`, as released (the fields the model reads).
pub(crate) const QWEN25_05B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_size": 896, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 151936,
  "use_sliding_window": false
}"#;

/// This process's resident memory now and at its peak, in GB (Linux; 0 elsewhere).
fn memory_gb() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1e6)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(super) fn run(args: BenchSmokeArgs) -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| scratch.path().to_owned());
    let mut report = String::new();
    let mut emit = |line: String| {
        println!("{line}");
        let _ = writeln!(report, "{line}");
    };
    let mut rows: Vec<(String, f64, String)> = Vec::new();
    let mut time = |what: &str, started: Instant, detail: String| {
        let seconds = started.elapsed().as_secs_f64();
        let (rss, peak) = memory_gb();
        eprintln!("{what}: {seconds:.1} s, {rss:.1} GB resident (peak {peak:.1} GB) {detail}");
        rows.push((what.to_owned(), seconds, format!("{rss:.1} / {peak:.1}")));
    };

    let config: ModelConfig = serde_json::from_str(QWEN25_05B)?;
    config.check().map_err(|e| anyhow::anyhow!(e))?;
    let device = Device::flex().autodiff();
    let started = Instant::now();
    let tokenizer = areal_model::char_tokenizer("0123456789+=, abcdefghijklmnopqrstuvwxyz")?;
    let model = Transformer::new(&config, 7, &device);
    let policy = TransformerPolicy::new(config.clone(), model, tokenizer, device.clone());
    let params: usize = policy.weights().iter().map(|t| t.data.len()).sum();
    time(
        "build (random weights)",
        started,
        format!("{params} parameters"),
    );

    let first = dir.join("checkpoint-0");
    let started = Instant::now();
    policy.save(&first).context("saving")?;
    let bytes: u64 = std::fs::read_dir(&first)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    time("save", started, format!("{:.2} GB", bytes as f64 / 1e9));

    drop(policy);
    let started = Instant::now();
    let mut policy = TransformerPolicy::load(&first, &device).context("loading")?;
    time("load", started, String::new());

    let started = Instant::now();
    let generator = areal_gen_burn::BurnGenerator::new(
        &areal_gen_burn::BurnGeneratorOptions {
            max_batch: 2,
            max_len: Some(128),
            ..Default::default()
        },
        Device::flex(),
    )?;
    let runtime = areal_cli::internal::runtime()?;
    let update = WeightUpdate::new(0, policy.weights()).with_architecture(policy.architecture());
    let tokenizer = policy.tokenizer();
    let prompt = tokenizer.encode("12+34=")?;
    let completions = runtime.block_on(async {
        generator.update_weights(update).await?;
        let requests = (0..2).map(|i| GenerateRequest {
            sample_id: i,
            input_ids: prompt.clone(),
            max_new_tokens: args.new_tokens,
            sampling: SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                seed: i,
            },
            stop_token_ids: Vec::new(),
        });
        let mut out = Vec::new();
        for r in generator.generate_batch(requests.collect()).await {
            out.push(r?);
        }
        Ok::<_, areal_sdk::PluginError>(out)
    })?;
    let generated: usize = completions.iter().map(|c| c.len()).sum();
    let seconds = started.elapsed().as_secs_f64();
    time(
        "generate (load into the burn generator, 2 samples)",
        started,
        format!(
            "{generated} tokens, {:.1} tokens/s overall",
            generated as f64 / seconds
        ),
    );
    drop(generator);

    let started = Instant::now();
    let mut batch = PackedBatch::new(1.0);
    for c in &completions {
        let mut sequence = prompt.clone();
        sequence.extend(&c.token_ids);
        batch.push(&sequence);
    }
    let logprobs = policy.logprobs(&batch)?;
    // the policy-gradient loss of the two samples with advantages ±1
    let n = logprobs.dims()[0];
    let signs: Vec<f32> = (0..n).map(|i| if i < n / 2 { 1.0 } else { -1.0 }).collect();
    let signs = areal_sdk_train::burn::tensor::Tensor::<1>::from_data(
        areal_sdk_train::burn::tensor::TensorData::new(signs, [n]),
        &device,
    );
    let loss = (logprobs * signs).mean().neg();
    policy.backward(loss)?;
    let mut optimizer = AdamWConfig::new().init();
    let stats = policy.step(&mut optimizer, 1e-6, Some(1.0))?;
    time(
        "one RL step (forward, backward, AdamW)",
        started,
        format!("{n} tokens, {stats:?}"),
    );

    let second = dir.join("checkpoint-1");
    let started = Instant::now();
    policy.save(&second).context("saving again")?;
    time("save again", started, String::new());

    let (_, peak) = memory_gb();
    emit(format!(
        "Qwen2.5-0.5B's config, random weights: {params} parameters, f32; peak resident memory {peak:.1} GB"
    ));
    emit(String::new());
    emit("| part | seconds | resident / peak GB after it |".into());
    emit("|---|---:|---|".into());
    for (what, seconds, memory) in &rows {
        emit(format!("| {what} | {seconds:.1} | {memory} |"));
    }
    if let Some(path) = &args.out {
        std::fs::write(path, &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
