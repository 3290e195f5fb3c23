//! Training and decoding throughput of the transformer on this machine's CPU:
//! `cargo run --release -p areal-gen-burn --example throughput -- [hidden layers batch len]`.

use std::sync::Arc;
use std::time::Instant;

use areal_gen_burn::{BurnGenerator, BurnGeneratorOptions};
use areal_model::{TransformerOptions, TransformerPolicy};
use areal_sdk::{GenerateRequest, Generator, SamplingParams, WeightUpdate};
use areal_sdk_train::burn::optim::AdamWConfig;
use areal_sdk_train::burn::tensor::Device;
use areal_sdk_train::{PackedBatch, Policy};

#[allow(clippy::print_stdout)]
fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers"))
        .collect();
    let (hidden, layers, batch, len) = match args[..] {
        [h, l, b, n] => (h, l, b, n),
        _ => (128, 4, 16, 64),
    };
    let options = TransformerOptions {
        hidden_size: hidden,
        layers,
        heads: 4,
        kv_heads: 2,
        max_positions: 256,
        ..TransformerOptions::default()
    };
    let alphabet = "0123456789+-*=,; \n";
    let mut policy =
        TransformerPolicy::fresh(&options, alphabet, 1, &Device::flex().autodiff()).unwrap();
    println!(
        "model: hidden {hidden}, layers {layers}, {} parameters",
        policy.config().num_parameters()
    );
    let mut batch_tokens = PackedBatch::new(1.0);
    for i in 0..batch {
        batch_tokens.push(
            &(0..len)
                .map(|t| ((i + t) % 18) as u32 + 2)
                .collect::<Vec<_>>(),
        );
    }
    let mut optimizer = AdamWConfig::new().init();
    for warm in [true, false] {
        let steps = if warm { 1 } else { 5 };
        let start = Instant::now();
        for _ in 0..steps {
            let loss = policy.logprobs(&batch_tokens).unwrap().sum().neg();
            policy.backward(loss).unwrap();
            policy.step(&mut optimizer, 1e-3, Some(1.0)).unwrap();
        }
        if !warm {
            let s = start.elapsed().as_secs_f64();
            println!(
                "train: batch {batch} × {len}: {:.0} tokens/s ({:.3} s/step)",
                (batch * len * steps) as f64 / s,
                s / steps as f64
            );
        }
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        for max_batch in [1, batch] {
            let g = Arc::new(BurnGenerator::new(
                &BurnGeneratorOptions {
                    max_batch,
                    max_len: None,
                },
                Device::flex(),
            ));
            g.update_weights(
                WeightUpdate::new(0, policy.weights()).with_architecture(policy.architecture()),
            )
            .await
            .unwrap();
            let start = Instant::now();
            let mut calls = Vec::new();
            for i in 0..max_batch.max(4) {
                let g = g.clone();
                let r = GenerateRequest {
                    sample_id: i as u64,
                    input_ids: vec![2, 3, 4, 5],
                    max_new_tokens: len,
                    sampling: SamplingParams {
                        temperature: 1.0,
                        top_p: 1.0,
                        seed: 1,
                    },
                    stop_token_ids: vec![],
                };
                calls.push(tokio::spawn(
                    async move { g.generate(r).await.unwrap().len() },
                ));
            }
            let mut tokens = 0;
            for c in calls {
                tokens += c.await.unwrap();
            }
            let s = start.elapsed().as_secs_f64();
            println!(
                "decode: batch {max_batch}: {:.0} tokens/s",
                tokens as f64 / s
            );
        }
    });
}
