//! The rollout controller: admits groups under the staleness rule, runs each on the group
//! runner, files accepted groups in the replay buffer, hands batches to the run, and carries
//! new weights to the generators through the interruption protocol.
//!
//! What crosses its boundary is plain data: batches of [`TrajectoryGroup`]s out, a
//! [`WeightUpdate`] in, and the [`RolloutSnapshot`] a checkpoint holds. Every group, with
//! the progress of each of its samples, lives in one [`RolloutState`] under one lock.
//!
//! By default groups run as tasks of their own, as fast as the generator serves them. In
//! deterministic mode they run in rounds instead ([`crate::lockstep`]), over the same state.

use std::sync::{Arc, Mutex};

use areal_sdk::{PluginError, Split, Task, TrajectoryGroup, WeightUpdate};
use areal_sdk_train::Algorithm;
use tokio::task::{JoinHandle, JoinSet};

use crate::config::Config;
use crate::error::EngineError;
use crate::group_runner::GroupRunner;
use crate::lockstep::Lockstep;
use crate::observer::{Observer, StopRequest};
use crate::rollout::{RolloutSnapshot, RolloutState, RunningGroup, SampleLedger};
use crate::shared::{Recorder, Shared};
use crate::staleness::AdmissionCounts;

/// The controller of one run. Dropping it stops its admission loop.
pub(crate) struct Controller {
    inner: Arc<Shared>,
    admission_loop: Mutex<Option<JoinHandle<()>>>,
    /// Deterministic mode's rounds, with the episodes waiting between batches.
    lockstep: tokio::sync::Mutex<Lockstep>,
}

impl Controller {
    /// A controller for `config`'s `[rollout]` section, starting from `state` (fresh, or a
    /// checkpoint's); nothing is admitted before [`Controller::start`].
    pub(crate) fn new(
        config: &Config,
        runner: Arc<GroupRunner>,
        task: Arc<dyn Task>,
        algorithm: Arc<dyn Algorithm>,
        observer: Arc<dyn Observer>,
        state: RolloutState,
    ) -> Self {
        Self {
            inner: Arc::new(Shared::new(
                config, runner, task, algorithm, observer, state,
            )),
            admission_loop: Mutex::new(None),
            lockstep: tokio::sync::Mutex::new(Lockstep::default()),
        }
    }

    /// The group runner (its generator, tokenizer, reward service and counters).
    pub(crate) fn runner(&self) -> &Arc<GroupRunner> {
        &self.inner.runner
    }

    /// The admission counters now.
    pub(crate) fn counts(&self) -> AdmissionCounts {
        self.inner.state().counts()
    }

    /// Groups waiting in the replay buffer.
    pub(crate) fn buffered(&self) -> usize {
        self.inner.state().buffered()
    }

    /// What became of the samples admitted so far.
    pub(crate) fn ledger(&self) -> SampleLedger {
        self.inner.state().ledger()
    }

    /// Start admitting groups (RL starts): generation may run ahead from here. The groups a
    /// checkpoint had in flight go on first. In deterministic mode nothing runs until a batch
    /// is asked for.
    pub(crate) fn start(&self) {
        if self.inner.config.deterministic {
            return;
        }
        let task = tokio::spawn(admission_loop(self.inner.clone()));
        *self.admission_loop.lock().expect("controller lock") = Some(task);
    }

    /// Stop admitting, abort the groups in flight and wait for the admission loop to end.
    pub(crate) async fn shutdown(&self) {
        self.inner.stop.send_replace(true);
        let task = self.admission_loop.lock().expect("controller lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
        // the episodes waiting for a round
        *self.lockstep.lock().await = Lockstep::default();
    }

    /// The next batch of `rollout.batch_size` groups, oldest first; `None` when `interrupt`
    /// is requested first; the error that stopped the controller if it failed.
    pub(crate) async fn next_batch(
        &self,
        interrupt: &StopRequest,
    ) -> Result<Option<Vec<TrajectoryGroup>>, EngineError> {
        let inner = &self.inner;
        if inner.config.deterministic {
            return self
                .lockstep
                .lock()
                .await
                .next_batch(inner, interrupt)
                .await;
        }
        let mut stop = inner.stop.subscribe();
        let batch = inner.config.rollout.batch_size;
        loop {
            let changed = inner.changed.notified();
            if let Some(groups) = inner.state().take(batch) {
                return Ok(Some(groups));
            }
            tokio::select! {
                () = changed => {}
                () = interrupt.requested() => return Ok(None),
                _ = stop.wait_for(|s| *s) => return Err(inner.take_fatal()),
            }
        }
    }

    /// The interruption protocol: pause the generator (in-flight samples come back
    /// interrupted and are resubmitted), load the weights, resume, and open admission for
    /// the new version. With `snapshot`, the rollout state is copied while the generator is
    /// paused, so that it holds the partial samples (and is returned, at the new version).
    pub(crate) async fn publish(
        &self,
        weights: WeightUpdate,
        snapshot: bool,
    ) -> Result<Option<RolloutSnapshot>, EngineError> {
        let version = weights.version;
        let generator = self.inner.runner.generator();
        let paused = self.pause().await?;
        let taken = snapshot.then(|| self.inner.state().snapshot());
        generator.update_weights(weights).await.map_err(|e| {
            EngineError::plugin(
                format!("loading weights of version {version} into the generator"),
                e,
            )
        })?;
        if paused {
            generator
                .resume()
                .await
                .map_err(|e| EngineError::plugin("resuming the generator", e))?;
        }
        self.inner.state().set_version(version);
        self.inner.changed.notify_waiters();
        Ok(taken.map(|mut s| {
            s.counts.version = version;
            s
        }))
    }

    /// A copy of the rollout state now.
    pub(crate) fn snapshot(&self) -> RolloutSnapshot {
        self.inner.state().snapshot()
    }

    /// The rollout state as the run stops: the generator is paused first, so that the
    /// samples in flight hand back what they have (it is not resumed).
    pub(crate) async fn final_snapshot(&self) -> Result<RolloutSnapshot, EngineError> {
        self.pause().await?;
        Ok(self.inner.state().snapshot())
    }

    /// Pause the generator, unless the run is deterministic (then nothing generates between
    /// batches) or the generator cannot pause; whether it was paused.
    async fn pause(&self) -> Result<bool, EngineError> {
        if self.inner.config.deterministic {
            return Ok(false);
        }
        match self.inner.runner.generator().pause().await {
            Ok(()) => Ok(true),
            Err(e) if e.is_unsupported() => Ok(false),
            Err(e) => Err(EngineError::plugin("pausing the generator", e)),
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // a run dropped mid-way (a caller's timeout) must not leave groups generating
        self.inner.stop.send_replace(true);
    }
}

/// Admit a group whenever the staleness rule allows, each on its own task, until stopped.
async fn admission_loop(inner: Arc<Shared>) {
    let mut stop = inner.stop.subscribe();
    let mut tasks = JoinSet::new();
    let restored: Vec<RunningGroup> = inner.state().running().cloned().collect();
    for group in restored {
        tasks.spawn(group_task(inner.clone(), group));
    }
    loop {
        while tasks.try_join_next().is_some() {}
        if *stop.borrow() {
            tasks.abort_all();
            return;
        }
        let group = loop {
            let changed = inner.changed.notified();
            if let Some(group) = inner.admit() {
                break group;
            }
            tokio::select! {
                _ = changed => {}
                _ = stop.wait_for(|s| *s) => {
                    tasks.abort_all();
                    return;
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        };
        tasks.spawn(group_task(inner.clone(), group));
    }
}

/// Run one group to its end and settle its admission slot, whatever happens to it.
async fn group_task(inner: Arc<Shared>, group: RunningGroup) {
    let group_id = group.spec.group_id;
    // A separate task, so that a panicking plugin costs this group and not its slot.
    let run = tokio::spawn(run_group(inner.clone(), group));
    let _abort = AbortOnDrop(run.abort_handle());
    let result = match run.await {
        Ok(result) => result,
        Err(e) => Err(PluginError::failed(
            "rollout",
            format!("the group's task failed: {e}"),
        )),
    };
    inner.settle(group_id, result);
}

/// Generate and reward a group from where its samples are; `None` when the algorithm
/// filtered it. A group whose every sample lost its reward is an error (see
/// [`GroupRunner::run_group`]).
async fn run_group(
    inner: Arc<Shared>,
    group: RunningGroup,
) -> Result<Option<TrajectoryGroup>, PluginError> {
    let item = inner.task.item(Split::Train, group.item_index)?;
    let progress = Arc::new(Recorder {
        inner: inner.clone(),
        group_id: group.spec.group_id,
    });
    let trained = inner
        .runner
        .run_group_from(group.spec, Arc::new(item), group.samples, progress)
        .await?;
    Ok(inner.keep(trained))
}

/// Aborts a task when dropped (when the task awaiting it is aborted at the end of a run).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
