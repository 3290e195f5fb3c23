//! `results.json`: every run of the bench, the targets, each run's time to target.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::{DECOUPLED, Workload};
use crate::stats::mean;

/// What a run is: everything that tells two runs apart.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(super) struct RunKey {
    pub(super) workload: Workload,
    /// `decoupled-ppo`, `ppo`, or `decoupled-ppo-log-linear`.
    pub(super) algorithm: String,
    /// `train.minibatches`: optimizer steps per batch (results written before it was a
    /// dimension had 1).
    #[serde(default = "one")]
    pub(super) minibatches: usize,
    pub(super) max_staleness: u64,
    pub(super) seed: u64,
}

fn one() -> usize {
    1
}

/// One evaluated point of a run's learning curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct CurvePoint {
    pub(super) step: u64,
    /// Seconds of RL when these weights were ready.
    pub(super) wall_s: f64,
    pub(super) accuracy: f64,
}

/// One run in `results.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct RunRecord {
    #[serde(flatten)]
    pub(super) key: RunKey,
    /// Seconds of RL to the first evaluated weights at or above the target; the whole RL
    /// time when never (`reached` false). `None` until the workload's target is known.
    pub(super) time_to_target_s: Option<f64>,
    pub(super) reached: Option<bool>,
    pub(super) final_accuracy: f64,
    /// Fraction of RL time the generator spent computing.
    pub(super) gen_busy: Option<f64>,
    /// Fraction of RL time the trainer spent computing.
    pub(super) train_busy: f64,
    /// Generated tokens trained on per second of RL.
    pub(super) tokens_per_s: f64,
    pub(super) steps: u64,
    /// Seconds of RL in all.
    pub(super) wall_s: f64,
    pub(super) stopped_early: bool,
    pub(super) gen_threads: usize,
    pub(super) train_threads: usize,
    pub(super) token_lag_mean: f64,
    pub(super) token_lag_max: u64,
    /// Mean milliseconds of the weight-update protocol.
    pub(super) weight_sync_ms: f64,
    /// Mean milliseconds from an interruption to decoding running again.
    pub(super) resume_ms: Option<f64>,
    /// Mean |log π_trainer − log π_behav| over the tokens trained with a lag of 1 or more,
    /// under the weights each step starts from.
    #[serde(default)]
    pub(super) staleness_abs_mean: Option<f64>,
    pub(super) curve: Vec<CurvePoint>,
}

/// `results.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Results {
    /// The default workload's target (also in `targets`).
    pub(super) target_accuracy: Option<f64>,
    /// Each workload's target: 90 % of its synchronous decoupled-PPO runs' mean final
    /// accuracy (those with the fewest mini-batches, when several were run).
    pub(super) targets: BTreeMap<String, f64>,
    /// What every run shares; a second call must agree.
    pub(super) settings: serde_json::Value,
    pub(super) runs: Vec<RunRecord>,
}

impl RunRecord {
    /// Mean accuracy of the evaluations in the last `steps` steps of the run: the end of the
    /// curve with less of one evaluation's noise.
    pub(super) fn late_accuracy(&self, steps: u64) -> f64 {
        let last = self.curve.last().map_or(0, |p| p.step);
        let late: Vec<f64> = self
            .curve
            .iter()
            .filter(|p| p.step + steps >= last)
            .map(|p| p.accuracy)
            .collect();
        mean(&late)
    }
}

impl Results {
    pub(super) fn has(&self, key: &RunKey) -> bool {
        self.runs.iter().any(|r| &r.key == key)
    }

    /// Targets from the synchronous runs, and every run's time to target.
    pub(super) fn settle(&mut self) {
        self.targets.clear();
        let mut finals: BTreeMap<Workload, (usize, Vec<f64>)> = BTreeMap::new();
        for r in &self.runs {
            if r.key.max_staleness == 0 && r.key.algorithm == DECOUPLED {
                let entry = finals
                    .entry(r.key.workload)
                    .or_insert((r.key.minibatches, Vec::new()));
                if r.key.minibatches < entry.0 {
                    *entry = (r.key.minibatches, Vec::new());
                }
                if r.key.minibatches == entry.0 {
                    entry.1.push(r.final_accuracy);
                }
            }
        }
        let targets: BTreeMap<Workload, f64> = finals
            .into_iter()
            .map(|(w, (_, a))| (w, 0.9 * mean(&a)))
            .collect();
        for (w, t) in &targets {
            self.targets.insert(w.name().to_owned(), *t);
        }
        self.target_accuracy = targets.get(&Workload::Default).copied();
        for r in &mut self.runs {
            match targets.get(&r.key.workload) {
                Some(&target) => {
                    let hit = r.curve.iter().find(|p| p.accuracy >= target);
                    r.reached = Some(hit.is_some());
                    r.time_to_target_s = Some(hit.map_or(r.wall_s, |p| p.wall_s));
                }
                None => (r.reached, r.time_to_target_s) = (None, None),
            }
        }
    }

    pub(super) fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join("results.json");
        let tmp = dir.join("results.json.tmp");
        let text = serde_json::to_string_pretty(self).expect("results serialise");
        std::fs::write(&tmp, text + "\n")
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
    }
}
