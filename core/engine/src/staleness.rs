//! Admission control: how far generation may run ahead of training (AReaL's staleness rule).

use areal_sdk::PolicyVersion;
use serde::{Deserialize, Serialize};

/// Counters of the admission rule.
///
/// With B the training batch size in groups, i the generators' policy version and η the
/// maximum staleness, a new rollout may start only while
/// `accepted + running + 1 ≤ (η + i + 1) · B` and `running < max_concurrent`.
/// A rejected rollout (failed or filtered) frees its slot; an accepted one keeps it until the
/// end of the run. η = 0 is synchronous RL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StalenessManager {
    batch_size: u64,
    max_staleness: u64,
    max_concurrent: u64,
    version: u64,
    accepted: u64,
    running: u64,
    rejected: u64,
}

/// A snapshot of the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionCounts {
    /// Rollouts accepted into the buffer so far (trained or not).
    pub accepted: u64,
    /// Rollouts generating now.
    pub running: u64,
    /// Rollouts rejected so far.
    pub rejected: u64,
    /// The generators' policy version.
    pub version: u64,
}

impl StalenessManager {
    /// Counters at version 0 for batch size `batch_size`, staleness `max_staleness` and at
    /// most `max_concurrent` running rollouts.
    pub fn new(batch_size: u64, max_staleness: u64, max_concurrent: u64) -> Self {
        assert!(batch_size >= 1 && max_concurrent >= 1);
        Self {
            batch_size,
            max_staleness,
            max_concurrent,
            version: 0,
            accepted: 0,
            running: 0,
            rejected: 0,
        }
    }

    /// The counters of a checkpoint: what it had accepted and rejected at `version`, with its
    /// `running` rollouts going on again. Restored exactly (rather than `accepted = version ·
    /// B`), because a checkpoint keeps the groups accepted ahead of training and those in
    /// flight, so the rule goes on holding as it held when the checkpoint was taken.
    pub fn restore(&mut self, counts: AdmissionCounts) {
        self.version = counts.version;
        self.accepted = counts.accepted;
        self.rejected = counts.rejected;
        self.running = counts.running;
    }

    /// The most rollouts that may be accepted or running at the current version. The
    /// arithmetic saturates: a huge η (2⁶³ − 1, say) means no staleness bound, never a
    /// wrapped one that admits nothing.
    pub fn limit(&self) -> u64 {
        self.max_staleness
            .saturating_add(self.version)
            .saturating_add(1)
            .saturating_mul(self.batch_size)
    }

    /// How many more rollouts may start now.
    pub fn capacity(&self) -> u64 {
        let by_staleness = self
            .limit()
            .saturating_sub(self.accepted.saturating_add(self.running));
        let by_concurrency = self.max_concurrent.saturating_sub(self.running);
        by_staleness.min(by_concurrency)
    }

    /// Start one rollout if the rule allows it.
    pub fn try_admit(&mut self) -> bool {
        if self.capacity() == 0 {
            return false;
        }
        self.running += 1;
        true
    }

    /// A running rollout ended: accepted into the buffer, or rejected (which frees its slot).
    pub fn finish(&mut self, accepted: bool) {
        assert!(self.running > 0, "finish without a running rollout");
        self.running -= 1;
        if accepted {
            self.accepted += 1;
        } else {
            self.rejected += 1;
        }
    }

    /// An accepted rollout was left out before training (`rollout.max_lag`): it counts as
    /// rejected, so that another may take its place.
    pub fn unaccept(&mut self) {
        assert!(self.accepted > 0, "unaccept without an accepted rollout");
        self.accepted -= 1;
        self.rejected += 1;
    }

    /// The generators now run `version`.
    pub fn set_version(&mut self, version: PolicyVersion) {
        self.version = version;
    }

    /// The counters.
    pub fn counts(&self) -> AdmissionCounts {
        AdmissionCounts {
            accepted: self.accepted,
            running: self.running,
            rejected: self.rejected,
            version: self.version,
        }
    }

    /// Whether the counters satisfy the rule (they always should).
    pub fn holds(&self) -> bool {
        self.accepted.saturating_add(self.running) <= self.limit()
            && self.running <= self.max_concurrent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_largest_staleness_admits_up_to_concurrency() {
        // (η + 1) · B once wrapped to a tiny limit: the run deadlocked with 0 steps.
        for eta in [u64::MAX, i64::MAX as u64, u64::MAX / 8] {
            let mut s = StalenessManager::new(8, eta, 16);
            assert_eq!(s.capacity(), 16, "η = {eta}");
            assert_eq!((0..100).filter(|_| s.try_admit()).count(), 16);
            s.set_version(u64::MAX);
            assert!(s.holds());
        }
    }

    #[test]
    fn synchronous_admits_one_batch_per_version() {
        let mut s = StalenessManager::new(4, 0, 100);
        let admitted = (0..10).filter(|_| s.try_admit()).count();
        assert_eq!(admitted, 4);
        for _ in 0..4 {
            s.finish(true);
        }
        assert!(!s.try_admit(), "no new rollout before the version advances");
        s.set_version(1);
        assert_eq!(s.capacity(), 4);
    }

    #[test]
    fn rejection_frees_a_slot_and_concurrency_caps() {
        let mut s = StalenessManager::new(2, 1, 3);
        assert_eq!(s.capacity(), 3);
        assert!(s.try_admit() && s.try_admit() && s.try_admit());
        assert!(!s.try_admit(), "max_concurrent");
        s.finish(true);
        s.finish(true);
        assert_eq!(
            s.capacity(),
            1,
            "limit (1+0+1)*2 = 4, 2 accepted + 1 running"
        );
        s.finish(false);
        assert_eq!(s.capacity(), 2);
        assert_eq!(
            s.counts(),
            AdmissionCounts {
                accepted: 2,
                running: 0,
                rejected: 1,
                version: 0
            }
        );
    }

    #[test]
    fn restored_counters_go_on_as_they_were() {
        let mut s = StalenessManager::new(8, 2, 64);
        let counts = AdmissionCounts {
            accepted: 40,
            running: 3,
            rejected: 2,
            version: 5,
        };
        s.restore(counts);
        assert_eq!(s.counts(), counts);
        assert_eq!(s.capacity(), 21, "(2 + 5 + 1) * 8 - 40 - 3");
        assert!(s.holds());
        s.finish(true);
        assert_eq!(s.counts().running, 2);
    }

    /// A simulated run: rollouts are admitted whenever the rule allows, finish in an order
    /// chosen by `picks`, are rejected when `rejects` says so, and the trainer consumes the
    /// B oldest accepted groups whenever B are buffered.
    fn simulate(
        batch: u64,
        eta: u64,
        max_concurrent: u64,
        picks: &[usize],
        rejects: &[bool],
        fifo: bool,
    ) -> Result<(), TestCaseError> {
        let mut s = StalenessManager::new(batch, eta, max_concurrent);
        let mut running: Vec<(u64, u64)> = Vec::new(); // (submission, version at admission)
        let mut buffer: BTreeMap<u64, u64> = BTreeMap::new();
        let mut next = 0u64;
        for (step, &pick) in picks.iter().enumerate() {
            while s.try_admit() {
                prop_assert!(s.holds(), "rule broken after admission: {:?}", s.counts());
                let c = s.counts();
                prop_assert!(c.accepted + c.running <= (eta + c.version + 1) * batch);
                prop_assert!(c.running <= max_concurrent);
                running.push((next, c.version));
                next += 1;
            }
            if running.is_empty() {
                continue;
            }
            let index = if fifo { 0 } else { pick % running.len() };
            let (id, admitted_at) = running.remove(index);
            let reject = rejects[step % rejects.len()];
            s.finish(!reject);
            if !reject {
                buffer.insert(id, admitted_at);
            }
            while buffer.len() as u64 >= batch {
                let version = s.counts().version;
                for _ in 0..batch {
                    let (_, admitted_at) = buffer.pop_first().expect("buffer has B groups");
                    if eta == 0 || fifo {
                        prop_assert!(
                            version - admitted_at <= eta,
                            "trained at version {version} a group admitted at {admitted_at} (η = {eta})"
                        );
                    }
                }
                s.set_version(version + 1);
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn rule_holds_at_every_submission(
            batch in 1u64..6,
            eta in 0u64..5,
            max_concurrent in 1u64..40,
            picks in proptest::collection::vec(any::<usize>(), 1..400),
            rejects in proptest::collection::vec(proptest::bool::weighted(0.2), 1..20),
        ) {
            simulate(batch, eta, max_concurrent, &picks, &rejects, false)?;
        }

        #[test]
        fn in_order_completion_keeps_lag_within_eta(
            batch in 1u64..6,
            eta in 0u64..5,
            max_concurrent in 1u64..40,
            picks in proptest::collection::vec(any::<usize>(), 1..300),
            rejects in proptest::collection::vec(proptest::bool::weighted(0.2), 1..20),
        ) {
            simulate(batch, eta, max_concurrent, &picks, &rejects, true)?;
        }
    }
}
