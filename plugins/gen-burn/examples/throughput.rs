//! Training and decoding throughput of the transformer on burn's CPU backends, as a table:
//!
//! ```sh
//! cargo run --release -p areal-gen-burn --example throughput                      # flex only
//! cargo run --release -p areal-gen-burn --features ndarray --example throughput   # flex and ndarray
//! cargo run --release -p areal-gen-burn --features openblas --example throughput  # ndarray on OpenBLAS
//! cargo run --release -p areal-gen-burn --example throughput -- 128 4 16 64       # hidden layers batch len
//! ```
//!
//! The default shape is the built-in job's model (hidden 64, 2 layers) on sequences of its
//! typical length. Each backend is measured on a pool of one thread and on one of every core
//! (`train.threads`, `generator.threads`).

use std::sync::Arc;
use std::time::Instant;

use areal_gen_burn::{BurnGenerator, BurnGeneratorOptions};
use areal_model::{TransformerOptions, TransformerPolicy};
use areal_sdk::{GenerateRequest, Generator, SamplingParams, WeightUpdate};
use areal_sdk_train::burn::optim::AdamWConfig;
use areal_sdk_train::burn::tensor::Device;
use areal_sdk_train::{PackedBatch, Policy};

/// The CPU backends this build has.
fn backends() -> Vec<(&'static str, Device)> {
    #[allow(unused_mut, reason = "pushed to only with the ndarray features")]
    let mut list = vec![("flex", Device::flex())];
    #[cfg(all(feature = "ndarray", not(feature = "openblas")))]
    #[allow(
        deprecated,
        reason = "burn's ndarray backend is deprecated; it is measured for comparison"
    )]
    list.push(("ndarray", Device::ndarray()));
    #[cfg(feature = "openblas")]
    #[allow(
        deprecated,
        reason = "burn's ndarray backend is deprecated; it is measured for comparison"
    )]
    list.push(("ndarray + OpenBLAS", Device::ndarray()));
    list
}

/// Measurements per backend and thread count; the table shows their medians.
const ROUNDS: usize = 5;

struct Shape {
    hidden: usize,
    layers: usize,
    batch: usize,
    len: usize,
}

/// Tokens per second of a training step (forward, backward, AdamW) and of batched decoding at
/// batch 1 and at `shape.batch`.
fn measure(shape: &Shape, device: &Device, threads: usize) -> (f64, f64, f64) {
    let options = TransformerOptions {
        hidden_size: shape.hidden,
        layers: shape.layers,
        heads: 4,
        kv_heads: 2,
        max_positions: 256,
        ..TransformerOptions::default()
    };
    let alphabet = "0123456789+-*=,; \n";
    let mut policy = TransformerPolicy::fresh(&options, alphabet, 1, &device.clone().autodiff())
        .expect("a fresh model");
    let mut batch = PackedBatch::new(1.0);
    for i in 0..shape.batch {
        batch.push(
            &(0..shape.len)
                .map(|t| ((i + t) % 18) as u32 + 2)
                .collect::<Vec<_>>(),
        );
    }
    let mut optimizer = AdamWConfig::new().init();
    let mut train = 0.0;
    for (steps, timed) in [(1, false), (5, true)] {
        let start = Instant::now();
        for _ in 0..steps {
            let loss = policy.logprobs(&batch).expect("logprobs").sum().neg();
            policy.backward(loss).expect("backward");
            policy.step(&mut optimizer, 1e-3, Some(1.0)).expect("step");
        }
        if timed {
            train = (shape.batch * shape.len * steps) as f64 / start.elapsed().as_secs_f64();
        }
    }
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let decode = |max_batch: usize| {
        runtime.block_on(async {
            let g = Arc::new(
                BurnGenerator::new(
                    &BurnGeneratorOptions {
                        max_batch,
                        max_len: None,
                        threads,
                        ..BurnGeneratorOptions::default()
                    },
                    device.clone(),
                )
                .expect("a generator"),
            );
            g.update_weights(
                WeightUpdate::new(0, policy.weights()).with_architecture(policy.architecture()),
            )
            .await
            .expect("weights");
            let start = Instant::now();
            let mut calls = Vec::new();
            for i in 0..max_batch.max(4) {
                let g = g.clone();
                let r = GenerateRequest {
                    sample_id: i as u64,
                    input_ids: vec![2, 3, 4, 5],
                    max_new_tokens: shape.len,
                    sampling: SamplingParams {
                        temperature: 1.0,
                        top_p: 1.0,
                        seed: 1,
                    },
                    stop_token_ids: vec![],
                };
                calls.push(tokio::spawn(async move {
                    g.generate(r).await.expect("generate").len()
                }));
            }
            let mut tokens = 0;
            for c in calls {
                tokens += c.await.expect("task");
            }
            tokens as f64 / start.elapsed().as_secs_f64()
        })
    };
    let one = decode(1);
    let many = decode(shape.batch);
    (train, one, many)
}

#[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .expect("arguments are numbers: hidden layers batch len")
        })
        .collect();
    let shape = match args[..] {
        [hidden, layers, batch, len] => Shape {
            hidden,
            layers,
            batch,
            len,
        },
        _ => Shape {
            hidden: 64,
            layers: 2,
            batch: 32,
            len: 64,
        },
    };
    println!(
        "model: hidden {}, {} layers; train batch {} × {} tokens; decode {} new tokens per sequence; median of {ROUNDS}",
        shape.hidden, shape.layers, shape.batch, shape.len, shape.len
    );
    println!(
        "| backend | threads | train tokens/s | decode tokens/s, batch 1 | decode tokens/s, batch {} |",
        shape.batch
    );
    println!("|---|---|---|---|---|");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut counts = vec![1, cores];
    counts.dedup();
    for (name, device) in backends() {
        for &threads in &counts {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            // single passes swing by ±20% on a small shared machine: the median of 5
            let mut runs: Vec<(f64, f64, f64)> = (0..ROUNDS)
                .map(|_| pool.install(|| measure(&shape, &device, threads)))
                .collect();
            let median = |runs: &mut Vec<(f64, f64, f64)>, key: fn(&(f64, f64, f64)) -> f64| {
                runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
                key(&runs[runs.len() / 2])
            };
            let train = median(&mut runs, |r| r.0);
            let one = median(&mut runs, |r| r.1);
            let many = median(&mut runs, |r| r.2);
            println!("| {name} | {threads} | {train:.0} | {one:.0} | {many:.0} |");
        }
    }
}
