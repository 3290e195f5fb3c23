//! The generator check.

use std::time::Duration;

use areal_sdk::{
    Completion, FinishReason, GenerateRequest, Generator, SamplingParams, Tokenizer, WeightUpdate,
};
use std::sync::Arc;

fn request(
    prompt: &[u32],
    max_new_tokens: usize,
    sampling: SamplingParams,
    stop: Vec<u32>,
) -> GenerateRequest {
    GenerateRequest {
        sample_id: 7,
        input_ids: prompt.to_vec(),
        max_new_tokens,
        sampling,
        stop_token_ids: stop,
    }
}

fn check_completion(
    name: &str,
    c: &Completion,
    max: usize,
    stop: &[u32],
    version: areal_sdk::PolicyVersion,
) {
    if let Err(e) = c.check() {
        panic!("{name}: malformed completion: {e}");
    }
    assert!(
        c.len() <= max,
        "{name}: {} tokens for max_new_tokens {max}",
        c.len()
    );
    assert!(
        c.versions.iter().all(|&v| v == version),
        "{name}: versions {:?}, expected all {version}",
        c.versions
    );
    match c.finish_reason {
        FinishReason::Stop => assert!(
            c.token_ids.last().is_some_and(|t| stop.contains(t)),
            "{name}: finish reason stop without a stop token at the end"
        ),
        FinishReason::Length => assert_eq!(c.len(), max, "{name}: finish reason length early"),
        FinishReason::Interrupted => panic!("{name}: interrupted while not paused"),
    }
    let before_end = &c.token_ids[..c.len().saturating_sub(1)];
    assert!(
        !before_end.iter().any(|t| stop.contains(t)),
        "{name}: generation continued past a stop token"
    );
}

/// Check a generator: weights load, completions are well formed, versions are the loaded
/// version, greedy decoding is deterministic, concurrent calls work, and — if it supports
/// pausing — the interruption protocol.
pub async fn check_generator(
    generator: Arc<dyn Generator>,
    weights: WeightUpdate,
    tokenizer: &dyn Tokenizer,
    prompt: &str,
) {
    let name = generator.name().to_owned();
    let prompt = tokenizer.encode(prompt).expect("the prompt encodes");
    let stop = tokenizer.stop_token_ids();
    let version = weights.version;
    generator
        .update_weights(weights.clone())
        .await
        .unwrap_or_else(|e| panic!("{name}: update_weights failed: {e}"));

    let sampled = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        seed: 3,
    };
    for max in [1, 5, 40] {
        let c = generator
            .generate(request(&prompt, max, sampled.clone(), stop.clone()))
            .await
            .unwrap_or_else(|e| panic!("{name}: generate failed: {e}"));
        check_completion(&name, &c, max, &stop, version);
        tokenizer
            .decode(&c.token_ids)
            .unwrap_or_else(|e| panic!("{name}: output does not decode: {e}"));
    }

    let greedy = request(&prompt, 16, SamplingParams::greedy(), stop.clone());
    let a = generator
        .generate(greedy.clone())
        .await
        .expect("greedy generate");
    let b = generator.generate(greedy).await.expect("greedy generate");
    assert_eq!(
        a.token_ids, b.token_ids,
        "{name}: greedy decoding is not deterministic"
    );

    let mut calls = Vec::new();
    for seed in 0..8 {
        let g = generator.clone();
        let sampling = SamplingParams {
            seed,
            ..sampled.clone()
        };
        let r = request(&prompt, 12, sampling, stop.clone());
        calls.push(tokio::spawn(async move { g.generate(r).await }));
    }
    for call in calls {
        let c = call
            .await
            .expect("task")
            .unwrap_or_else(|e| panic!("{name}: concurrent generate failed: {e}"));
        check_completion(&name, &c, 12, &stop, version);
    }

    check_interruption(generator, weights, &prompt).await;
}

async fn check_interruption(generator: Arc<dyn Generator>, weights: WeightUpdate, prompt: &[u32]) {
    let name = generator.name().to_owned();
    let sampled = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        seed: 5,
    };
    let long = request(prompt, 1_000_000, sampled, Vec::new());
    // Pause while the request decodes: once the generator's token count moves (one that
    // counts as it decodes says so at the first token), or after a fixed wait for one that
    // counts later or not at all. A generator with a short context may still finish the
    // "endless" request before the pause arrives on a fast machine; then resume and try
    // again, pausing sooner.
    let mut wait_ms = 20;
    let first = loop {
        let before = generator.stats().tokens;
        let g = generator.clone();
        let in_flight = tokio::spawn({
            let long = long.clone();
            async move { g.generate(long).await }
        });
        let waited = tokio::time::Instant::now();
        while generator.stats().tokens == before
            && !in_flight.is_finished()
            && waited.elapsed() < Duration::from_millis(wait_ms)
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        match generator.pause().await {
            Err(e) if e.is_unsupported() => {
                in_flight.abort();
                return;
            }
            Err(e) => panic!("{name}: pause failed: {e}"),
            Ok(()) => {}
        }
        let done = tokio::time::timeout(Duration::from_secs(10), in_flight)
            .await
            .unwrap_or_else(|_| panic!("{name}: an in-flight request did not return after pause"))
            .expect("task")
            .unwrap_or_else(|e| panic!("{name}: interrupted generate failed: {e}"));
        if done.finish_reason == FinishReason::Interrupted || wait_ms == 1 {
            break done;
        }
        generator
            .resume()
            .await
            .unwrap_or_else(|e| panic!("{name}: resume failed: {e}"));
        wait_ms = (wait_ms / 4).max(1);
    };
    assert_eq!(
        first.finish_reason,
        FinishReason::Interrupted,
        "{name}: not interrupted: a request for 1e6 tokens ran to its end before pause, three \
         times (check with a context that takes longer to fill)"
    );
    first
        .check()
        .unwrap_or_else(|e| panic!("{name}: malformed partial output: {e}"));

    // A call made while paused waits for resume and then runs on the new weights.
    let mut input = prompt.to_vec();
    input.extend(&first.token_ids);
    let g = generator.clone();
    let mut resumed = long.clone();
    resumed.input_ids = input;
    resumed.max_new_tokens = 8;
    let held = tokio::spawn(async move { g.generate(resumed).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !held.is_finished(),
        "{name}: a request made while paused did not wait for resume"
    );
    let next = WeightUpdate {
        version: weights.version + 1,
        ..weights.clone()
    };
    generator
        .update_weights(next)
        .await
        .unwrap_or_else(|e| panic!("{name}: update_weights: {e}"));
    generator
        .resume()
        .await
        .unwrap_or_else(|e| panic!("{name}: resume failed: {e}"));
    let second = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap_or_else(|_| panic!("{name}: a held request did not run after resume"))
        .expect("task")
        .unwrap_or_else(|e| panic!("{name}: generate after resume failed: {e}"));
    assert!(
        second.versions.iter().all(|&v| v == weights.version + 1),
        "{name}: tokens after resume carry versions {:?}, expected {}",
        second.versions,
        weights.version + 1
    );
    // Leave the generator as we found it.
    generator
        .update_weights(weights)
        .await
        .expect("restore weights");
}
