//! The rollout controller: admits groups under the staleness rule, runs each on the group
//! runner, files accepted groups in the replay buffer, hands batches to the run, and carries
//! new weights to the generators through the interruption protocol.
//!
//! What crosses its boundary is plain data: batches of [`TrajectoryGroup`]s out, a
//! [`WeightUpdate`] in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use areal_sdk::{PluginError, SamplingParams, Split, Task, TrajectoryGroup, WeightUpdate};
use areal_sdk_train::Algorithm;
use tokio::sync::{Notify, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::buffer::ReplayBuffer;
use crate::config::Config;
use crate::error::EngineError;
use crate::group_runner::{GroupRunner, GroupSpec};
use crate::observer::{Observer, StopRequest};
use crate::order::DataOrder;
use crate::staleness::{AdmissionCounts, StalenessManager};

/// The controller of one run. Dropping it stops its admission loop.
pub(crate) struct Controller {
    inner: Arc<Inner>,
    admission_loop: Mutex<Option<JoinHandle<()>>>,
}

struct Inner {
    config: Config,
    runner: Arc<GroupRunner>,
    task: Arc<dyn Task>,
    algorithm: Arc<dyn Algorithm>,
    observer: Arc<dyn Observer>,
    admission: Mutex<StalenessManager>,
    admission_changed: Notify,
    buffer: ReplayBuffer,
    /// Set when the run ends or fails: the admission loop and a waiting batch stop.
    stop: watch::Sender<bool>,
    fatal: Mutex<Option<EngineError>>,
    consecutive_failures: AtomicUsize,
}

impl Controller {
    /// A controller for `config`'s `[rollout]` section; nothing is admitted before
    /// [`Controller::start`].
    pub(crate) fn new(
        config: &Config,
        runner: Arc<GroupRunner>,
        task: Arc<dyn Task>,
        algorithm: Arc<dyn Algorithm>,
        observer: Arc<dyn Observer>,
    ) -> Self {
        let r = &config.rollout;
        let admission = StalenessManager::new(
            r.batch_size as u64,
            r.max_staleness,
            r.max_concurrent as u64,
        );
        Self {
            inner: Arc::new(Inner {
                config: config.clone(),
                runner,
                task,
                algorithm,
                observer,
                admission: Mutex::new(admission),
                admission_changed: Notify::new(),
                buffer: ReplayBuffer::new(),
                stop: watch::Sender::new(false),
                fatal: Mutex::new(None),
                consecutive_failures: AtomicUsize::new(0),
            }),
            admission_loop: Mutex::new(None),
        }
    }

    /// The group runner (its generator, tokenizer, reward service and counters).
    pub(crate) fn runner(&self) -> &Arc<GroupRunner> {
        &self.inner.runner
    }

    /// The admission counters now.
    pub(crate) fn counts(&self) -> AdmissionCounts {
        self.inner.counts()
    }

    /// Groups waiting in the replay buffer.
    pub(crate) fn buffered(&self) -> usize {
        self.inner.buffer.len()
    }

    /// Start admitting groups (RL starts): generation may run ahead from here.
    pub(crate) fn start(&self) {
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
    }

    /// The next batch of `rollout.batch_size` groups, oldest first; `None` when `interrupt`
    /// is requested first; the error that stopped the controller if it failed.
    pub(crate) async fn next_batch(
        &self,
        interrupt: &StopRequest,
    ) -> Result<Option<Vec<TrajectoryGroup>>, EngineError> {
        let inner = &self.inner;
        let mut stop = inner.stop.subscribe();
        tokio::select! {
            groups = inner.buffer.take(inner.config.rollout.batch_size) => Ok(Some(groups)),
            () = interrupt.requested() => Ok(None),
            _ = stop.wait_for(|s| *s) => Err(inner
                .fatal
                .lock()
                .expect("fatal lock poisoned")
                .take()
                .unwrap_or_else(|| EngineError::internal("the rollout controller was stopped"))),
        }
    }

    /// The interruption protocol: pause the generator (in-flight samples come back
    /// interrupted and are resubmitted), load the weights, resume, and open admission for
    /// the new version.
    pub(crate) async fn publish(&self, weights: WeightUpdate) -> Result<(), EngineError> {
        let version = weights.version;
        let generator = self.inner.runner.generator();
        let paused = match generator.pause().await {
            Ok(()) => true,
            Err(e) if e.is_unsupported() => false,
            Err(e) => return Err(EngineError::plugin("pausing the generator", e)),
        };
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
        self.inner
            .admission
            .lock()
            .expect("admission lock poisoned")
            .set_version(version);
        self.inner.admission_changed.notify_waiters();
        Ok(())
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // a run dropped mid-way (a caller's timeout) must not leave groups generating
        self.inner.stop.send_replace(true);
    }
}

impl Inner {
    fn counts(&self) -> AdmissionCounts {
        self.admission
            .lock()
            .expect("admission lock poisoned")
            .counts()
    }

    fn fail(&self, error: EngineError) {
        let mut fatal = self.fatal.lock().expect("fatal lock poisoned");
        if fatal.is_none() {
            tracing::error!(target: "areal::engine", error = %crate::error::chain(&error), "run aborted");
            *fatal = Some(error);
        }
        drop(fatal);
        self.stop.send_replace(true);
    }
}

/// Admit a group whenever the staleness rule allows, each on its own task, until stopped.
async fn admission_loop(inner: Arc<Inner>) {
    let mut stop = inner.stop.subscribe();
    let mut tasks = JoinSet::new();
    let mut order = DataOrder::new(
        inner.task.len(Split::Train),
        areal_sdk::mix_seed(inner.config.seed, 6),
    );
    let r = inner.config.rollout.clone();
    let mut next_group = 0u64;
    loop {
        while tasks.try_join_next().is_some() {}
        if *stop.borrow() {
            tasks.abort_all();
            return;
        }
        let version = loop {
            let changed = inner.admission_changed.notified();
            let admitted = {
                let mut admission = inner.admission.lock().expect("admission lock poisoned");
                admission.try_admit().then(|| admission.counts())
            };
            if let Some(counts) = admitted {
                inner.observer.on_admission(&counts);
                break counts.version;
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
        let group_id = next_group;
        next_group += 1;
        let index = order.next_index();
        let spec = GroupSpec {
            group_id,
            group_size: r.group_size,
            max_new_tokens: r.max_new_tokens,
            sampling: SamplingParams {
                temperature: r.temperature,
                top_p: r.top_p,
                seed: inner.config.seed,
            },
            admitted_at: version,
        };
        tasks.spawn(group_task(inner.clone(), spec, index));
    }
}

/// Run one group to its end and settle its admission slot, whatever happens to it.
async fn group_task(inner: Arc<Inner>, spec: GroupSpec, index: u64) {
    let group_id = spec.group_id;
    // A separate task, so that a panicking plugin costs this group and not its slot.
    let group = tokio::spawn(run_group(inner.clone(), spec, index));
    let _abort = AbortOnDrop(group.abort_handle());
    let outcome = match group.await {
        Ok(outcome) => outcome,
        Err(e) => Err(PluginError::failed(
            "rollout",
            format!("the group's task failed: {e}"),
        )),
    };
    let accepted = match outcome {
        Ok(Some(group)) => {
            inner.consecutive_failures.store(0, Ordering::SeqCst);
            inner.buffer.push(group);
            true
        }
        Ok(None) => {
            inner.consecutive_failures.store(0, Ordering::SeqCst);
            false
        }
        Err(e) => {
            let failures = inner.consecutive_failures.fetch_add(1, Ordering::SeqCst) + 1;
            tracing::warn!(target: "areal::rollout", group_id, error = %crate::error::chain(&e), failures, "group failed; rejected");
            if failures >= inner.config.rollout.max_consecutive_failures {
                inner.fail(EngineError::plugin(
                    format!("{failures} groups in a row failed (rollout.max_consecutive_failures); the last error"),
                    e,
                ));
            }
            false
        }
    };
    inner
        .admission
        .lock()
        .expect("admission lock poisoned")
        .finish(accepted);
    inner.admission_changed.notify_waiters();
}

/// Generate and reward a group; `None` when the algorithm filtered it. A group whose every
/// sample lost its reward is an error (see [`GroupRunner::run_group`]).
async fn run_group(
    inner: Arc<Inner>,
    spec: GroupSpec,
    index: u64,
) -> Result<Option<TrajectoryGroup>, PluginError> {
    let group_id = spec.group_id;
    let item = inner.task.item(Split::Train, index)?;
    let group = inner.runner.run_group(spec, item).await?;
    let kept = inner.algorithm.keep_group(&group);
    if !kept {
        tracing::debug!(target: "areal::rollout", group_id, "group filtered by the algorithm");
    }
    Ok(kept.then_some(group))
}

/// Aborts a task when dropped (when the task awaiting it is aborted at the end of a run).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
