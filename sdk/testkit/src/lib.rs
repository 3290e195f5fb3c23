//! Test support for areal-rs: conformance checks every plugin of a kind should pass, and small
//! fake plugins that really work, so the engine can be tested end to end in seconds.
//!
//! The fakes are registered like any plugin:
//!
//! | kind | name | what |
//! |---|---|---|
//! | policy | `testkit-bigram` | a burn bigram model (one table of logits) |
//! | generator | `testkit-bigram` | samples from the same table in plain Rust; pausable |
//! | task | `testkit-successor` | prompts are letters; continue with the following letters |
//! | reward | `testkit-successor` | fraction of letters that follow their predecessor |
//! | reward | `testkit-faulty` | the same, but panics, fails or hangs on chosen samples |
//! | episode | `testkit-relay` | several turns, each handed to `testkit-shift` in between |
//! | tool | `testkit-shift` | moves letters on by the number of calls of its session |
//!
//! The bigram policy and generator, [`CONFIG`] and the generator, policy and algorithm checks
//! need burn and tokio: they come with the `full` feature (on by default). A reward or task
//! crate tests with `default-features = false` (the checks of [`conformance`] for rewards and
//! tasks, the successor task and rewards) and compiles neither.
//!
//! ```
//! use areal_sdk::{RewardInput, FinishReason, Tokenizer};
//! use areal_testkit::{LetterTokenizer, SuccessorVerifier, conformance};
//!
//! let input = |completion: &str| RewardInput {
//!     sample_id: 1,
//!     item_id: "x".into(),
//!     prompt: "c".into(),
//!     completion: completion.into(),
//!     completion_ids: vec![],
//!     finish_reason: FinishReason::Stop,
//!     reference: serde_json::json!({"letters": 8, "length": 4}),
//!     metadata: Default::default(),
//! };
//! conformance::check_verifier(
//!     std::sync::Arc::new(SuccessorVerifier),
//!     &[(input("defg"), 1.0), (input("dex"), 0.5), (input("dffg"), 0.5)],
//! );
//! assert_eq!(LetterTokenizer::new(8).encode("bad").unwrap(), vec![1, 0, 3]);
//! ```

#[cfg(feature = "full")]
mod bigram;
#[cfg(feature = "full")]
mod config;
pub mod conformance;
mod relay;
mod successor;
mod tokenizer;

#[cfg(feature = "full")]
pub use bigram::{
    BigramGenerator, BigramGeneratorOptions, BigramModel, BigramPolicy, BigramPolicyOptions, TABLE,
};
#[cfg(feature = "full")]
pub use config::CONFIG;
pub use relay::{Relay, RelayOptions, Shift, ShiftOptions};
pub use successor::{
    FaultyOptions, FaultyVerifier, SuccessorTask, SuccessorTaskOptions, SuccessorVerifier,
    successor_reward,
};
pub use tokenizer::LetterTokenizer;

#[cfg(feature = "full")]
areal_sdk::register_generator!(
    bigram::NAME,
    "testkit: bigram sampler in plain Rust, pausable, optional per-token delay",
    bigram::build_generator
);
#[cfg(feature = "full")]
areal_sdk_train::register_policy!(
    bigram::NAME,
    "testkit: bigram model (one table of logits) in burn",
    bigram::build_policy
);
areal_sdk::register_task!(
    successor::NAME,
    "testkit: continue a letter with the letters after it",
    successor::build_task
);
areal_sdk::register_reward!(
    successor::NAME,
    "testkit: fraction of letters that follow their predecessor",
    successor::build_verifier
);
areal_sdk::register_reward!(
    successor::FAULTY_NAME,
    "testkit: successor reward that panics, fails or hangs on chosen samples",
    successor::build_faulty
);
areal_sdk::register_episode!(
    relay::RELAY,
    "testkit: several turns, each handed to testkit-shift, whose answer comes before the next",
    relay::build_relay
);
areal_sdk::register_tool!(
    relay::SHIFT,
    "testkit: moves letters on by the number of calls its session has had",
    relay::build_shift
);
