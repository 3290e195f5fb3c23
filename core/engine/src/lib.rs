//! The asynchronous RL engine of areal-rs.
//!
//! Generation never waits for training and training never waits for the slowest generation.
//! The rollout controller admits a new rollout (a group of samples for one prompt) only while
//! the staleness rule allows it ([`StalenessManager`]); generator plugins sample tokens and
//! record the behaviour logprob and policy version of each; the reward service verifies
//! samples on its own threads under a deadline; accepted groups wait in the
//! [`ReplayBuffer`], oldest first; the trainer packs them, recomputes proximal logprobs,
//! asks the algorithm for advantages and a loss, steps the optimizer and pushes the new
//! weights to the generators through the interruption protocol.
//!
//! ```no_run
//! use areal_core::{ConfigLoader, Plugins, RunOptions, run};
//! # use areal_testkit as _;
//! # use areal_algo_ppo as _;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = ConfigLoader::new().set("train.steps=5")?.load()?;
//! let plugins = Plugins::build(&config)?;
//! let summary = run(config, plugins, RunOptions::default()).await?;
//! println!("final accuracy {:?}", summary.final_accuracy);
//! # Ok(())
//! # }
//! ```

pub mod atomic;
mod buffer;
pub mod config;
mod device;
mod engine;
mod error;
pub mod eval;
pub mod metrics;
pub mod packing;
pub mod plot;
mod reward_service;
mod rollout;
mod runlog;
mod staleness;
pub mod tensorboard;
pub mod trainer;
pub mod warmup;

pub use buffer::ReplayBuffer;
pub use config::{Config, ConfigError, ConfigLoader, ConfigProblem, Origin};
pub use device::parse_device;
pub use engine::{Observer, Plugins, Quiet, RunOptions, RunSummary, StopRequest, run};
pub use error::EngineError;
pub use metrics::{EvalMetrics, StalenessStats, StepMetrics};
pub use reward_service::{RewardService, Verified};
pub use rollout::{GroupSpec, Rollout, RolloutCounters};
pub use staleness::{AdmissionCounts, StalenessManager};
pub use warmup::{WarmupConfig, WarmupMetrics, WarmupReport};

use areal_sdk::PluginInfo;

/// Every plugin linked into this binary, sorted by kind and name.
pub fn registered_plugins() -> Vec<PluginInfo> {
    let mut all = areal_sdk::registry::registered();
    all.extend(areal_sdk_train::registry::registered());
    all.sort();
    all
}
