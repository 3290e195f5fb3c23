//! The training contract of areal-rs: the one place tensors appear.
//!
//! The engine's trainer loop owns packing, the forward and backward passes and the optimizer.
//! It reaches the model only through the [`Policy`] trait (per-token logprobs of packed
//! sequences, backward, an optimizer step, weights for the generators) and the loss only
//! through the [`Algorithm`] trait (advantages from rewards, a loss from current, proximal and
//! behaviour logprobs). The three logprobs are distinct types ([`CurrentLogprobs`],
//! [`ProximalLogprobs`], [`BehaviourLogprobs`]) so that one cannot be passed where another is
//! meant. burn 0.22 tensors carry no backend type parameter, so both traits are ordinary trait
//! objects.
//!
//! A minimal algorithm — REINFORCE with a group-mean baseline — looks like this:
//!
//! ```
//! use std::sync::Arc;
//! use areal_sdk::{BuildContext, PluginConfig, PluginError};
//! use areal_sdk_train::{
//!     advantages, register_algorithm, AdvantageInput, Advantages, Algorithm, LossInput,
//!     LossOutput, LossStats, ProximalMode, Requirements,
//! };
//!
//! struct Reinforce;
//!
//! impl Algorithm for Reinforce {
//!     fn name(&self) -> &str {
//!         "my-reinforce"
//!     }
//!
//!     fn requirements(&self) -> Requirements {
//!         Requirements::new(ProximalMode::Behaviour)
//!     }
//!
//!     fn advantages(&self, input: &AdvantageInput<'_>) -> Result<Advantages, PluginError> {
//!         let groups = input.groups;
//!         let scalars = advantages::sequence_advantages(
//!             groups,
//!             &advantages::RewardShaping::default(),
//!             advantages::Baseline::GroupMean,
//!             advantages::Scale::None,
//!         );
//!         Ok(advantages::broadcast(groups, &scalars).into())
//!     }
//!
//!     fn loss(&self, input: &LossInput) -> Result<LossOutput, PluginError> {
//!         // -A · log π_θ, summed over completion tokens, averaged over the mini-batch's tokens
//!         let per_token = input.current.0.clone() * input.advantages.clone() * input.loss_mask.clone();
//!         let loss = per_token.sum().neg().div_scalar(input.minibatch_tokens as f32);
//!         Ok(LossOutput { loss, stats: LossStats::default() })
//!     }
//! }
//!
//! fn build(_: &PluginConfig, _: &BuildContext) -> Result<Arc<dyn Algorithm>, PluginError> {
//!     Ok(Arc::new(Reinforce))
//! }
//!
//! register_algorithm!("my-reinforce", "REINFORCE with a group-mean baseline", build);
//! ```

pub mod advantages;
mod algorithm;
mod device;
mod module;
mod policy;
pub mod registry;
pub mod state;
pub mod weights_file;

pub use algorithm::{
    AdvantageInput, Advantages, Algorithm, BehaviourLogprobs, CriticInput, CurrentLogprobs,
    LossInput, LossOutput, LossStats, ProximalLogprobs, ProximalMode, ReferenceLogprobs,
    Requirements,
};
pub use device::parse_device;
pub use module::TrainableModule;
pub use policy::{PackedBatch, Policy, StepStats};
pub use registry::{AlgorithmPlugin, PolicyContext, PolicyPlugin};
pub use state::module_weights;

/// Re-export of burn, so plugin crates use the exact version the engine was built with.
pub use burn;

/// Re-exports for the registration macros; not part of the public API.
#[doc(hidden)]
pub mod __private {
    pub use inventory;
}
