//! What the generator-server tests share: a server on a thread and runtime of its own
//! (`server.rs`, which the reward-server tests include alone), the testkit policy whose
//! weights they load, a request, and a wait.

use areal_sdk::{GenerateRequest, SamplingParams};
use areal_sdk_train::burn::tensor::Device;
use areal_testkit::{BigramPolicy, BigramPolicyOptions};

pub(crate) mod server;
pub(crate) use server::{Chained, ServerThread, eventually};

/// The bigram policy (8 letters) whose weights the servers load.
pub(crate) fn policy() -> BigramPolicy {
    let options = BigramPolicyOptions {
        letters: 8,
        init_std: 1.0,
    };
    BigramPolicy::new(&options, 11, &Device::flex().autodiff())
}

/// The testkit's bigram generator, sleeping `token_delay_us` after each token.
pub(crate) fn bigram(token_delay_us: u64) -> areal_testkit::BigramGenerator {
    areal_testkit::BigramGenerator::new(areal_testkit::BigramGeneratorOptions {
        token_delay_us,
        jitter: 0.0,
    })
}

/// A sampled request of `max_new_tokens` after the prompt `[2]`, without stop tokens.
pub(crate) fn request(sample_id: u64, max_new_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        sample_id,
        input_ids: vec![2],
        max_new_tokens,
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            seed: 5,
        },
        stop_token_ids: vec![],
    }
}
