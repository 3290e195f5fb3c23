//! Deterministic mode's schedule: generation in rounds, over the controller's rollout state.
//!
//! A round admits every group the staleness rule allows and starts an episode task for each of
//! their samples; it then waits until every episode at work waits for a turn or has ended
//! (what an episode does between turns, its tools and its reward, happens here), files the
//! groups that are complete, oldest first, and hands the turns waiting to the generator
//! together, at most `rollout.chunk_tokens` tokens each, with the weights it holds
//! ([`Rounds`]). Rounds run until `rollout.batch_size` groups are buffered; the trainer then
//! trains on them and publishes new weights, which the next round uses. With
//! `rollout.generate_ahead`, rounds run instead until nothing more may be admitted and every
//! group admitted has ended, as if generation took no time: each batch is then the oldest
//! of `(max_staleness + 1) · batch_size` groups, its samples `max_staleness` versions old. A
//! turn longer than a chunk spans rounds, and so versions, exactly as an interrupted turn
//! does by default.
//!
//! Nothing here depends on timing: which tokens a version samples follows from the rounds
//! alone, and each round's chunks reach the generator together, in sample order
//! ([`Generator::generate_batch`](areal_sdk::Generator::generate_batch)), so a generator that
//! batches them does so the same way every time and its rounding is the same too. Between
//! batches every episode waits for a turn or has ended and its tokens so far are recorded, so
//! the rollout state is whole when a checkpoint copies it; a resumed episode replays its
//! record ([`crate::episode`]) to the same place.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use areal_sdk::{PluginError, Reward, Split, TaskItem, Trajectory, TrajectoryGroup};
use tokio::task::JoinHandle;

use crate::episode::{EpisodeRun, Rounds, Sampler};
use crate::error::EngineError;
use crate::group_runner::assemble;
use crate::observer::StopRequest;
use crate::rollout::RunningGroup;
use crate::shared::{Recorder, Shared};

/// The rounds of a run in deterministic mode: the episodes in flight, between batches too.
#[derive(Default)]
pub(crate) struct Lockstep {
    rounds: Arc<Rounds>,
    /// Each started group's item, prompt and episode tasks.
    started: BTreeMap<u64, Started>,
    /// Groups whose episode failed, with the first error.
    failed: Arc<Mutex<BTreeMap<u64, PluginError>>>,
}

struct Started {
    item: Arc<TaskItem>,
    prompt: Arc<Vec<u32>>,
    tasks: Vec<JoinHandle<()>>,
    rounds: Arc<Rounds>,
    sample_ids: Vec<u64>,
}

impl Drop for Started {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        // an aborted task lets go of its turn when the runtime drops it, which may be after
        // the next round is gathered: take its turns out now, so that every round is the same
        self.rounds.forget(&self.sample_ids);
    }
}

impl Lockstep {
    /// Run rounds until a batch is buffered; `None` when `interrupt` is requested first.
    pub(crate) async fn next_batch(
        &mut self,
        inner: &Arc<Shared>,
        interrupt: &StopRequest,
    ) -> Result<Option<Vec<TrajectoryGroup>>, EngineError> {
        let batch = inner.config.rollout.batch_size;
        let ahead = inner.config.rollout.generate_ahead;
        loop {
            // ahead: a batch is taken only once nothing more may be admitted and every group
            // admitted has ended
            if ahead {
                while inner.admit().is_some() {}
            }
            let caught_up = !ahead || inner.state().running().next().is_none();
            if caught_up && let Some(groups) = inner.state().take(batch) {
                return Ok(Some(groups));
            }
            if interrupt.is_requested() {
                // the run saves the rollout state as it stops: the answers of the last round
                // are recorded first, so that it is whole (as between batches)
                self.rounds.settled().await;
                return Ok(None);
            }
            while inner.admit().is_some() {}
            let running: Vec<RunningGroup> = inner.state().running().cloned().collect();
            if running.is_empty() {
                return Err(EngineError::internal(
                    "deterministic rounds: no group may start and no batch is ready",
                ));
            }
            for group in running {
                if !self.started.contains_key(&group.spec.group_id) {
                    self.start(inner, group);
                }
            }
            self.rounds.settled().await;
            self.file(inner);
            if let Some(stopped) = inner.stopped() {
                return Err(stopped);
            }
            // a batch is buffered: hand it over now, with every episode waiting for a turn or
            // ended, and not after one more round whose answers the episodes would still be
            // recording while the trainer's checkpoint copies the rollout state
            if !ahead && let Some(groups) = inner.state().take(batch) {
                return Ok(Some(groups));
            }
            if ahead && inner.state().running().next().is_none() {
                // every group admitted has ended: admit more, or hand a batch over
                continue;
            }
            let turns = self.rounds.run_round(&inner.runner).await;
            if turns == 0 && !self.started.is_empty() {
                return Err(EngineError::internal(
                    "deterministic rounds: groups in flight, but no episode is at work or \
                     waiting for a turn",
                ));
            }
        }
    }

    /// Start an episode task for every sample of `group` (from where each is).
    fn start(&mut self, inner: &Arc<Shared>, group: RunningGroup) {
        let group_id = group.spec.group_id;
        let prepared =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepared(inner, &group)));
        let (item, prompt) = match prepared.unwrap_or_else(|_| {
            Err(PluginError::failed(
                "rollout",
                format!("the task panicked on train item {}", group.item_index),
            ))
        }) {
            Ok((item, prompt)) => (Arc::new(item), Arc::new(prompt)),
            Err(e) => {
                inner.settle(group_id, Err(e));
                return;
            }
        };
        let chunk = inner.config.rollout.chunk_tokens;
        let sampler = Sampler::Rounds {
            rounds: self.rounds.clone(),
            chunk,
        };
        let mut tasks = Vec::with_capacity(group.samples.len());
        for (j, start) in group.samples.into_iter().enumerate() {
            let sample_id = group.spec.sample_id(j);
            let busy = self.rounds.enter(sample_id);
            let (inner, item, prompt, sampler) =
                (inner.clone(), item.clone(), prompt.clone(), sampler.clone());
            let (spec, failed) = (group.spec.clone(), self.failed.clone());
            tasks.push(tokio::spawn(async move {
                let _busy = busy;
                let progress = Recorder {
                    inner: inner.clone(),
                    group_id,
                };
                let runner = inner.runner.clone();
                // a task of its own, so that a panicking episode fails its group, not the run
                let run = tokio::spawn(async move {
                    EpisodeRun::run(
                        &runner,
                        &sampler,
                        &item,
                        &prompt,
                        sample_id,
                        spec.max_new_tokens,
                        &spec.sampling,
                        start,
                        &progress,
                        j,
                    )
                    .await
                    .map(drop)
                });
                let _abort = AbortOnDrop(run.abort_handle());
                let result = run.await.unwrap_or_else(|e| {
                    Err(PluginError::failed(
                        "rollout",
                        format!("the episode's task failed: {e}"),
                    ))
                });
                if let Err(e) = result {
                    failed
                        .lock()
                        .expect("failures lock poisoned")
                        .entry(group_id)
                        .or_insert(e);
                }
            }));
        }
        let sample_ids = (0..tasks.len()).map(|j| group.spec.sample_id(j)).collect();
        self.started.insert(
            group_id,
            Started {
                item,
                prompt,
                tasks,
                rounds: self.rounds.clone(),
                sample_ids,
            },
        );
    }

    /// Settle the groups that failed, and file those complete, oldest first.
    fn file(&mut self, inner: &Arc<Shared>) {
        let failed = std::mem::take(&mut *self.failed.lock().expect("failures lock poisoned"));
        for (group_id, e) in failed {
            self.started.remove(&group_id);
            inner.settle(group_id, Err(e));
        }
        let now: Vec<RunningGroup> = inner.state().running().cloned().collect();
        for group in now {
            let group_id = group.spec.group_id;
            let Some(samples) = complete(&group) else {
                continue;
            };
            let Some(started) = self.started.remove(&group_id) else {
                continue;
            };
            let result = assemble(&group.spec, &started.item, started.prompt.to_vec(), samples)
                .map(|g| inner.keep(g));
            inner.settle(group_id, result);
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The item and the prompt's token ids of `group`.
fn prepared(inner: &Shared, group: &RunningGroup) -> Result<(TaskItem, Vec<u32>), PluginError> {
    let item = inner.task.item(Split::Train, group.item_index)?;
    let prompt = inner.runner.prompt_ids(&item)?;
    Ok((item, prompt))
}

/// The samples of `group` if every episode has ended.
fn complete(group: &RunningGroup) -> Option<Vec<Trajectory>> {
    let mut out = Vec::with_capacity(group.samples.len());
    for (j, s) in group.samples.iter().enumerate() {
        let reward: &Reward = s.reward.as_ref().filter(|_| s.done)?;
        out.extend(s.samples(group.spec.sample_id(j), reward));
    }
    Some(out)
}
