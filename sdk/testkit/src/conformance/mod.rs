//! Conformance checks that every plugin of a kind should pass, in the spirit of burn's
//! backend test-suite. Each check panics with a message that names the plugin and what it got
//! wrong; call them from a plugin crate's own tests.
//!
//! [`check_verifier`] and [`check_task`] need neither burn nor tokio: a reward or task crate
//! depends on `areal-testkit` with `default-features = false`. The generator, policy and
//! algorithm checks come with the `full` feature (on by default).

#[cfg(feature = "full")]
mod generator;
mod reward;
mod task;
#[cfg(feature = "full")]
mod train;

#[cfg(feature = "full")]
pub use generator::check_generator;
pub use reward::check_verifier;
pub use task::check_task;
#[cfg(feature = "full")]
pub use train::{check_algorithm, check_policy};
