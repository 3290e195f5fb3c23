//! The order in which a split's items are drawn.

use areal_sdk::mix_seed;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// Train-split indices: in order for unbounded tasks, a fresh shuffle per epoch otherwise.
pub(crate) struct DataOrder {
    len: Option<usize>,
    seed: u64,
    epoch: Option<u64>,
    permutation: Vec<u64>,
}

impl DataOrder {
    /// The order of a split of `len` items (`None`: unbounded), shuffled by `seed`.
    pub(crate) fn new(len: Option<usize>, seed: u64) -> Self {
        Self {
            len,
            seed,
            epoch: None,
            permutation: Vec::new(),
        }
    }

    /// The index of the `n`-th item drawn (from 0): a function of the seed and `n` alone, so a
    /// resumed run draws on from where it was.
    pub(crate) fn index(&mut self, n: u64) -> u64 {
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
        let drawn: Vec<u64> = (0..15).map(|n| order.index(n)).collect();
        for epoch in drawn.chunks(5) {
            let mut epoch = epoch.to_vec();
            epoch.sort_unstable();
            assert_eq!(epoch, vec![0, 1, 2, 3, 4]);
        }
        assert_ne!(drawn[..5], drawn[5..10], "each epoch is shuffled afresh");
        // drawn in any order, an index is the same: a resumed run draws on where it was
        let mut again = DataOrder::new(Some(5), 3);
        assert_eq!(again.index(12), drawn[12]);
        assert_eq!(again.index(1), drawn[1]);
        let mut unbounded = DataOrder::new(None, 3);
        assert_eq!(
            (0..4).map(|n| unbounded.index(n)).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
    }
}
