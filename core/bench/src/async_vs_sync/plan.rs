//! Which runs the bench makes, in which order.

use super::results::RunKey;
use super::{AsyncVsSyncArgs, DECOUPLED, LOG_LINEAR, NAIVE, Workload};

pub(super) struct Plan {
    pub(super) workloads: Vec<Workload>,
    pub(super) staleness: Vec<u64>,
    pub(super) minibatches: Vec<usize>,
    pub(super) seeds: Vec<u64>,
    pub(super) ablation: Vec<u64>,
    pub(super) log_linear: Vec<u64>,
}

impl Plan {
    pub(super) fn from(args: &AsyncVsSyncArgs) -> Self {
        let quick = args.quick;
        Self {
            workloads: args.workloads.clone().unwrap_or_else(|| {
                if quick {
                    vec![Workload::Default]
                } else {
                    vec![Workload::Default, Workload::LongTail]
                }
            }),
            staleness: args
                .staleness
                .clone()
                .unwrap_or_else(|| if quick { vec![0, 4] } else { vec![0, 2, 4, 8] }),
            minibatches: args.minibatches.iter().map(|&m| m as usize).collect(),
            seeds: args
                .seeds
                .clone()
                .unwrap_or_else(|| if quick { vec![1] } else { vec![1, 2, 3] }),
            ablation: args
                .ablation
                .clone()
                .unwrap_or_else(|| if quick { vec![] } else { vec![0, 4, 8] }),
            log_linear: args
                .log_linear
                .clone()
                .unwrap_or_else(|| if quick { vec![] } else { vec![4] }),
        }
    }

    /// Every run, synchronous ones first (they fix the target), then by seed; every setting
    /// at each number of mini-batches.
    pub(super) fn runs(&self) -> Vec<RunKey> {
        let mut keys = Vec::new();
        for &workload in &self.workloads {
            for &minibatches in &self.minibatches {
                let key = |algorithm: &str, max_staleness, seed| RunKey {
                    workload,
                    algorithm: algorithm.into(),
                    minibatches,
                    max_staleness,
                    seed,
                };
                let mut etas = self.staleness.clone();
                etas.sort_by_key(|&e| e != 0);
                for &eta in &etas {
                    for &seed in &self.seeds {
                        keys.push(key(DECOUPLED, eta, seed));
                    }
                }
                if Some(&workload) == self.workloads.first() {
                    for (algorithm, etas) in
                        [(NAIVE, &self.ablation), (LOG_LINEAR, &self.log_linear)]
                    {
                        for &eta in etas {
                            for &seed in &self.seeds {
                                keys.push(key(algorithm, eta, seed));
                            }
                        }
                    }
                }
            }
        }
        keys
    }
}
