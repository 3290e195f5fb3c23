//! The burn generator: conformance, agreement with the trainer's logprobs, continuous batching.

use std::sync::Arc;

use areal_gen_burn::{BurnGenerator, BurnGeneratorOptions};
use areal_model::{TransformerOptions, TransformerPolicy};
use areal_sdk::{FinishReason, GenerateRequest, Generator, SamplingParams, WeightUpdate};
use areal_sdk_train::burn::tensor::Device;
use areal_sdk_train::{PackedBatch, Policy};
use areal_testkit::conformance;

const ALPHABET: &str = "0123456789+=, ";

fn policy(seed: u64) -> TransformerPolicy {
    policy_with_context(seed, 96)
}

fn policy_with_context(seed: u64, max_positions: usize) -> TransformerPolicy {
    let options = TransformerOptions {
        hidden_size: 32,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        max_positions,
        ..TransformerOptions::default()
    };
    TransformerPolicy::fresh(&options, ALPHABET, seed, &Device::flex()).unwrap()
}

fn update(policy: &TransformerPolicy, version: u64) -> WeightUpdate {
    WeightUpdate::new(version, policy.weights()).with_architecture(policy.architecture())
}

fn generator(max_batch: usize) -> Arc<BurnGenerator> {
    Arc::new(
        BurnGenerator::new(
            &BurnGeneratorOptions {
                max_batch,
                max_len: None,
                ..BurnGeneratorOptions::default()
            },
            Device::flex(),
        )
        .expect("a generator"),
    )
}

fn request(
    id: u64,
    input: Vec<u32>,
    max_new_tokens: usize,
    sampling: SamplingParams,
    stop: Vec<u32>,
) -> GenerateRequest {
    GenerateRequest {
        sample_id: id,
        input_ids: input,
        max_new_tokens,
        sampling,
        stop_token_ids: stop,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burn_generator_conforms() {
    // A context that takes a while to fill, so that the check's pause finds its "endless"
    // request still decoding: 96 positions fill within a millisecond on a fast core.
    let p = policy_with_context(1, 2048);
    for max_batch in [1, 4] {
        conformance::check_generator(
            generator(max_batch),
            update(&p, 2),
            p.tokenizer().as_ref(),
            "12+34=",
        )
        .await;
    }
}

/// Many concurrent samples decoded in shared batches get exactly the logprobs the trainer
/// computes for them: prefill, cache rows, row moves and sampling all agree with a full pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behaviour_logprobs_are_the_policys() {
    let p = policy(3);
    let g = generator(5);
    g.update_weights(update(&p, 0)).await.unwrap();
    let tokenizer = p.tokenizer();
    let stop = tokenizer.stop_token_ids();
    for temperature in [1.0f32, 0.6] {
        let mut calls = Vec::new();
        for i in 0..12u64 {
            let prompt = tokenizer.encode(&format!("{}+{}=", i * 7, i + 3)).unwrap();
            let max = 5 + (i as usize * 3) % 20;
            let r = request(
                i,
                prompt.clone(),
                max,
                SamplingParams {
                    temperature,
                    top_p: 1.0,
                    seed: 11,
                },
                stop.clone(),
            );
            let g = g.clone();
            calls.push(tokio::spawn(async move {
                (prompt, max, g.generate(r).await.unwrap())
            }));
        }
        let mut batch = PackedBatch::new(temperature);
        let mut outs = Vec::new();
        for call in calls {
            let (prompt, max, c) = call.await.unwrap();
            assert!(c.len() <= max);
            assert!(c.versions.iter().all(|&v| v == 0));
            let mut seq = prompt.clone();
            seq.extend(&c.token_ids);
            batch.push(&seq);
            outs.push((prompt.len(), c));
        }
        let lp: Vec<f32> = p
            .logprobs_no_grad(&batch)
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        for ((prompt_len, c), range) in outs.iter().zip(batch.ranges()) {
            for (j, behaviour) in c.behaviour_logprobs.iter().enumerate() {
                let trainer = lp[range.start + prompt_len + j];
                assert!(
                    (trainer - behaviour).abs() < 1e-4,
                    "token {j}: generator {behaviour}, trainer {trainer}"
                );
            }
        }
    }
    let stats = g.decode_stats();
    assert_eq!(
        stats.max_active, 5,
        "sequences were decoded in full batches"
    );
}

/// Greedy output does not depend on what else is in the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_is_batch_invariant() {
    let p = policy(4);
    let tokenizer = p.tokenizer();
    let prompt = tokenizer.encode("98+76=").unwrap();
    let alone = generator(1);
    alone.update_weights(update(&p, 0)).await.unwrap();
    let single = alone
        .generate(request(
            0,
            prompt.clone(),
            30,
            SamplingParams::greedy(),
            vec![],
        ))
        .await
        .unwrap();
    assert_eq!(single.finish_reason, FinishReason::Length);

    let shared = generator(8);
    shared.update_weights(update(&p, 0)).await.unwrap();
    let mut calls = Vec::new();
    for i in 0..8u64 {
        let input = if i == 5 {
            prompt.clone()
        } else {
            tokenizer.encode(&format!("{i}{i}+1=")).unwrap()
        };
        let g = shared.clone();
        let r = request(
            i,
            input,
            10 + 4 * i as usize,
            SamplingParams {
                temperature: 1.0,
                top_p: 0.9,
                seed: i,
            },
            vec![],
        );
        let r = if i == 5 {
            request(5, prompt.clone(), 30, SamplingParams::greedy(), vec![])
        } else {
            r
        };
        calls.push(tokio::spawn(async move { g.generate(r).await.unwrap() }));
    }
    let results: Vec<_> = futures_join(calls).await;
    assert_eq!(results[5].token_ids, single.token_ids);
    for (i, c) in results.iter().enumerate() {
        if i != 5 {
            assert_eq!(c.len(), 10 + 4 * i, "sample {i} ran to its own budget");
        }
    }
}

async fn futures_join<T: Send + 'static>(handles: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_problem() {
    let p = policy(5);
    let g = generator(2);
    let err = g
        .generate(request(0, vec![2, 3], 4, SamplingParams::greedy(), vec![]))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("before any weights"), "{err}");
    g.update_weights(update(&p, 0)).await.unwrap();
    let err = g
        .generate(request(0, vec![2, 99], 4, SamplingParams::greedy(), vec![]))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("99") && err.contains("vocabulary"), "{err}");
    let err = g
        .generate(request(
            0,
            vec![2; 200],
            4,
            SamplingParams::greedy(),
            vec![],
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("200 tokens") && err.contains("96"), "{err}");
    // a request near the end of the context stops at the context
    let c = g
        .generate(request(
            0,
            vec![2; 90],
            50,
            SamplingParams::greedy(),
            vec![],
        ))
        .await
        .unwrap();
    assert_eq!(c.len(), 6);
    assert_eq!(c.finish_reason, FinishReason::Length);
    let bad = WeightUpdate::new(1, p.weights());
    let err = g.update_weights(bad).await.unwrap_err().to_string();
    assert!(err.contains("does not describe a transformer"), "{err}");
}

/// A generator on a pool of its own reports its busy time, its weight loads and what
/// resuming after an interruption cost; interrupted and resubmitted work continues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_busy_time_weight_loads_and_the_cost_of_resuming() {
    let p = policy(6);
    let g = Arc::new(
        BurnGenerator::new(
            &BurnGeneratorOptions {
                max_batch: 4,
                threads: 1,
                ..BurnGeneratorOptions::default()
            },
            Device::flex(),
        )
        .unwrap(),
    );
    let started = std::time::Instant::now();
    g.update_weights(update(&p, 0)).await.unwrap();
    assert_eq!(g.stats().weight_loads, 1);
    assert_eq!(g.stats().resumes, 0, "nothing was running");
    let sampling = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        seed: 3,
    };
    let prompt = vec![1u32, 2, 3];
    // pause once decoding has started (retry in the rare case the request ends first)
    let (partial, loads) = {
        let mut loads = 1u64;
        loop {
            let before = g.decode_stats().tokens;
            let running = tokio::spawn({
                let (g, r) = (
                    g.clone(),
                    request(1, prompt.clone(), 90, sampling.clone(), vec![]),
                );
                async move { g.generate(r).await }
            });
            while g.decode_stats().tokens == before {
                tokio::time::sleep(std::time::Duration::from_micros(200)).await;
            }
            g.pause().await.unwrap();
            loads += 1;
            g.update_weights(update(&p, loads - 1)).await.unwrap();
            g.resume().await.unwrap();
            let out = running.await.unwrap().unwrap();
            if out.finish_reason == FinishReason::Interrupted {
                break (out, loads);
            }
        }
    };
    let mut input = prompt.clone();
    input.extend(&partial.token_ids);
    let rest = g
        .generate(request(1, input, 90 - partial.len(), sampling, vec![]))
        .await
        .unwrap();
    assert_eq!(partial.len() + rest.len(), 90);
    let s = g.stats();
    assert_eq!(s.weight_loads, loads);
    assert_eq!(s.resumes, 1, "one update interrupted running work: {s:?}");
    let busy = s.busy_seconds.expect("measured");
    let wall = started.elapsed().as_secs_f64();
    assert!(s.resume_seconds > 0.0 && s.resume_seconds < wall, "{s:?}");
    assert!(busy > 0.0 && busy <= wall, "busy {busy} s of {wall} s");
    assert!(s.tokens >= 90, "{s:?}");
}

/// What deterministic runs rely on: requests handed over together (`generate_batch`) are
/// batched the same way every time, so their tokens and logprobs are the same bit for bit,
/// whatever the generator did before; and they are the tokens each would get alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_handed_over_together_is_the_same_bit_for_bit_every_time() {
    let p = policy(7);
    let tokenizer = p.tokenizer();
    let stop = tokenizer.stop_token_ids();
    let sampling = SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        seed: 5,
    };
    let requests: Vec<GenerateRequest> = (0..12u64)
        .map(|i| {
            let prompt = tokenizer.encode(&format!("{}+{}=", i * 13, i + 1)).unwrap();
            let max = 6 + (i as usize * 5) % 30;
            request(i, prompt, max, sampling.clone(), stop.clone())
        })
        .collect();
    let bits = |c: &areal_sdk::Completion| -> Vec<u32> {
        c.behaviour_logprobs.iter().map(|x| x.to_bits()).collect()
    };
    let run = |g: Arc<BurnGenerator>| {
        let requests = requests.clone();
        async move {
            let out: Vec<_> = g
                .generate_batch(requests)
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
            out
        }
    };
    let fresh = generator(8);
    fresh.update_weights(update(&p, 0)).await.unwrap();
    let first = run(fresh.clone()).await;
    // other work in between, and a second generator
    fresh
        .generate(request(
            99,
            requests[3].input_ids.clone(),
            20,
            sampling.clone(),
            vec![],
        ))
        .await
        .unwrap();
    let again = run(fresh).await;
    let other = generator(8);
    other.update_weights(update(&p, 0)).await.unwrap();
    let elsewhere = run(other).await;
    let alone = generator(1);
    alone.update_weights(update(&p, 0)).await.unwrap();
    for (i, c) in first.iter().enumerate() {
        assert_eq!(bits(c), bits(&again[i]), "sample {i}");
        assert_eq!(bits(c), bits(&elsewhere[i]), "sample {i}");
        assert_eq!(c.token_ids, again[i].token_ids);
        let single = alone.generate(requests[i].clone()).await.unwrap();
        assert_eq!(single.token_ids, c.token_ids, "sample {i} decoded alone");
    }
}

/// A policy whose adapters (on every projection, rank 2) are random: `B` too, so that the
/// adapted model differs from the base.
fn adapted_policy(seed: u64, adapter_seed: u64) -> TransformerPolicy {
    use areal_model::{AdapterConfig, LoraOptions};
    let config = AdapterConfig::from_options(&LoraOptions {
        rank: 2,
        ..LoraOptions::default()
    })
    .unwrap();
    let mut p = policy(seed);
    p.set_lora(config.clone(), None, adapter_seed);
    p.start_rl().unwrap();
    let mut tensors = p.adapter().unwrap().tensors;
    let mut x = adapter_seed as f32;
    for t in &mut tensors {
        for v in &mut t.data {
            x = (x * 1.7 + 0.3).fract();
            *v = (x - 0.5) * 0.2;
        }
    }
    let mut p = policy(seed);
    p.set_lora(config, Some(tensors), 0);
    p.start_rl().unwrap();
    p
}

/// Merged or not, the generator samples from the adapted model: its logprobs are the
/// trainer's, and a new adapter over the same base (the same `Arc`) is taken alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_merged_or_not_sample_the_adapted_model() {
    use areal_gen_burn::AdapterMode;
    for mode in [AdapterMode::Merged, AdapterMode::Unmerged] {
        let g = BurnGenerator::new(
            &BurnGeneratorOptions {
                max_batch: 4,
                adapters: mode,
                ..BurnGeneratorOptions::default()
            },
            Device::flex(),
        )
        .unwrap();
        let first = adapted_policy(4, 1);
        let base = first.weight_update(0).tensors;
        for (version, adapter_seed) in [(0u64, 1u64), (1, 2)] {
            let p = adapted_policy(4, adapter_seed);
            let mut update = p.weight_update(version);
            assert!(update.adapter.is_some());
            // the run sends its one base every time
            update.tensors = base.clone();
            g.update_weights(update).await.unwrap();
            let tokenizer = p.tokenizer();
            let prompt = tokenizer.encode("12+34=").unwrap();
            let sampling = SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                seed: 5,
            };
            let c = g
                .generate(request(version, prompt.clone(), 12, sampling, vec![]))
                .await
                .unwrap();
            assert!(c.versions.iter().all(|&v| v == version));
            let mut batch = PackedBatch::new(1.0);
            batch.push(&[prompt.clone(), c.token_ids.clone()].concat());
            let lp: Vec<f32> = p
                .logprobs_no_grad(&batch)
                .unwrap()
                .into_data()
                .try_to_vec()
                .unwrap();
            let base_lp: Vec<f32> = policy(4)
                .logprobs_no_grad(&batch)
                .unwrap()
                .into_data()
                .try_to_vec()
                .unwrap();
            let mut moved = 0.0f32;
            for (j, behaviour) in c.behaviour_logprobs.iter().enumerate() {
                let trainer = lp[prompt.len() + j];
                assert!(
                    (trainer - behaviour).abs() < 1e-4,
                    "{mode:?}, token {j}: generator {behaviour}, trainer {trainer}"
                );
                moved = moved.max((base_lp[prompt.len() + j] - behaviour).abs());
            }
            assert!(moved > 1e-3, "{mode:?}: the adapter changed nothing");
        }
    }
}
