//! The replay buffer: accepted groups wait here; the trainer takes the oldest first.

use std::collections::BTreeMap;

use areal_sdk::TrajectoryGroup;

/// Accepted groups keyed by submission order. Nothing is dropped for being stale. Plain data:
/// the controller keeps it under its lock with the rest of the rollout state, and a
/// checkpoint holds it whole.
#[derive(Clone, Debug, Default)]
pub struct ReplayBuffer {
    groups: BTreeMap<u64, TrajectoryGroup>,
}

impl ReplayBuffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add an accepted group.
    pub fn push(&mut self, group: TrajectoryGroup) {
        let previous = self.groups.insert(group.group_id, group);
        assert!(previous.is_none(), "group ids are unique");
    }

    /// Groups waiting.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Whether no group is waiting.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Take the `n` oldest groups (smallest submission order) if at least `n` are waiting.
    pub fn try_take(&mut self, n: usize) -> Option<Vec<TrajectoryGroup>> {
        if self.groups.len() < n {
            return None;
        }
        Some(
            (0..n)
                .filter_map(|_| self.groups.pop_first().map(|(_, g)| g))
                .collect(),
        )
    }

    /// Take group `group_id` out, if it is waiting.
    pub fn remove(&mut self, group_id: u64) -> Option<TrajectoryGroup> {
        self.groups.remove(&group_id)
    }

    /// Every group waiting, oldest first.
    pub fn groups(&self) -> impl Iterator<Item = &TrajectoryGroup> {
        self.groups.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(id: u64) -> TrajectoryGroup {
        TrajectoryGroup {
            group_id: id,
            item_id: id.to_string(),
            prompt_ids: vec![0],
            admitted_at: 0,
            samples: Vec::new(),
        }
    }

    #[test]
    fn oldest_first_whatever_the_arrival_order() {
        let mut buffer = ReplayBuffer::new();
        for id in [5, 2, 9, 1] {
            buffer.push(group(id));
        }
        assert!(buffer.try_take(5).is_none());
        buffer.push(group(3));
        let ids: Vec<u64> = buffer
            .try_take(5)
            .unwrap()
            .iter()
            .map(|g| g.group_id)
            .collect();
        assert_eq!(ids, vec![1, 2, 3, 5, 9]);
        assert!(buffer.is_empty());
        buffer.push(group(7));
        buffer.push(group(4));
        assert_eq!(buffer.try_take(1).unwrap()[0].group_id, 4);
        assert!(buffer.try_take(2).is_none());
    }
}
