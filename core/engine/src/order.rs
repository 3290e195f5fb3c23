//! The order in which a split's items are drawn.

use areal_sdk::mix_seed;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// Train-split indices: in order for unbounded tasks, a fresh shuffle per epoch otherwise.
pub(crate) struct DataOrder {
    len: Option<usize>,
    seed: u64,
    next: u64,
    epoch: Option<u64>,
    permutation: Vec<u64>,
}

impl DataOrder {
    /// The order of a split of `len` items (`None`: unbounded), shuffled by `seed`.
    pub(crate) fn new(len: Option<usize>, seed: u64) -> Self {
        Self {
            len,
            seed,
            next: 0,
            epoch: None,
            permutation: Vec::new(),
        }
    }

    /// The next item's index.
    pub(crate) fn next_index(&mut self) -> u64 {
        let n = self.next;
        self.next += 1;
        let Some(len) = self.len else { return n };
        let epoch = n / len as u64;
        if self.epoch != Some(epoch) {
            self.permutation = (0..len as u64).collect();
            self.permutation
                .shuffle(&mut StdRng::seed_from_u64(mix_seed(self.seed, epoch)));
            self.epoch = Some(epoch);
        }
        self.permutation[(n % len as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::DataOrder;

    #[test]
    fn each_epoch_is_a_permutation_and_unbounded_splits_go_in_order() {
        let mut order = DataOrder::new(Some(5), 3);
        for _ in 0..3 {
            let mut epoch: Vec<u64> = (0..5).map(|_| order.next_index()).collect();
            epoch.sort_unstable();
            assert_eq!(epoch, vec![0, 1, 2, 3, 4]);
        }
        let mut unbounded = DataOrder::new(None, 3);
        assert_eq!(
            (0..4).map(|_| unbounded.next_index()).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
    }
}
