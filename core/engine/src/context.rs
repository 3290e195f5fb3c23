//! What the stages of a run share: the config, the controller, the compute worker, the run
//! folder's log and the observer.

use std::sync::Arc;
use std::time::Instant;

use areal_sdk::{PolicyVersion, Split, Task};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::controller::Controller;
use crate::error::EngineError;
use crate::eval::{EvalSpec, evaluate};
use crate::metrics::EvalMetrics;
use crate::observer::{Observer, StopRequest};
use crate::runlog::RunLog;
use crate::worker::ComputeWorker;

/// The parts of a run, handed from stage to stage.
pub(crate) struct RunContext {
    pub(crate) config: Config,
    pub(crate) task: Arc<dyn Task>,
    /// The algorithm's name, for the summary.
    pub(crate) algorithm: String,
    pub(crate) controller: Controller,
    pub(crate) worker: ComputeWorker,
    pub(crate) observer: Arc<dyn Observer>,
    pub(crate) log: RunLog,
    /// When this process started the run (`wall_s` of every record counts from it, after
    /// `elapsed_before`).
    pub(crate) started: Instant,
    /// Seconds the run had run before this process (when resumed).
    pub(crate) elapsed_before: f64,
    /// A clean stop asked from outside (a signal).
    pub(crate) interrupt: StopRequest,
    /// Every held-out evaluation so far.
    pub(crate) evals: Vec<EvalMetrics>,
    /// The sha256 of the task's data (the warm-up cache and checkpoints are keyed by it).
    pub(crate) task_fingerprint: String,
    /// How many times the run was resumed.
    pub(crate) resumes: u64,
    /// The resume checkpoints written so far.
    pub(crate) checkpoints: CheckpointStats,
}

impl RunContext {
    /// The reward's identity beyond its config section (a plugin file's sha256...), as its
    /// verifier names it for caches.
    pub(crate) fn reward_identity(&self) -> Option<String> {
        self.controller
            .runner()
            .rewards()
            .verifier()
            .cache_identity()
    }

    /// Seconds since the run started (earlier processes of a resumed run included).
    pub(crate) fn wall_s(&self) -> f64 {
        self.elapsed_before + self.started.elapsed().as_secs_f64()
    }

    /// Load the worker's weights into the generator as `version`, outside RL (no pause: no
    /// group is generating).
    pub(crate) async fn load_generator(
        &self,
        version: PolicyVersion,
        what: &str,
    ) -> Result<(), EngineError> {
        let weights = self.worker.weights(version).await?;
        self.controller
            .runner()
            .generator()
            .update_weights(weights)
            .await
            .map_err(|e| EngineError::plugin(format!("loading {what} into the generator"), e))
    }

    /// Greedy pass@1 over `split` (at most `eval.max_items` items) with the generator's
    /// current weights.
    pub(crate) async fn evaluate(
        &self,
        split: Split,
        step: u64,
        version: PolicyVersion,
    ) -> Result<EvalMetrics, EngineError> {
        let spec = EvalSpec::greedy(&self.config, split, self.config.eval.max_items);
        let outcome = evaluate(&self.task, self.controller.runner(), &spec).await?;
        Ok(EvalMetrics {
            step,
            policy_version: version,
            wall_s: self.wall_s(),
            accuracy: outcome.accuracy,
            reward_mean: outcome.reward_mean,
            items: outcome.items,
            failures: outcome.failures,
        })
    }

    /// A held-out evaluation, recorded, plotted and reported.
    pub(crate) async fn eval(
        &mut self,
        step: u64,
        version: PolicyVersion,
    ) -> Result<(), EngineError> {
        let m = self.evaluate(Split::Eval, step, version).await?;
        tracing::info!(target: "areal::eval", step, policy_version = version, accuracy = m.accuracy, reward_mean = m.reward_mean, "eval");
        self.log.record("eval", &m)?;
        self.log.eval_point(m.wall_s, m.accuracy)?;
        self.observer.on_eval(&m);
        self.evals.push(m);
        Ok(())
    }
}

/// The resume checkpoints a run wrote, for its summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct CheckpointStats {
    /// How many.
    pub(crate) written: u64,
    /// Their total and largest writing time, in milliseconds.
    pub(crate) ms_sum: f64,
    pub(crate) ms_max: f64,
    /// Bytes of the largest one.
    pub(crate) bytes: u64,
    /// False once the policy said it cannot save its training state.
    #[serde(skip, default = "yes")]
    pub(crate) possible: bool,
}

fn yes() -> bool {
    true
}

impl Default for CheckpointStats {
    fn default() -> Self {
        Self {
            written: 0,
            ms_sum: 0.0,
            ms_max: 0.0,
            bytes: 0,
            possible: true,
        }
    }
}
