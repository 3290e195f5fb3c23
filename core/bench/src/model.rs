//! `areal bench model`: the transformer in burn's CPU backend on the work
//! `plugins/model/scripts/bench_pytorch.py` times in PyTorch eager, with the same configs:
//! prefill (one forward pass over B prompts of 128 tokens), cached decoding (B sequences
//! prefilled with 16 tokens, then 32 one-token steps with the key/value cache), and training
//! (forward, backward and an AdamW step on 8 sequences of 128 tokens). With `--pytorch F` (that
//! script's `--out`), each row gets PyTorch's figure and the ratio.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use areal_model::{LayerKv, ModelConfig, Transformer, TransformerPolicy};
use areal_sdk_train::burn::optim::AdamWConfig;
use areal_sdk_train::burn::tensor::{Device, Int, Tensor, TensorData};
use areal_sdk_train::{PackedBatch, Policy};
use clap::Args;

use super::stats::median;

#[derive(Debug, Args)]
pub(crate) struct BenchModelArgs {
    /// Configs to time: `built-in 0.1M`, `10M`, `100M` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "built-in 0.1M,10M,100M")]
    configs: Vec<String>,
    /// Work to time: `prefill`, `decode`, `training` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "prefill,decode,training")]
    work: Vec<String>,
    /// Timed rounds per figure (the median is kept), after one warm-up round.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// PyTorch's figures (`bench_pytorch.py --out`), for the ratio column.
    #[arg(long)]
    pytorch: Option<PathBuf>,
    /// Also write the report (markdown) to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `(vocab, hidden, layers, heads, kv_heads, intermediate, max_positions)`, as in
/// `bench_pytorch.py`.
fn shape(name: &str) -> Option<(usize, usize, usize, usize, usize, usize, usize)> {
    match name {
        "built-in 0.1M" => Some((56, 64, 2, 4, 2, 176, 256)),
        "10M" => Some((8192, 256, 10, 8, 4, 688, 512)),
        "100M" => Some((32000, 768, 12, 12, 4, 2048, 512)),
        _ => None,
    }
}

pub(crate) fn config(name: &str) -> anyhow::Result<ModelConfig> {
    let (v, d, l, h, kv, f, p) =
        shape(name).with_context(|| format!("--configs: no config named {name:?}"))?;
    let mut c = ModelConfig::small(v, d, l, h, kv, p);
    c.intermediate_size = f;
    c.check().map_err(|e| anyhow::anyhow!(e))?;
    Ok(c)
}

/// `batch × len` token ids below `vocab`, the same for the same `seed`.
pub(crate) fn ids(batch: usize, len: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..batch * len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab as u64) as u32
        })
        .collect()
}

fn tokens(ids: &[u32], batch: usize, device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    let len = ids.len() / batch;
    Tensor::from_data(TensorData::new(data, [batch, len]), device)
}

/// The median of `rounds` timings of `f`, after one untimed call.
fn timed(rounds: usize, mut f: impl FnMut() -> f64) -> f64 {
    f();
    median(&(0..rounds).map(|_| f()).collect::<Vec<_>>())
}

fn sync(t: Tensor<2>) {
    // reading one value waits for the computation
    let _ = t.slice([0..1, 0..1]).into_data();
}

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(super) fn run(args: BenchModelArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    for work in &args.work {
        anyhow::ensure!(
            ["prefill", "decode", "training"].contains(&work.as_str()),
            "--work: no work named {work:?} (prefill, decode, training)"
        );
    }
    let wants = |work: &str| args.work.iter().any(|w| w == work);
    let pytorch: BTreeMap<(String, String, usize), f64> = match &args.pytorch {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let r: serde_json::Value = serde_json::from_str(l)?;
                Ok((
                    (
                        r["config"].as_str().unwrap_or_default().to_owned(),
                        r["what"].as_str().unwrap_or_default().to_owned(),
                        r["batch"].as_u64().unwrap_or_default() as usize,
                    ),
                    r["tokens_per_s"].as_f64().unwrap_or_default(),
                ))
            })
            .collect::<anyhow::Result<_>>()?,
        None => BTreeMap::new(),
    };
    let threads = rayon::current_num_threads();
    let mut report = String::new();
    let mut emit = |line: String| {
        println!("{line}");
        let _ = writeln!(report, "{line}");
    };
    emit(format!(
        "burn {} (flex CPU backend, f32, {threads} threads) against PyTorch eager ({})",
        "0.22",
        if pytorch.is_empty() {
            "not given"
        } else {
            "bench_pytorch.py"
        }
    ));
    emit(String::new());
    emit("| config | parameters | work | batch | burn tokens/s | PyTorch tokens/s | burn ÷ PyTorch |".into());
    emit("|---|---:|---|---:|---:|---:|---:|".into());
    for name in &args.configs {
        let config = config(name)?;
        let vocab = config.vocab_size;
        let device = Device::flex();
        let model = Transformer::new(&config, 3, &device);
        let params = config.num_parameters();
        let mut row = |what: &str, batch: usize, tokens_per_s: f64| {
            let theirs = pytorch
                .get(&(name.clone(), what.to_owned(), batch))
                .copied();
            emit(format!(
                "| {name} | {params} | {what} | {batch} | {tokens_per_s:.0} | {} | {} |",
                theirs.map_or("–".into(), |t| format!("{t:.0}")),
                theirs.map_or("–".into(), |t| format!("{:.2}×", tokens_per_s / t)),
            ));
        };
        for batch in [1, 32].into_iter().filter(|_| wants("prefill")) {
            let input = tokens(&ids(batch, 128, vocab, 1), batch, &device);
            let s = timed(args.rounds, || {
                let started = Instant::now();
                let logits = model.forward(input.clone());
                let [b, t, v] = logits.dims();
                sync(logits.reshape([b * t, v]));
                started.elapsed().as_secs_f64()
            });
            row("prefill", batch, (batch * 128) as f64 / s);
        }
        for batch in [1, 32].into_iter().filter(|_| wants("decode")) {
            let prompt = ids(batch, 16, vocab, 2);
            let steps = 32;
            let s = timed(args.rounds, || {
                let (logits, kvs) = model.forward_with_kv(tokens(&prompt, batch, &device));
                let mut cache: Vec<LayerKv> = kvs
                    .into_iter()
                    .map(|kv| kv.with_capacity(16 + steps + 1))
                    .collect();
                let mut next = logits
                    .slice([0..batch, 15..16, 0..vocab])
                    .argmax(2)
                    .reshape([batch, 1]);
                let started = Instant::now();
                for step in 0..steps {
                    let positions = vec![16 + step; batch];
                    let out = model.decode_step(next, &positions, &mut cache);
                    next = out.argmax(1).reshape([batch, 1]);
                }
                let _ = next.into_data();
                started.elapsed().as_secs_f64()
            });
            row("cached decode", batch, (batch * steps) as f64 / s);
        }
        if !wants("training") {
            eprintln!("{name}: done");
            continue;
        }
        let autodiff = Device::flex().autodiff();
        let tokenizer = areal_model::char_tokenizer("ab")?;
        let mut policy = TransformerPolicy::new(
            config.clone(),
            Transformer::new(&config, 3, &autodiff),
            tokenizer,
            autodiff.clone(),
        );
        let mut optimizer = AdamWConfig::new().init();
        let (batch, len) = (8, 128);
        let sequences = ids(batch, len, vocab, 3);
        let mut packed = PackedBatch::new(1.0);
        for s in sequences.chunks(len) {
            packed.push(s);
        }
        let s = timed(args.rounds, || {
            let started = Instant::now();
            let loss = policy.logprobs(&packed).expect("logprobs").mean().neg();
            policy.backward(loss).expect("backward");
            policy.step(&mut optimizer, 1e-5, None).expect("step");
            started.elapsed().as_secs_f64()
        });
        row("training", batch, (batch * len) as f64 / s);
        eprintln!("{name}: done");
    }
    if let Some(path) = &args.out {
        std::fs::write(path, &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
