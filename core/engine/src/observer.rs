//! Following and steering a run from outside: observer hooks, the run's options and a
//! clean-stop request.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use areal_sdk::{PolicyVersion, TrajectoryGroup, WeightUpdate};
use tokio::sync::watch;

use crate::metrics::{EvalMetrics, StepMetrics, WarmupMetrics};
use crate::staleness::AdmissionCounts;

/// Hooks to follow a run (progress bars, tests). Called from the controller's tasks and the
/// run's stages, on the runtime's threads, hence `&self`.
pub trait Observer: Send + Sync {
    /// The run starts and will train `steps` steps.
    fn on_start(&self, steps: u64) {
        let _ = steps;
    }

    /// The weights generators sample from: version 0 when RL starts (after warm-up and the
    /// baseline evaluation, just before the first rollout), then each step's new version once
    /// the generators have it.
    fn on_weights(&self, update: &WeightUpdate) {
        let _ = update;
    }

    /// A rollout was admitted; `counts` are the counters right after admission.
    fn on_admission(&self, counts: &AdmissionCounts) {
        let _ = counts;
    }

    /// A step trained on `groups` with the weights at `version`.
    fn on_trained(&self, groups: &[TrajectoryGroup], version: PolicyVersion) {
        let _ = (groups, version);
    }

    /// A step finished.
    fn on_step(&self, metrics: &StepMetrics) {
        let _ = metrics;
    }

    /// An evaluation finished.
    fn on_eval(&self, metrics: &EvalMetrics) {
        let _ = metrics;
    }

    /// A warm-up evaluation finished.
    fn on_warmup(&self, metrics: &WarmupMetrics) {
        let _ = metrics;
    }
}

/// An observer that does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl Observer for Quiet {}

/// How to run.
#[derive(Clone)]
pub struct RunOptions {
    /// Run folder for `config.toml`, `metrics.jsonl`, `summary.json` and the checkpoint.
    pub out_dir: Option<PathBuf>,
    /// Progress hooks.
    pub observer: Arc<dyn Observer>,
    /// When the run started, for `wall_seconds` (the process start, say). By default now.
    pub started: Instant,
    /// Asks the run to stop cleanly (`areal train` requests it on SIGINT and SIGTERM).
    pub stop: StopRequest,
    /// Go on with the run in `out_dir` from its newest sound checkpoint (from its start when it
    /// has none) instead of starting a new one there. The config must be the run's own
    /// (`areal train --resume` checks it: [`crate::config_changes`]).
    pub resume: bool,
    /// With `resume`: go on even though the task's data changed since the checkpoint.
    pub allow_changes: bool,
    /// A new run in an `out_dir` that is not empty deletes what a run writes there (records,
    /// events, plots, summary, checkpoints) and starts afresh. By default such a folder is
    /// refused, and nothing in it is touched.
    pub overwrite: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            out_dir: None,
            observer: Arc::new(Quiet),
            started: Instant::now(),
            stop: StopRequest::new(),
            resume: false,
            allow_changes: false,
            overwrite: false,
        }
    }
}

/// A request to stop a run cleanly: the warm-up or training step in progress finishes (a
/// step still waiting for its batch is dropped), no further evaluation runs, and the
/// checkpoint and `summary.json` are written (`interrupted: true`). Clones share the request.
#[derive(Clone, Debug)]
pub struct StopRequest(Arc<watch::Sender<bool>>);

impl StopRequest {
    /// A request not yet made.
    pub fn new() -> Self {
        Self(Arc::new(watch::Sender::new(false)))
    }

    /// Ask the run to stop.
    pub fn request(&self) {
        self.0.send_replace(true);
    }

    /// Whether it was asked to stop.
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Wait until it is asked to stop.
    pub async fn requested(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

impl Default for StopRequest {
    fn default() -> Self {
        Self::new()
    }
}
