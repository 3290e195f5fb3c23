//! The rollout state: the admission counters, the groups in flight with what each sample has
//! so far, the replay buffer and the data-order cursor. The controller keeps it under one lock,
//! so that a snapshot of it (what a checkpoint holds) is consistent: every group is in flight,
//! in the buffer, trained or rejected, and never two of these.

use std::collections::BTreeMap;

use areal_sdk::{
    Completion, PolicyVersion, Reward, SamplingParams, Split, Task, TrajectoryGroup, TurnReward,
};
use serde::{Deserialize, Serialize};

use crate::buffer::ReplayBuffer;
use crate::config::{Config, LagPolicy};
use crate::group_runner::{GroupSpec, SampleProgress, TurnEnd};
use crate::order::DataOrder;
use crate::staleness::{AdmissionCounts, StalenessManager};

/// A group generating: what it was asked and where each of its samples is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunningGroup {
    /// What the group is asked to do.
    pub(crate) spec: GroupSpec,
    /// Its item's index in the train split.
    pub(crate) item_index: u64,
    /// Each sample's progress.
    pub(crate) samples: Vec<SampleProgress>,
}

/// How a group in flight ended.
pub(crate) enum Outcome {
    /// Into the buffer.
    Accepted(TrajectoryGroup),
    /// Filtered by the algorithm (its samples are dropped).
    Filtered,
    /// Generation or every reward failed (its samples are dropped).
    Failed,
}

/// The whole rollout state, as a checkpoint holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RolloutSnapshot {
    /// The admission counters (`running` = the groups in `running`).
    pub(crate) counts: AdmissionCounts,
    /// The next group's id, which is also the data-order cursor.
    pub(crate) next_group: u64,
    /// Groups failed in a row.
    pub(crate) consecutive_failures: usize,
    /// Samples admitted and dropped: in rejected groups, or their reward lost.
    pub(crate) dropped_samples: u64,
    /// Groups in flight, oldest first.
    pub(crate) running: Vec<RunningGroup>,
    /// Accepted groups not yet trained, oldest first.
    pub(crate) buffer: Vec<TrajectoryGroup>,
}

/// The rollout state of a run.
pub(crate) struct RolloutState {
    admission: StalenessManager,
    buffer: ReplayBuffer,
    running: BTreeMap<u64, RunningGroup>,
    next_group: u64,
    consecutive_failures: usize,
    dropped_samples: u64,
    order: DataOrder,
    group_size: usize,
    max_new_tokens: usize,
    sampling: SamplingParams,
    max_lag: Option<u64>,
    lag_policy: LagPolicy,
    /// Samples of groups left out for `rollout.max_lag` so far.
    lag_dropped: u64,
}

impl RolloutState {
    /// The state at the start of RL for `config`, drawing items of `task`'s train split.
    pub(crate) fn new(config: &Config, task: &dyn Task) -> Self {
        let r = &config.rollout;
        // `wait` keeps generation from running further ahead than the bound allows
        let eta = match (r.max_lag, r.max_lag_policy) {
            (Some(bound), LagPolicy::Wait) => r.max_staleness.min(bound),
            _ => r.max_staleness,
        };
        Self {
            admission: StalenessManager::new(r.batch_size as u64, eta, r.max_concurrent as u64),
            buffer: ReplayBuffer::new(),
            running: BTreeMap::new(),
            next_group: 0,
            consecutive_failures: 0,
            dropped_samples: 0,
            order: DataOrder::new(task.len(Split::Train), areal_sdk::mix_seed(config.seed, 6)),
            group_size: r.group_size,
            max_new_tokens: r.max_new_tokens,
            sampling: SamplingParams {
                temperature: r.temperature,
                top_p: r.top_p,
                seed: config.seed,
            },
            max_lag: r.max_lag,
            lag_policy: r.max_lag_policy,
            lag_dropped: 0,
        }
    }

    /// The state `snapshot` recorded, for `config` (whose `[rollout]` sizes may differ from the
    /// snapshot's run only where resuming allows it).
    pub(crate) fn restore(config: &Config, task: &dyn Task, snapshot: RolloutSnapshot) -> Self {
        let mut state = Self::new(config, task);
        let mut counts = snapshot.counts;
        counts.running = snapshot.running.len() as u64;
        state.admission.restore(counts);
        state.next_group = snapshot.next_group;
        state.consecutive_failures = snapshot.consecutive_failures;
        state.dropped_samples = snapshot.dropped_samples;
        state.running = snapshot
            .running
            .into_iter()
            .map(|g| (g.spec.group_id, g))
            .collect();
        for group in snapshot.buffer {
            state.buffer.push(group);
        }
        state
    }

    /// A copy of everything, for a checkpoint.
    pub(crate) fn snapshot(&self) -> RolloutSnapshot {
        RolloutSnapshot {
            counts: self.admission.counts(),
            next_group: self.next_group,
            consecutive_failures: self.consecutive_failures,
            dropped_samples: self.dropped_samples,
            running: self.running.values().cloned().collect(),
            buffer: self.buffer.groups().cloned().collect(),
        }
    }

    /// Admit a new group if the staleness rule allows it: the group, in flight from now on.
    pub(crate) fn admit(&mut self) -> Option<RunningGroup> {
        if !self.admission.try_admit() {
            return None;
        }
        let group_id = self.next_group;
        self.next_group += 1;
        let group = RunningGroup {
            spec: GroupSpec {
                group_id,
                group_size: self.group_size,
                max_new_tokens: self.max_new_tokens,
                sampling: self.sampling.clone(),
                admitted_at: self.admission.counts().version,
            },
            item_index: self.order.index(group_id),
            samples: vec![SampleProgress::default(); self.group_size],
        };
        self.running.insert(group_id, group.clone());
        Some(group)
    }

    /// The groups in flight, oldest first.
    pub(crate) fn running(&self) -> impl Iterator<Item = &RunningGroup> {
        self.running.values()
    }

    /// Sample `j` of group `group_id` got `part` (sampled or environment tokens), and `end`
    /// when the part ends a turn: recorded together, so that no snapshot holds a turn's last
    /// tokens without its end (a resumed episode would sample on past them). (Nothing
    /// happens for a group no longer in flight: a task that outlived its group.)
    pub(crate) fn extended(
        &mut self,
        group_id: u64,
        j: usize,
        part: &Completion,
        end: Option<TurnEnd>,
    ) {
        if let Some(sample) = self.sample(group_id, j) {
            sample.completion.extend(part.clone());
            if let Some(end) = end {
                sample.completion.finish_reason = end.finish_reason;
                sample.turns.push(end);
            }
        }
        crate::failpoint::hit("rollout");
    }

    /// A turn of sample `j` of group `group_id` ended.
    pub(crate) fn turn_ended(&mut self, group_id: u64, j: usize, end: TurnEnd) {
        if let Some(sample) = self.sample(group_id, j) {
            sample.turns.push(end);
        }
    }

    /// The episode of sample `j` of group `group_id` ended with `reward`.
    pub(crate) fn finished(&mut self, group_id: u64, j: usize, reward: &Reward) {
        if let Some(sample) = self.sample(group_id, j) {
            sample.done = true;
            sample.reward = Some(reward.clone());
        }
    }

    /// Sample `j` of group `group_id` split: its tokens so far became a sample of their own.
    pub(crate) fn split(&mut self, group_id: u64, j: usize, turn_rewards: &[TurnReward]) {
        if let Some(sample) = self.sample(group_id, j) {
            sample.split(turn_rewards);
        }
    }

    /// Sample `j` of group `group_id` took back its tokens after its first `len`.
    pub(crate) fn withdrawn(&mut self, group_id: u64, j: usize, len: usize) {
        if let Some(sample) = self.sample(group_id, j) {
            sample.completion.truncate(len);
        }
    }

    /// The episode of sample `j` of group `group_id` starts over.
    pub(crate) fn restarted(&mut self, group_id: u64, j: usize) {
        if let Some(sample) = self.sample(group_id, j) {
            *sample = SampleProgress::default();
        }
    }

    fn sample(&mut self, group_id: u64, j: usize) -> Option<&mut SampleProgress> {
        self.running
            .get_mut(&group_id)
            .and_then(|g| g.samples.get_mut(j))
    }

    /// Group `group_id` ended with `outcome`: it leaves the groups in flight, an accepted one
    /// goes into the buffer; the admission counters and the failure streak follow. Returns the
    /// failure streak. An accepted group the run cannot account for ([`unaccountable`]: a
    /// token of a version newer than the generators hold, a logprob that is none) fails
    /// instead, with a warning: nothing is trained on that the run cannot account for.
    pub(crate) fn settle(&mut self, group_id: u64, outcome: Outcome) -> usize {
        let Some(group) = self.running.remove(&group_id) else {
            return self.consecutive_failures;
        };
        let outcome = match outcome {
            Outcome::Accepted(trained) => {
                match unaccountable(&trained, self.admission.counts().version) {
                    None => Outcome::Accepted(trained),
                    Some(why) => {
                        tracing::warn!(target: "areal::rollout", group_id, "group refused: {why}");
                        Outcome::Failed
                    }
                }
            }
            other => other,
        };
        let accepted = match outcome {
            Outcome::Accepted(trained) => {
                let episodes = episodes(&trained);
                self.dropped_samples += group.spec.group_size.saturating_sub(episodes) as u64;
                self.buffer.push(trained);
                self.consecutive_failures = 0;
                true
            }
            Outcome::Filtered => {
                self.dropped_samples += group.spec.group_size as u64;
                self.consecutive_failures = 0;
                false
            }
            Outcome::Failed => {
                self.dropped_samples += group.spec.group_size as u64;
                self.consecutive_failures += 1;
                false
            }
        };
        self.admission.finish(accepted);
        self.consecutive_failures
    }

    /// The `n` oldest accepted groups, if `n` are waiting. With `rollout.max_lag`, a group
    /// whose oldest token would lag by more than it (trained at the generators' version) is
    /// left out first, its place freed for another; with `max_lag_policy = "wait"` (where
    /// generation runs at most `max_lag` versions ahead), nothing is taken while a group still
    /// generating would be trained too late if not in this batch.
    pub(crate) fn take(&mut self, n: usize) -> Option<Vec<TrajectoryGroup>> {
        // with `withhold` the trainer masks the samples past the bound
        if let Some(bound) = self
            .max_lag
            .filter(|_| self.lag_policy != LagPolicy::Withhold)
        {
            let version = self.admission.counts().version;
            let stale: Vec<u64> = self
                .buffer
                .groups()
                .filter(|g| lag_past(g.samples.iter().map(|s| &s.completion), version, bound))
                .map(|g| g.group_id)
                .collect();
            for group_id in stale {
                let group = self.buffer.remove(group_id).expect("a buffered group");
                let samples = episodes(&group) as u64;
                tracing::warn!(target: "areal::rollout", group_id, max_lag = bound, "group left out: its oldest token would be trained with a lag past rollout.max_lag");
                // (its samples whose reward was lost were counted when it was accepted)
                self.dropped_samples += samples;
                self.lag_dropped += samples;
                self.admission.unaccept();
            }
            if self.lag_policy == LagPolicy::Wait {
                // trained after this step, its lag would pass the bound: it goes in this one
                let late = self
                    .running
                    .values()
                    .any(|g| lag_past(g.samples.iter().map(|s| &s.completion), version + 1, bound));
                if late {
                    return None;
                }
            }
        }
        self.buffer.try_take(n)
    }

    /// The generators now hold `version`.
    pub(crate) fn set_version(&mut self, version: PolicyVersion) {
        self.admission.set_version(version);
    }

    /// The admission counters.
    pub(crate) fn counts(&self) -> AdmissionCounts {
        self.admission.counts()
    }

    /// Groups waiting in the buffer.
    pub(crate) fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// What became of every sample admitted so far.
    pub(crate) fn ledger(&self) -> SampleLedger {
        let buffered: usize = self.buffer.groups().map(episodes).sum();
        SampleLedger {
            admitted: self.next_group * self.group_size as u64,
            dropped: self.dropped_samples,
            lag_dropped: self.lag_dropped,
            pending: (self.running.len() * self.group_size + buffered) as u64,
        }
    }
}

/// The episodes of `group`, what the ledger counts as its samples (the samples an episode
/// split into share its id).
fn episodes(group: &TrajectoryGroup) -> usize {
    group
        .samples
        .iter()
        .map(|s| s.sample_id)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// Whether a token of `completions`, trained at version `at`, would have a lag past `bound`.
fn lag_past<'a>(
    mut completions: impl Iterator<Item = &'a Completion>,
    at: PolicyVersion,
    bound: u64,
) -> bool {
    completions.any(|c| c.sampled_versions().any(|v| at.saturating_sub(v) > bound))
}

/// Why `group` cannot be trained on when the generators hold `version`: a sample whose token,
/// logprob and version lists differ in length, whose logprobs are not log-probabilities, or
/// with a token of a version no generator held yet (its lag would read 0). `None` when it can.
pub(crate) fn unaccountable(group: &TrajectoryGroup, version: PolicyVersion) -> Option<String> {
    for s in &group.samples {
        let c = &s.completion;
        if let Err(why) = c.check_trajectory() {
            return Some(format!("sample {}: {why}", s.sample_id));
        }
        if let Some(v) = c.sampled_versions().max()
            && v > version
        {
            return Some(format!(
                "sample {}: a token of version {v}, newer than the generators' {version}",
                s.sample_id
            ));
        }
        if !s.reward.value.is_finite() {
            return Some(format!("sample {}: reward {}", s.sample_id, s.reward.value));
        }
    }
    None
}

impl RolloutSnapshot {
    /// Why this snapshot (a checkpoint's, read back) cannot be the run's state at policy
    /// `version`: counters that do not add up (every group admitted is running, accepted or
    /// rejected; the generators hold `version` or the one before, the snapshot being taken
    /// while they are paused for it), or a group the run could not train on.
    pub(crate) fn check(&self, version: PolicyVersion) -> Result<(), String> {
        let c = &self.counts;
        if c.version > version || version - c.version > 1 {
            return Err(format!(
                "rollout.counts.version {} is not the policy version {version} nor the one before",
                c.version
            ));
        }
        let version = c.version;
        let admitted = c
            .accepted
            .checked_add(c.rejected)
            .and_then(|n| n.checked_add(self.running.len() as u64));
        if admitted != Some(self.next_group) {
            return Err(format!(
                "rollout.counts (accepted {}, rejected {}, running {}) do not add up to the {} groups admitted",
                c.accepted,
                c.rejected,
                self.running.len(),
                self.next_group
            ));
        }
        for group in &self.buffer {
            unaccountable(group, version).map_or(Ok(()), |why| {
                Err(format!("buffered group {}: {why}", group.group_id))
            })?;
        }
        for group in &self.running {
            for (j, sample) in group.samples.iter().enumerate() {
                let c = &sample.completion;
                c.check_trajectory().map_err(|why| {
                    format!("group {} sample {j} in flight: {why}", group.spec.group_id)
                })?;
                if c.sampled_versions().any(|v| v > version) {
                    return Err(format!(
                        "group {} sample {j} in flight: a token newer than version {version}",
                        group.spec.group_id
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Sample counts of a run's rollout state: every admitted sample is trained, dropped or
/// pending, so `admitted = trained + dropped + pending`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SampleLedger {
    /// Samples admitted (in every group admitted so far).
    pub(crate) admitted: u64,
    /// In rejected groups, or their reward lost, or left out for `rollout.max_lag`.
    pub(crate) dropped: u64,
    /// Of which left out for `rollout.max_lag`.
    pub(crate) lag_dropped: u64,
    /// In flight or in the buffer.
    pub(crate) pending: u64,
}

#[cfg(test)]
mod tests {
    use areal_sdk::{FinishReason, Trajectory, Verdict};

    use super::*;

    fn config() -> Config {
        crate::config::ConfigLoader::new()
            .set_all([
                "rollout.batch_size=2",
                "rollout.group_size=3",
                "rollout.max_staleness=1",
                "rollout.max_concurrent=3",
            ])
            .unwrap()
            .load()
            .unwrap()
    }

    struct Items;

    impl Task for Items {
        fn name(&self) -> &str {
            "items"
        }
        fn len(&self, _: Split) -> Option<usize> {
            Some(5)
        }
        fn item(
            &self,
            _: Split,
            index: u64,
        ) -> Result<areal_sdk::TaskItem, areal_sdk::PluginError> {
            Ok(areal_sdk::TaskItem {
                id: index.to_string(),
                prompt: "p".into(),
                reference: serde_json::Value::Null,
            })
        }
    }

    fn accepted(group: &RunningGroup, kept: usize) -> Outcome {
        Outcome::Accepted(TrajectoryGroup {
            group_id: group.spec.group_id,
            item_id: group.item_index.to_string(),
            prompt_ids: vec![1],
            admitted_at: group.spec.admitted_at,
            samples: (0..kept)
                .map(|j| Trajectory {
                    sample_id: group.spec.sample_id(j),
                    completion: Completion::empty(FinishReason::Stop),
                    reward: Reward::new(1.0, Verdict::Accepted),
                })
                .collect(),
        })
    }

    /// A snapshot restores to a state that goes on exactly as the original does, partial
    /// samples, buffer, counters and data cursor included.
    #[test]
    fn a_restored_state_goes_on_as_the_original() {
        let config = config();
        let mut state = RolloutState::new(&config, &Items);
        let groups: Vec<RunningGroup> = std::iter::from_fn(|| state.admit()).collect();
        assert_eq!(groups.len(), 3, "max_concurrent");
        let mut part = Completion::empty(FinishReason::Interrupted);
        part.push(4, -0.25, 0);
        state.extended(1, 2, &part, None);
        let mut env = Completion::empty(FinishReason::Stop);
        env.push_environment(&[7, 8]);
        state.turn_ended(
            1,
            1,
            TurnEnd {
                end: 0,
                finish_reason: FinishReason::Stop,
            },
        );
        state.extended(1, 1, &env, None);
        state.finished(1, 0, &Reward::new(0.5, Verdict::WrongAnswer));
        assert_eq!(state.settle(0, accepted(&groups[0], 2)), 0);
        assert_eq!(state.settle(2, Outcome::Failed), 1);
        let snapshot = state.snapshot();
        let json = serde_json::to_string(&snapshot).unwrap();
        let back: RolloutSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, snapshot);
        let mut restored = RolloutState::restore(&config, &Items, back);
        assert_eq!(restored.snapshot(), snapshot);
        assert_eq!(restored.ledger(), state.ledger());
        assert_eq!(
            state.ledger(),
            SampleLedger {
                admitted: 9,
                dropped: 1 + 3,
                lag_dropped: 0,
                pending: 3 + 2,
            }
        );
        let partial = &restored.running().next().unwrap().samples[2];
        assert_eq!(partial.completion.token_ids, vec![4]);
        assert!(!partial.done);
        for s in [&mut state, &mut restored] {
            let next: Vec<_> = std::iter::from_fn(|| s.admit()).collect();
            assert_eq!(next.len(), 2);
        }
        assert_eq!(restored.snapshot(), state.snapshot());
        let ids = |s: &mut RolloutState| s.take(1).map(|b| b[0].group_id);
        assert_eq!(ids(&mut restored), Some(0));
        assert_eq!(ids(&mut state), Some(0));
    }

    /// A group of two samples, each with one token of each version of `versions`.
    fn with_versions(group: &RunningGroup, versions: &[u64]) -> Outcome {
        let Outcome::Accepted(mut g) = accepted(group, 2) else {
            unreachable!()
        };
        for s in &mut g.samples {
            for &v in versions {
                s.completion.push(3, -0.5, v);
            }
        }
        Outcome::Accepted(g)
    }

    fn max_lag(policy: &str) -> Config {
        crate::config::ConfigLoader::new()
            .set_all([
                "rollout.batch_size=1",
                "rollout.group_size=3",
                "rollout.max_staleness=8",
                "rollout.max_concurrent=3",
                "rollout.max_lag=1",
                &format!("rollout.max_lag_policy=\"{policy}\""),
            ])
            .unwrap()
            .load()
            .unwrap()
    }

    /// Issue 32: `rollout.max_lag` bounds the lag of what is trained, where the admission
    /// rule alone lets a long-tailed group through later than η. `drop` leaves a group past
    /// the bound out (its place freed for another); `wait` does not take a batch while a
    /// group still generating would be trained too late after it.
    #[test]
    fn max_lag_leaves_out_or_waits_for_what_would_be_trained_too_late() {
        let config = max_lag("drop");
        let mut state = RolloutState::new(&config, &Items);
        let groups: Vec<RunningGroup> = std::iter::from_fn(|| state.admit()).collect();
        state.set_version(3);
        state.settle(0, with_versions(&groups[0], &[1, 3]));
        state.settle(1, with_versions(&groups[1], &[2, 3]));
        let taken = state.take(1).unwrap();
        assert_eq!(
            taken[0].group_id, 1,
            "group 0's token of version 1 lags by 2"
        );
        assert_eq!(state.ledger().lag_dropped, 2);
        assert_eq!(
            state.ledger().dropped,
            1 + 1 + 2,
            "one sample of each group at settle, then group 0's two"
        );
        let counts = state.counts();
        assert_eq!(
            (counts.accepted, counts.rejected),
            (1, 1),
            "group 0's place is free"
        );
        assert!(state.snapshot().check(3).is_ok());

        let config = max_lag("wait");
        let mut state = RolloutState::new(&config, &Items);
        let groups: Vec<RunningGroup> = std::iter::from_fn(|| state.admit()).collect();
        state.set_version(3);
        state.settle(1, with_versions(&groups[1], &[3]));
        let mut part = Completion::empty(FinishReason::Interrupted);
        part.push(4, -0.25, 2);
        state.extended(0, 0, &part, None);
        assert!(
            state.take(1).is_none(),
            "group 0 (a token of version 2) would lag by 2 after this step: wait for it"
        );
        state.settle(0, with_versions(&groups[0], &[2]));
        assert_eq!(state.take(1).unwrap()[0].group_id, 0, "the oldest first");
        assert_eq!(state.ledger().lag_dropped, 0);
    }
}
