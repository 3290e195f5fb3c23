//! Conformance checks that every plugin of a kind should pass, in the spirit of burn's
//! backend test-suite. Each check panics with a message that names the plugin and what it got
//! wrong; call them from a plugin crate's own tests.

use std::sync::Arc;
use std::time::Duration;

use areal_sdk::{
    Completion, FinishReason, GenerateRequest, Generator, PROMPT_VERSION, RewardInput,
    RewardVerifier, SamplingParams, Tokenizer, TrajectoryGroup, VerifyContext, WeightUpdate,
};
use areal_sdk_train::burn::optim::ModuleOptimizer;
use areal_sdk_train::burn::tensor::{Tensor, TensorData};
use areal_sdk_train::{
    AdvantageInput, Algorithm, BehaviourLogprobs, CriticInput, CurrentLogprobs, LossInput,
    PackedBatch, Policy, ProximalLogprobs, ReferenceLogprobs,
};

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
    // A generator with a short context may finish the "endless" request before the pause
    // arrives on a fast machine; then resume and try again, pausing sooner.
    let mut wait_ms = 20;
    let first = loop {
        let g = generator.clone();
        let in_flight = tokio::spawn({
            let long = long.clone();
            async move { g.generate(long).await }
        });
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
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
        "{name}: not interrupted (a request for 1e6 tokens finished within 1 ms before pause)"
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

/// Check a verifier as the engine will call it, on cases with known rewards:
/// - every case is `Ok`, with a finite reward equal to the expected one and a verdict the
///   engine does not reserve for itself: a wrong answer is a low reward, never an error;
/// - the cases include at least one wrong answer (a reward below the best one);
/// - the same sample twice gives the same reward and verdict;
/// - the provenance names the verifier's version;
/// - with a deadline already past, `verify` returns (`Ok` or `Err`) within 2 seconds instead
///   of running on (it runs on a thread of its own here, so a hang fails the check).
pub fn check_verifier(verifier: Arc<dyn RewardVerifier>, cases: &[(RewardInput, f64)]) {
    let name = verifier.name().to_owned();
    assert!(!cases.is_empty(), "{name}: no cases given");
    let best = cases
        .iter()
        .map(|(_, e)| *e)
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(
        cases.iter().any(|(_, e)| *e < best),
        "{name}: give at least one wrong answer among the cases"
    );
    for (input, expected) in cases {
        let ctx = VerifyContext::with_timeout(Duration::from_secs(60));
        let reward = verifier
            .verify(input, &ctx)
            .unwrap_or_else(|e| panic!("{name}: sample {} failed: {e}", input.sample_id));
        assert!(
            reward.value.is_finite(),
            "{name}: non-finite reward {}",
            reward.value
        );
        assert!(
            !reward.verdict.is_failure(),
            "{name}: verdict {:?} is reserved for the engine",
            reward.verdict
        );
        assert!(
            (reward.value - expected).abs() < 1e-9,
            "{name}: sample {} ({:?}) got reward {}, expected {expected}",
            input.sample_id,
            input.completion,
            reward.value
        );
        assert!(
            !reward.provenance.verifier_version.is_empty(),
            "{name}: the reward's provenance has no verifier_version"
        );
        let again = verifier.verify(input, &ctx).expect("second verify");
        assert_eq!(again.value, reward.value, "{name}: not deterministic");
        assert_eq!(again.verdict, reward.verdict, "{name}: not deterministic");
    }
    // A deadline already past: the verifier must give its thread back.
    let (tx, rx) = std::sync::mpsc::channel();
    let on_thread = Arc::clone(&verifier);
    let input = cases[0].0.clone();
    std::thread::spawn(move || {
        let ctx = VerifyContext::with_timeout(Duration::ZERO);
        let _ = on_thread.verify(&input, &ctx);
        let _ = tx.send(());
    });
    if rx.recv_timeout(Duration::from_secs(2)).is_err() {
        panic!("{name}: still running 2 s after its deadline passed");
    }
}

/// Check a policy on some token sequences: logprob shape and range, the zero at each sequence
/// start, no-grad equal to grad, packing invariance (a sequence's logprobs do not depend on
/// what is packed beside it), exported weights, and that a step on −Σ logprob raises it.
pub fn check_policy(
    policy: &mut dyn Policy,
    optimizer: &mut ModuleOptimizer,
    sequences: &[Vec<u32>],
) {
    let name = policy.name().to_owned();
    assert!(sequences.len() >= 2, "{name}: give at least two sequences");
    let mut batch = PackedBatch::new(1.0);
    for s in sequences {
        batch.push(s);
    }
    let values = |t: Tensor<1>| -> Vec<f32> {
        t.into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32")
    };
    let lp = values(
        policy
            .logprobs(&batch)
            .unwrap_or_else(|e| panic!("{name}: logprobs: {e}")),
    );
    assert_eq!(
        lp.len(),
        batch.num_tokens(),
        "{name}: one logprob per token expected"
    );
    for range in batch.ranges() {
        assert_eq!(
            lp[range.start], 0.0,
            "{name}: first token of a sequence must get 0"
        );
        for (t, &value) in lp.iter().enumerate().take(range.end).skip(range.start + 1) {
            assert!(
                value.is_finite() && value <= 1e-5,
                "{name}: logprob {value} at {t}"
            );
        }
    }
    let lp_ng = values(policy.logprobs_no_grad(&batch).expect("no-grad logprobs"));
    for (a, b) in lp.iter().zip(&lp_ng) {
        assert!(
            (a - b).abs() < 1e-4,
            "{name}: no-grad logprobs differ: {a} vs {b}"
        );
    }
    for (i, range) in batch.ranges().enumerate() {
        let mut alone = PackedBatch::new(1.0);
        alone.push(&sequences[i]);
        let single = values(policy.logprobs_no_grad(&alone).expect("logprobs"));
        for (a, b) in lp[range].iter().zip(&single) {
            assert!(
                (a - b).abs() < 1e-4,
                "{name}: sequence {i} changes when packed: {a} vs {b}"
            );
        }
    }

    let weights = policy.weights();
    let mut names: Vec<&str> = weights.iter().map(|w| w.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(
        names.len(),
        weights.len(),
        "{name}: weight names are not unique"
    );
    for w in &weights {
        assert_eq!(
            w.data.len(),
            w.shape.iter().product::<usize>(),
            "{name}: `{}` has the wrong size",
            w.name
        );
    }

    let before: f32 = lp.iter().sum();
    let loss = policy.logprobs(&batch).expect("logprobs").sum().neg();
    policy
        .backward(loss)
        .unwrap_or_else(|e| panic!("{name}: backward: {e}"));
    let stats = policy
        .step(optimizer, 1e-2, Some(1.0))
        .unwrap_or_else(|e| panic!("{name}: step: {e}"));
    assert!(stats.grad_norm > 0.0, "{name}: zero gradient");
    let after: f32 = values(policy.logprobs_no_grad(&batch).expect("logprobs"))
        .iter()
        .sum();
    assert!(
        after > before,
        "{name}: a step on -sum(logprob) did not raise it ({before} -> {after})"
    );
    assert_ne!(
        policy.weights(),
        weights,
        "{name}: weights did not change after a step"
    );
}

/// Check an algorithm on finished groups: advantages have the right shape and are finite, and
/// on-policy (current = proximal = behaviour) the loss is finite and its gradient pushes up
/// the logprob of tokens with positive advantage and down those with negative advantage,
/// leaving prompt tokens alone.
pub fn check_algorithm(algorithm: &dyn Algorithm, groups: &[TrajectoryGroup]) {
    let name = algorithm.name().to_owned();
    let needs = algorithm.requirements();
    let samples: Vec<_> = groups
        .iter()
        .flat_map(|g| g.samples.iter().map(move |s| (g, s)))
        .collect();
    // On policy: old = reference = behaviour; values 0 before the update.
    let old: Vec<Vec<f32>> = samples
        .iter()
        .map(|(_, s)| s.completion.behaviour_logprobs.clone())
        .collect();
    let zero_values: Vec<Vec<f32>> = samples
        .iter()
        .map(|(_, s)| vec![0.0; s.completion.len()])
        .collect();
    let mut advantage_input = AdvantageInput::new(groups, &old);
    if needs.reference {
        advantage_input = advantage_input.with_reference(&old);
    }
    if needs.values {
        advantage_input = advantage_input.with_values(&zero_values);
    }
    let computed = algorithm
        .advantages(&advantage_input)
        .unwrap_or_else(|e| panic!("{name}: advantages: {e}"));
    assert_eq!(
        computed.returns.is_some(),
        needs.values,
        "{name}: value targets (returns) exactly when the algorithm asks for values"
    );
    let advantages = computed.advantages;
    assert_eq!(
        advantages.len(),
        samples.len(),
        "{name}: one advantage vector per sample"
    );

    let device = areal_sdk_train::burn::tensor::Device::flex().autodiff();
    let (mut behaviour, mut adv, mut mask, mut versions, mut completions) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((group, sample), a) in samples.iter().zip(&advantages) {
        assert_eq!(
            a.len(),
            sample.completion.len(),
            "{name}: advantages of sample {} have the wrong length",
            sample.sample_id
        );
        assert!(
            a.iter().all(|x| x.is_finite()),
            "{name}: non-finite advantage"
        );
        let start = behaviour.len() + group.prompt_ids.len();
        for _ in &group.prompt_ids {
            behaviour.push(0.0);
            adv.push(0.0);
            mask.push(0.0);
            versions.push(PROMPT_VERSION);
        }
        behaviour.extend(&sample.completion.behaviour_logprobs);
        adv.extend(a);
        mask.extend(std::iter::repeat_n(1.0f32, a.len()));
        versions.extend(&sample.completion.versions);
        completions.push(start..behaviour.len());
    }
    let n = behaviour.len();
    let tensor = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [n]), &device);
    let current = tensor(&behaviour).require_grad();
    let input = LossInput {
        current: CurrentLogprobs(current.clone()),
        proximal: ProximalLogprobs(tensor(&behaviour)),
        behaviour: BehaviourLogprobs(tensor(&behaviour)),
        advantages: tensor(&adv),
        loss_mask: tensor(&mask),
        versions: versions.clone(),
        minibatch_tokens: mask.iter().filter(|m| **m > 0.0).count(),
        minibatch_sequences: completions.len(),
        completions,
        trainer_version: versions.iter().copied().max().unwrap_or(0),
        reference: needs
            .reference
            .then(|| ReferenceLogprobs(tensor(&behaviour))),
        critic: needs.values.then(|| CriticInput {
            values: tensor(&vec![0.0; n]).require_grad(),
            old_values: tensor(&vec![0.0; n]),
            returns: tensor(&adv),
        }),
    };
    let out = algorithm
        .loss(&input)
        .unwrap_or_else(|e| panic!("{name}: loss: {e}"));
    assert_eq!(
        out.loss.dims(),
        [1],
        "{name}: the loss must be a one-element tensor"
    );
    let value = out.loss.clone().into_scalar::<f32>();
    assert!(value.is_finite(), "{name}: loss is {value}");
    let grads = out.loss.backward();
    let grad = current
        .grad(&grads)
        .map(|g| {
            g.into_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .expect("f32")
        })
        .unwrap_or_else(|| vec![0.0; n]);
    for t in 0..n {
        if mask[t] == 0.0 {
            assert_eq!(grad[t], 0.0, "{name}: gradient on prompt token {t}");
        } else if adv[t] != 0.0 {
            assert!(
                grad[t] * adv[t] < 0.0,
                "{name}: token {t} with advantage {} has loss gradient {}",
                adv[t],
                grad[t]
            );
        }
    }
}
