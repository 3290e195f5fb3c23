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
//! use areal_core::{ConfigLoader, RunOptions, resolve, run};
//! # use areal_testkit as _;
//! # use areal_algo_ppo as _;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let (config, plugins) = resolve(&ConfigLoader::new().set("train.steps=5")?)?;
//! let summary = run(config, plugins, RunOptions::default()).await?;
//! println!("final accuracy {:?}", summary.final_accuracy);
//! # Ok(())
//! # }
//! ```

pub mod atomic;
mod buffer;
mod checkpoint;
pub mod config;
mod context;
mod controller;
mod episode;
mod error;
pub mod eval;
mod failpoint;
mod fingerprint;
mod group_runner;
mod ids;
mod lockstep;
mod manifest;
pub mod metrics;
mod observer;
mod order;
pub mod packing;
pub mod plot;
mod plugins;
pub mod processes;
mod resume;
mod reward_cache;
mod reward_service;
pub mod reward_workers;
mod rl;
mod rollout;
mod run;
mod runlog;
mod shared;
mod staleness;
mod summary;
pub mod tensorboard;
pub mod trainer;
mod warmup;
mod worker;

pub use buffer::ReplayBuffer;
pub use config::{
    Config, ConfigChange, ConfigError, ConfigLoader, ConfigProblem, FIXED_ON_RESUME, LagPolicy,
    Origin, PromptConfig, PromptFormat, ResumeRefusal, RewardServiceConfig, WarmupConfig,
    config_changes, resume_changes,
};
pub use error::{EngineError, chain};
pub use group_runner::{GroupCounters, GroupRunner, GroupSpec};
pub use ids::IdRanges;
pub use metrics::{EvalMetrics, StalenessStats, StepMetrics, WarmupMetrics, WarmupReport};
pub use observer::{Observer, Quiet, RunOptions, StopRequest};
pub use plugins::{
    Plugins, policy_tokenizer, resolve, resolve_generator, resolve_reward, resolve_tools,
};
pub use processes::{ProcessError, ServerProcesses, TOKEN_ENV};
pub use reward_cache::RewardCache;
pub use reward_service::{RewardService, Verified};
pub use run::run;
pub use runlog::{LAUNCH_DIR, prepare_run_folder};
pub use staleness::{AdmissionCounts, StalenessManager};
pub use summary::RunSummary;
pub use trainer::{LogprobGap, OffPolicyStats};

use areal_sdk::PluginInfo;

/// Every plugin linked into this binary, sorted by kind and name.
pub fn registered_plugins() -> Vec<PluginInfo> {
    let mut all = areal_sdk::registry::registered();
    all.extend(areal_sdk_train::registry::registered());
    all.sort();
    all
}

/// Entry points of the fuzz targets (`tests/fuzz`), not an API.
#[doc(hidden)]
pub mod fuzz {
    /// Read a checkpoint's `state.json` and check it as a resume does: `Ok` when a run could go
    /// on from it.
    pub fn checkpoint_state(bytes: &[u8]) -> Result<(), String> {
        crate::resume::parse_state(bytes).map(drop)
    }
}
