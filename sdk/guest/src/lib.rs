//! Write an areal-rs reward in Rust and build it as a WebAssembly component.
//!
//! The component is loaded at run time by `[reward] kind = "wasm"`, `path = "my_reward.wasm"`:
//! no rebuilt `areal`, and the reward runs in the sandbox (its own memory, a CPU and a memory
//! limit, no files, network or environment). Implement [`Reward`] and name the type in
//! [`export!`]:
//!
//! ```ignore
//! use areal_reward_guest::{Outcome, Reward, Sample, Verdict};
//!
//! struct Exact;
//!
//! impl Reward for Exact {
//!     fn configure(_options: serde_json::Value) -> Result<Self, String> {
//!         Ok(Exact)
//!     }
//!     fn score(&self, sample: &Sample) -> Result<Outcome, String> {
//!         let want = sample.reference.as_str().ok_or("the reference is not a string")?;
//!         Ok(if sample.completion.trim() == want {
//!             Outcome::new(1.0, Verdict::Accepted)
//!         } else {
//!             Outcome::new(0.0, Verdict::WrongAnswer)
//!         })
//!     }
//! }
//!
//! areal_reward_guest::export!(Exact);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` in a crate of
//! `crate-type = ["cdylib"]`; the `.wasm` under `target/wasm32-wasip2/release/` is the
//! component. The contract itself is `wit/reward.wit` (package `areal:reward`), for components
//! written in other languages.
//!
//! Tools the policy calls in its episodes are written the same way: [`tool::Tool`] and
//! [`export_tool!`].
//!
//! Each sample runs in a fresh instance: [`Reward::configure`] runs, then [`Reward::score`],
//! and nothing survives to the next sample. `configure` also runs once when the run starts,
//! so options it refuses stop the run with its message.

use serde_json::{Map, Value};

pub mod tool;

#[doc(hidden)]
#[allow(
    clippy::too_many_arguments,
    missing_docs,
    unreachable_pub,
    reason = "generated code"
)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "reward",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "__export_reward_world",
        default_bindings_module: "areal_reward_guest::bindings",
    });
}

use bindings::areal::reward::types as wit;

/// What a reward concluded: the WIT contract's own `verdict` (`Accepted`, `Partial`,
/// `WrongAnswer`, `NoAnswer`, `NoCode`, `RuntimeError`, `TimeLimit`, `MemoryLimit`,
/// `OutputLimit`).
pub use wit::Verdict;

/// One sample to score.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The prompt text.
    pub prompt: String,
    /// The decoded completion.
    pub completion: String,
    /// The task's reference for the item.
    pub reference: Value,
    /// `item_id`, `finish_reason`, `completion_tokens`, `data_source` and the caller's own
    /// keys (not the sample's id: a reward belongs to the sample's content).
    pub metadata: Map<String, Value>,
}

/// A sample's reward: the value, the verdict and details for the provenance.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The scalar the trainer sees (must be finite).
    pub reward: f64,
    /// What it means.
    pub verdict: Verdict,
    /// What is worth recording.
    pub details: Map<String, Value>,
}

impl Outcome {
    /// A reward of `reward` with `verdict` and no details.
    pub fn new(reward: f64, verdict: Verdict) -> Self {
        Self {
            reward,
            verdict,
            details: Map::new(),
        }
    }

    /// Record a detail.
    pub fn with_detail(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }
}

/// A reward: built from its options, then asked to score a sample.
pub trait Reward: Sized + 'static {
    /// Check the options (the `options` table of the `[reward]` section; `{}` when absent)
    /// and build the reward. An error stops the run at start with this message.
    fn configure(options: Value) -> Result<Self, String>;

    /// Score one sample. A wrong answer is `Ok` with a low reward; an error costs this sample
    /// only (verdict `error`, the message in its provenance). A panic is a trap: the same.
    fn score(&self, sample: &Sample) -> Result<Outcome, String>;
}

#[doc(hidden)]
pub mod __private {
    use std::cell::RefCell;

    use super::*;
    pub use bindings::Guest;

    thread_local! {
        // A component instance is single-threaded and lives for one sample.
        static CONFIGURED: RefCell<Option<Box<dyn std::any::Any>>> = const { RefCell::new(None) };
    }

    pub fn configure<R: Reward>(options: String) -> Result<(), String> {
        let options: Value = if options.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            serde_json::from_str(&options).map_err(|e| format!("options are not JSON: {e}"))?
        };
        let reward = R::configure(options)?;
        CONFIGURED.with(|c| *c.borrow_mut() = Some(Box::new(reward)));
        Ok(())
    }

    pub fn score<R: Reward>(sample: wit::Sample) -> Result<wit::Outcome, String> {
        let sample = Sample {
            reference: serde_json::from_str(&sample.reference)
                .map_err(|e| format!("the reference is not JSON: {e}"))?,
            metadata: match serde_json::from_str(&sample.metadata) {
                Ok(Value::Object(m)) => m,
                Ok(_) | Err(_) => Map::new(),
            },
            prompt: sample.prompt,
            completion: sample.completion,
        };
        let outcome = CONFIGURED.with(|c| {
            let c = c.borrow();
            let reward = c
                .as_ref()
                .and_then(|r| r.downcast_ref::<R>())
                .ok_or("score was called before configure")?;
            reward.score(&sample)
        })?;
        Ok(wit::Outcome {
            reward: outcome.reward,
            verdict: outcome.verdict,
            details: (!outcome.details.is_empty())
                .then(|| Value::Object(outcome.details).to_string()),
        })
    }
}

/// Export a [`Reward`] as the component's `areal:reward` world.
#[macro_export]
macro_rules! export {
    ($reward:ty) => {
        #[doc(hidden)]
        struct __ArealRewardExport;

        impl $crate::__private::Guest for __ArealRewardExport {
            fn configure(options: ::std::string::String) -> ::std::result::Result<(), ::std::string::String> {
                $crate::__private::configure::<$reward>(options)
            }
            fn score(
                sample: $crate::bindings::areal::reward::types::Sample,
            ) -> ::std::result::Result<$crate::bindings::areal::reward::types::Outcome, ::std::string::String> {
                $crate::__private::score::<$reward>(sample)
            }
        }

        $crate::bindings::__export_reward_world!(__ArealRewardExport with_types_in $crate::bindings);
    };
}
