//! The testkit's own fakes pass the conformance checks they offer.

use std::sync::Arc;

use areal_sdk::{Tokenizer, WeightUpdate};
use areal_sdk_train::Policy;
use areal_sdk_train::burn::optim::AdamWConfig;
use areal_sdk_train::burn::tensor::Device;
use areal_testkit::{
    BigramGenerator, BigramGeneratorOptions, BigramPolicy, BigramPolicyOptions, conformance,
};

fn policy() -> BigramPolicy {
    let options = BigramPolicyOptions {
        letters: 8,
        init_std: 1.0,
    };
    BigramPolicy::new(&options, 11, &Device::flex().autodiff())
}

#[test]
fn bigram_policy_conforms() {
    let mut policy = policy();
    let mut optimizer = AdamWConfig::new().init();
    let sequences = vec![vec![0, 1, 2, 3], vec![5, 5, 8], vec![7, 0, 1, 2, 4, 6]];
    conformance::check_policy(&mut policy, &mut optimizer, &sequences);
}

#[tokio::test]
async fn bigram_generator_conforms() {
    let policy = policy();
    let weights = WeightUpdate::new(3, policy.weights());
    let tokenizer = policy.tokenizer();
    for options in [
        BigramGeneratorOptions::default(),
        BigramGeneratorOptions {
            token_delay_us: 200,
            jitter: 0.5,
        },
    ] {
        let generator = Arc::new(BigramGenerator::new(options));
        conformance::check_generator(generator, weights.clone(), tokenizer.as_ref(), "cab").await;
    }
}

/// The generator's behaviour logprobs are the policy's logprobs of the same tokens.
#[tokio::test]
async fn generator_and_policy_agree_on_logprobs() {
    use areal_sdk::{GenerateRequest, Generator, SamplingParams};
    use areal_sdk_train::PackedBatch;

    let policy = policy();
    let generator = BigramGenerator::new(BigramGeneratorOptions::default());
    generator
        .update_weights(WeightUpdate::new(0, policy.weights()))
        .await
        .unwrap();
    for temperature in [1.0f32, 0.7] {
        let c = generator
            .generate(GenerateRequest {
                sample_id: 1,
                input_ids: vec![2],
                max_new_tokens: 30,
                sampling: SamplingParams {
                    temperature,
                    top_p: 1.0,
                    seed: 9,
                },
                stop_token_ids: vec![],
            })
            .await
            .unwrap();
        let mut batch = PackedBatch::new(temperature);
        let mut seq = vec![2];
        seq.extend(&c.token_ids);
        batch.push(&seq);
        let lp: Vec<f32> = policy
            .logprobs_no_grad(&batch)
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        for (i, behaviour) in c.behaviour_logprobs.iter().enumerate() {
            assert!(
                (lp[i + 1] - behaviour).abs() < 1e-5,
                "token {i}: {} vs {behaviour}",
                lp[i + 1]
            );
        }
    }
}

#[test]
fn tokenizer_round_trips_and_rejects_foreign_characters() {
    let t = areal_testkit::LetterTokenizer::new(5);
    assert_eq!(t.decode(&t.encode("abcde").unwrap()).unwrap(), "abcde");
    assert_eq!(t.decode(&[0, 5]).unwrap(), "a");
    let err = t.encode("abz").unwrap_err().to_string();
    assert!(err.contains("'z'"), "{err}");
}

#[test]
fn the_successor_task_passes_the_task_conformance_check() {
    let task = areal_testkit::SuccessorTask::new(Default::default(), 3);
    conformance::check_task(&task, Some(&areal_testkit::SuccessorVerifier));
}
