//! The plugin SDK of areal-rs.
//!
//! areal-rs trains language models with fully asynchronous reinforcement learning. Its moving
//! parts are plugins: a [`Generator`] produces completions with per-token behaviour logprobs
//! and policy versions, a [`RewardVerifier`] turns a completion into a [`Reward`], a [`Task`]
//! supplies prompts, and an [`Episode`] says what the policy does with one prompt (one answer
//! by default; turns with [`Tool`] calls in between for an agent). This crate holds those
//! contracts and the plain data they exchange; it has no tensor library, async runtime or sandbox in its API, so a reward plugin
//! compiles in seconds. The training contract (the `Algorithm` and `Policy` traits, the one
//! place tensors appear) lives in `areal-sdk-train`.
//!
//! A reward plugin is a struct, a trait impl and one registration line:
//!
//! ```
//! use std::sync::Arc;
//! use areal_sdk::{
//!     register_reward, BuildContext, PluginConfig, PluginError, Reward, RewardInput,
//!     RewardVerifier, Verdict, VerifyContext,
//! };
//!
//! /// The registered name, written once (`name()` must return it).
//! pub const NAME: &str = "contains";
//!
//! /// Reward 1 when the completion contains the reference string.
//! struct Contains;
//!
//! impl RewardVerifier for Contains {
//!     fn name(&self) -> &str {
//!         NAME
//!     }
//!
//!     fn verify(&self, input: &RewardInput, _ctx: &VerifyContext) -> Result<Reward, PluginError> {
//!         let want = input.reference.as_str().unwrap_or_default();
//!         Ok(if input.completion.contains(want) {
//!             Reward::new(1.0, Verdict::Accepted)
//!         } else {
//!             Reward::new(0.0, Verdict::WrongAnswer)
//!         })
//!     }
//! }
//!
//! fn build(_: &PluginConfig, _: &BuildContext) -> Result<Arc<dyn RewardVerifier>, PluginError> {
//!     Ok(Arc::new(Contains))
//! }
//!
//! register_reward!(NAME, "reward 1 when the completion contains the reference", build);
//! ```
//!
//! The config then selects it with `reward = { kind = "contains" }`.

mod config;
mod episode;
mod error;
mod generator;
pub mod registry;
pub mod resources;
mod reward;
pub mod sampling;
mod task;
mod tool;
pub mod tool_calls;
mod trajectory;
mod verifier;

/// The attribute [`Generator`]'s async methods are implemented with: `#[areal_sdk::async_trait]`
/// on the `impl`, without a dependency of your own.
pub use async_trait::async_trait;
pub use config::{BuildContext, PluginConfig};
pub use episode::{
    Episode, EpisodeContext, EpisodeTraits, SINGLE_TURN, SingleTurn, Turn, TurnOptions,
};
pub use error::{BoxError, PluginError, error_chain};
pub use generator::{FaultStats, Generator, GeneratorStats};
pub use registry::{
    EpisodePlugin, GeneratorPlugin, PluginInfo, RewardPlugin, TaskPlugin, ToolPlugin,
};
pub use reward::{MAX_REWARD, Provenance, Reward, TurnReward, Verdict};
pub use task::{ChatMessage, DemoTurn, Split, Task, TaskItem, Tokenizer};
pub use tool::{Tool, ToolOutput, ToolSchema, ToolSession};
pub use trajectory::{
    Adapter, Completion, FinishReason, GenerateRequest, NamedTensor, PROMPT_VERSION, PolicyVersion,
    SamplingParams, Trajectory, TrajectoryGroup, WeightUpdate,
};
pub use verifier::{AsyncVerifier, RewardInput, RewardVerifier, VerifyContext};

/// A hash of `text` that never changes between builds, platforms or runs (64-bit FNV-1a), for
/// what must stay put: a prompt's split, a cache key. Not for hash tables of untrusted keys.
///
/// ```
/// // the FNV-1a reference values
/// assert_eq!(areal_sdk::stable_hash(""), 0xcbf2_9ce4_8422_2325);
/// assert_eq!(areal_sdk::stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
/// ```
pub fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Derive an independent seed for `stream` (a sample id, an epoch...) from `seed`
/// (splitmix64 finaliser), so every random stream of a run follows from its one seed.
pub fn mix_seed(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Re-exports for the registration macros; not part of the public API.
#[doc(hidden)]
pub mod __private {
    pub use inventory;
}
