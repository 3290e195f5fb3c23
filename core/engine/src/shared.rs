//! What the controller's tasks and deterministic mode's rounds share: the run's plugins for
//! rollouts, the rollout state under its lock, and how a group is admitted, kept or settled.

use std::sync::{Arc, Mutex, MutexGuard};

use areal_sdk::{Completion, PluginError, Reward, Task, TrajectoryGroup, TurnReward};
use areal_sdk_train::Algorithm;
use tokio::sync::{Notify, watch};

use crate::config::Config;
use crate::error::EngineError;
use crate::group_runner::{GroupRunner, Progress, TurnEnd};
use crate::observer::Observer;
use crate::rollout::{Outcome, RolloutState, RunningGroup};

/// The controller's shared part.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) runner: Arc<GroupRunner>,
    pub(crate) task: Arc<dyn Task>,
    pub(crate) algorithm: Arc<dyn Algorithm>,
    pub(crate) observer: Arc<dyn Observer>,
    state: Mutex<RolloutState>,
    /// The state changed: a slot freed, a version published, a group buffered.
    pub(crate) changed: Notify,
    /// Set when the run ends or fails: the admission loop and a waiting batch stop.
    pub(crate) stop: watch::Sender<bool>,
    fatal: Mutex<Option<EngineError>>,
}

impl Shared {
    /// The shared part of a controller for `config`, starting from `state`.
    pub(crate) fn new(
        config: &Config,
        runner: Arc<GroupRunner>,
        task: Arc<dyn Task>,
        algorithm: Arc<dyn Algorithm>,
        observer: Arc<dyn Observer>,
        state: RolloutState,
    ) -> Self {
        Self {
            config: config.clone(),
            runner,
            task,
            algorithm,
            observer,
            state: Mutex::new(state),
            changed: Notify::new(),
            stop: watch::Sender::new(false),
            fatal: Mutex::new(None),
        }
    }

    /// The rollout state, locked.
    pub(crate) fn state(&self) -> MutexGuard<'_, RolloutState> {
        self.state.lock().expect("rollout state lock poisoned")
    }

    /// Stop the run with `error` (the first one given is kept).
    pub(crate) fn fail(&self, error: EngineError) {
        let mut fatal = self.fatal.lock().expect("fatal lock poisoned");
        if fatal.is_none() {
            tracing::error!(target: "areal::engine", error = %crate::error::chain(&error), "run aborted");
            *fatal = Some(error);
        }
        drop(fatal);
        self.stop.send_replace(true);
    }

    /// The error that stopped the controller, if it was stopped.
    pub(crate) fn stopped(&self) -> Option<EngineError> {
        let stopped = *self.stop.borrow();
        stopped.then(|| self.take_fatal())
    }

    /// The error that stopped the controller.
    pub(crate) fn take_fatal(&self) -> EngineError {
        self.fatal
            .lock()
            .expect("fatal lock poisoned")
            .take()
            .unwrap_or_else(|| EngineError::internal("the rollout controller was stopped"))
    }

    /// Admit a group if the staleness rule allows it.
    pub(crate) fn admit(&self) -> Option<RunningGroup> {
        let admitted = {
            let mut state = self.state();
            state.admit().map(|group| (group, state.counts()))
        };
        let (group, counts) = admitted?;
        self.observer.on_admission(&counts);
        Some(group)
    }

    /// Group `group_id` ended with `result` (the group, `None` if the algorithm filtered it,
    /// or why it failed): settle its slot; too many failures in a row stop the run.
    pub(crate) fn settle(
        &self,
        group_id: u64,
        result: Result<Option<TrajectoryGroup>, PluginError>,
    ) {
        let (outcome, error) = match result {
            Ok(Some(group)) => (Outcome::Accepted(group), None),
            Ok(None) => (Outcome::Filtered, None),
            Err(e) => (Outcome::Failed, Some(e)),
        };
        let failures = self.state().settle(group_id, outcome);
        if let Some(e) = error {
            tracing::warn!(target: "areal::rollout", group_id, error = %crate::error::chain(&e), failures, "group failed; rejected");
            if failures >= self.config.rollout.max_consecutive_failures {
                self.fail(EngineError::plugin(
                    format!("{failures} groups in a row failed (rollout.max_consecutive_failures); the last error"),
                    e,
                ));
            }
        }
        self.changed.notify_waiters();
    }

    /// The algorithm's verdict on a finished group: kept, or filtered (`None`).
    pub(crate) fn keep(&self, group: TrajectoryGroup) -> Option<TrajectoryGroup> {
        let kept = self.algorithm.keep_group(&group);
        if !kept {
            tracing::debug!(target: "areal::rollout", group_id = group.group_id, "group filtered by the algorithm");
        }
        kept.then_some(group)
    }
}

/// Records a group's progress in the rollout state.
pub(crate) struct Recorder {
    pub(crate) inner: Arc<Shared>,
    pub(crate) group_id: u64,
}

impl Progress for Recorder {
    fn extended(&self, j: usize, part: &Completion, end: Option<TurnEnd>) {
        self.inner.state().extended(self.group_id, j, part, end);
        // between a part and what follows it (the turn's end, the reward)
        crate::failpoint::stall("rollout");
    }

    fn turn_ended(&self, j: usize, end: TurnEnd) {
        self.inner.state().turn_ended(self.group_id, j, end);
    }

    fn finished(&self, j: usize, reward: &Reward) {
        self.inner.state().finished(self.group_id, j, reward);
    }

    fn split(&self, j: usize, turn_rewards: &[TurnReward]) {
        self.inner.state().split(self.group_id, j, turn_rewards);
    }

    fn restarted(&self, j: usize) {
        self.inner.state().restarted(self.group_id, j);
    }

    fn withdrawn(&self, j: usize, len: usize) {
        self.inner.state().withdrawn(self.group_id, j, len);
    }
}
