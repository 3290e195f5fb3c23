//! The replay buffer: accepted groups wait here; the trainer takes the oldest first.

use std::collections::BTreeMap;
use std::sync::Mutex;

use areal_sdk::TrajectoryGroup;
use tokio::sync::Notify;

/// Accepted groups keyed by submission order. Nothing is dropped for being stale.
#[derive(Debug, Default)]
pub struct ReplayBuffer {
    groups: Mutex<BTreeMap<u64, TrajectoryGroup>>,
    added: Notify,
}

impl ReplayBuffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add an accepted group.
    pub fn push(&self, group: TrajectoryGroup) {
        let mut groups = self.groups.lock().expect("buffer lock poisoned");
        let previous = groups.insert(group.group_id, group);
        assert!(previous.is_none(), "group ids are unique");
        drop(groups);
        self.added.notify_waiters();
    }

    /// Groups waiting.
    pub fn len(&self) -> usize {
        self.groups.lock().expect("buffer lock poisoned").len()
    }

    /// Whether no group is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Take the `n` oldest groups (smallest submission order) if at least `n` are waiting.
    pub fn try_take(&self, n: usize) -> Option<Vec<TrajectoryGroup>> {
        let mut groups = self.groups.lock().expect("buffer lock poisoned");
        if groups.len() < n {
            return None;
        }
        Some(
            (0..n)
                .filter_map(|_| groups.pop_first().map(|(_, g)| g))
                .collect(),
        )
    }

    /// Wait until `n` groups are waiting, then take the oldest `n`.
    pub async fn take(&self, n: usize) -> Vec<TrajectoryGroup> {
        loop {
            let added = self.added.notified();
            if let Some(groups) = self.try_take(n) {
                return groups;
            }
            added.await;
        }
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

    #[tokio::test]
    async fn oldest_first_whatever_the_arrival_order() {
        let buffer = std::sync::Arc::new(ReplayBuffer::new());
        for id in [5, 2, 9, 1] {
            buffer.push(group(id));
        }
        let waiter = {
            let buffer = buffer.clone();
            tokio::spawn(async move { buffer.take(5).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        buffer.push(group(3));
        let ids: Vec<u64> = waiter.await.unwrap().iter().map(|g| g.group_id).collect();
        assert_eq!(ids, vec![1, 2, 3, 5, 9]);
        assert!(buffer.is_empty());
        buffer.push(group(7));
        buffer.push(group(4));
        assert_eq!(buffer.try_take(1).unwrap()[0].group_id, 4);
        assert!(buffer.try_take(2).is_none());
    }
}
