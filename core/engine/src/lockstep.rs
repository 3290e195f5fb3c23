//! Deterministic mode's schedule: generation in rounds, over the controller's rollout state.
//!
//! A round admits every group the staleness rule allows, gives each unfinished sample one
//! chunk of at most `rollout.chunk_tokens` tokens with the weights the generator holds,
//! rewards the samples that finished, and files the groups that are complete, oldest first.
//! Rounds run until `rollout.batch_size` groups are buffered; the trainer then trains on them
//! and publishes new weights, which the next round uses. A sample longer than a chunk spans
//! rounds, and so versions, exactly as an interrupted sample does by default.
//!
//! Nothing here depends on timing: which tokens a version samples follows from the rounds
//! alone, and each round's chunks reach the generator together, in one order
//! ([`Generator::generate_batch`](areal_sdk::Generator::generate_batch)), so a generator that
//! batches them does so the same way every time and its rounding is the same too. Between
//! batches nothing generates, so the rollout state is whole when a checkpoint copies it.

use std::collections::BTreeMap;
use std::sync::Arc;

use areal_sdk::{
    Completion, FinishReason, PluginError, Reward, Split, TaskItem, Trajectory, TrajectoryGroup,
};
use futures_util::future::join_all;

use crate::error::EngineError;
use crate::group_runner::{Ask, GroupRunner, assemble};
use crate::observer::StopRequest;
use crate::rollout::RunningGroup;
use crate::shared::Shared;

/// Run rounds until a batch is buffered; `None` when `interrupt` is requested first.
pub(crate) async fn next_batch(
    inner: &Arc<Shared>,
    interrupt: &StopRequest,
) -> Result<Option<Vec<TrajectoryGroup>>, EngineError> {
    let batch = inner.config.rollout.batch_size;
    loop {
        if let Some(groups) = inner.state().take(batch) {
            return Ok(Some(groups));
        }
        if interrupt.is_requested() {
            return Ok(None);
        }
        while inner.admit().is_some() {}
        let running: Vec<RunningGroup> = inner.state().running().cloned().collect();
        if running.is_empty() {
            return Err(EngineError::internal(
                "deterministic rounds: no group may start and no batch is ready",
            ));
        }
        round(inner, running).await;
        if let Some(stopped) = inner.stopped() {
            return Err(stopped);
        }
    }
}

/// One round over the groups in flight.
async fn round(inner: &Arc<Shared>, running: Vec<RunningGroup>) {
    let runner = &inner.runner;
    let chunk = inner.config.rollout.chunk_tokens;
    // Each group's item and prompt, by group id; a group whose item cannot be had fails.
    let mut groups = BTreeMap::new();
    for group in running {
        let item =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepared(inner, &group)));
        let item = item.unwrap_or_else(|_| {
            Err(PluginError::failed(
                "rollout",
                format!("the task panicked on train item {}", group.item_index),
            ))
        });
        match item {
            Ok((item, prompt)) => {
                groups.insert(group.spec.group_id, (group, item, prompt));
            }
            Err(e) => inner.settle(group.spec.group_id, Err(e)),
        }
    }
    // One chunk for every unfinished sample, handed to the generator together.
    let mut asks = Vec::new();
    let mut whose = Vec::new();
    for (group, _, prompt) in groups.values() {
        let spec = &group.spec;
        for (j, sample) in group.samples.iter().enumerate() {
            if sample.done {
                continue;
            }
            let mut input = prompt.clone();
            input.extend(&sample.completion.token_ids);
            let left = spec.max_new_tokens - sample.completion.len();
            let ask = Ask {
                sample_id: spec.sample_id(j),
                input,
                max_new_tokens: chunk.min(left),
                sampling: spec.sampling.clone(),
            };
            whose.push((spec.group_id, j, left));
            asks.push(ask);
        }
    }
    let parts = generate(runner, &asks).await;
    let mut failed = BTreeMap::new();
    for (((group_id, j, left), ask), part) in whose.into_iter().zip(&asks).zip(parts) {
        match part {
            Ok(part) => {
                // final when stopped, at the budget, or short of what was asked (the context
                // is full)
                let done = match part.finish_reason {
                    FinishReason::Stop => true,
                    FinishReason::Interrupted => part.len() >= left,
                    FinishReason::Length => part.len() < ask.max_new_tokens || part.len() >= left,
                };
                inner.state().generated(group_id, j, &part, done);
            }
            Err(e) => {
                failed.entry(group_id).or_insert(e);
            }
        }
    }
    for (group_id, e) in failed {
        inner.settle(group_id, Err(e));
    }
    // Rewards for the samples that finished.
    let now: Vec<RunningGroup> = inner.state().running().cloned().collect();
    let mut verifications = Vec::new();
    for group in &now {
        let Some((_, item, _)) = groups.get(&group.spec.group_id) else {
            continue;
        };
        for (j, sample) in group.samples.iter().enumerate() {
            if sample.done && sample.reward.is_none() {
                let id = group.spec.sample_id(j);
                verifications.push(async move {
                    let verified = runner.reward(id, item, &sample.completion).await;
                    (group.spec.group_id, j, verified.map(|v| v.reward))
                });
            }
        }
    }
    let mut failed = BTreeMap::new();
    for (group_id, j, reward) in join_all(verifications).await {
        match reward {
            Ok(reward) => inner.state().rewarded(group_id, j, &reward),
            Err(e) => {
                failed.entry(group_id).or_insert(e);
            }
        }
    }
    for (group_id, e) in failed {
        inner.settle(group_id, Err(e));
    }
    // File the groups that are complete, oldest first.
    let now: Vec<RunningGroup> = inner.state().running().cloned().collect();
    for group in now {
        let Some((_, item, prompt)) = groups.get(&group.spec.group_id) else {
            continue;
        };
        let Some(samples) = complete(&group) else {
            continue;
        };
        let result = assemble(&group.spec, item, prompt.clone(), samples).map(|g| inner.keep(g));
        inner.settle(group.spec.group_id, result);
    }
}

/// The round's chunks from the generator, on a task of their own, so that a panicking
/// generator fails the round's groups (as it fails a group by default), not the run.
async fn generate(runner: &Arc<GroupRunner>, asks: &[Ask]) -> Vec<Result<Completion, PluginError>> {
    let (runner, owned) = (runner.clone(), asks.to_vec());
    match tokio::spawn(async move { runner.parts(&owned).await }).await {
        Ok(parts) => parts,
        Err(e) => {
            let why = format!("the generator's task failed: {e}");
            asks.iter()
                .map(|_| Err(PluginError::failed("rollout", why.clone())))
                .collect()
        }
    }
}

/// The item and the prompt's token ids of `group`.
fn prepared(inner: &Shared, group: &RunningGroup) -> Result<(TaskItem, Vec<u32>), PluginError> {
    let item = inner.task.item(Split::Train, group.item_index)?;
    let prompt = inner.runner.prompt_ids(&item)?;
    Ok((item, prompt))
}

/// The samples of `group` if every one is generated and rewarded.
fn complete(group: &RunningGroup) -> Option<Vec<Trajectory>> {
    group
        .samples
        .iter()
        .enumerate()
        .map(|(j, s)| {
            let reward: &Reward = s.reward.as_ref().filter(|_| s.done)?;
            Some(Trajectory {
                sample_id: group.spec.sample_id(j),
                completion: s.completion.clone(),
                reward: reward.clone(),
            })
        })
        .collect()
}
