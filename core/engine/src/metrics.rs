//! Per-step, evaluation and warm-up metrics, staleness statistics and the `metrics.jsonl` writer.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use areal_sdk::{PolicyVersion, TrajectoryGroup};
use serde::{Deserialize, Serialize};

use crate::atomic::AppendFile;
use crate::trainer::{LogprobGap, OffPolicyStats};

/// How stale the trained data was, relative to the trainer's version k.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StalenessStats {
    /// Mean over trajectories of k − (version of the first generated token).
    pub head_lag_mean: f64,
    /// Largest head lag.
    pub head_lag_max: u64,
    /// Mean over generated tokens of k − (version that sampled the token).
    pub token_lag_mean: f64,
    /// Largest token lag.
    pub token_lag_max: u64,
}

/// Staleness of `groups` trained by a step on version `trainer_version`.
pub fn staleness(groups: &[TrajectoryGroup], trainer_version: PolicyVersion) -> StalenessStats {
    // A token from a version newer than the trainer's would be a generator's bug: lag 0.
    let (mut heads, mut head_sum, mut head_max) = (0usize, 0u64, 0u64);
    let (mut tokens, mut token_sum, mut token_max) = (0usize, 0u64, 0u64);
    for sample in groups.iter().flat_map(|g| &g.samples) {
        if let Some(head) = sample.head_version() {
            let lag = trainer_version.saturating_sub(head);
            heads += 1;
            head_sum += lag;
            head_max = head_max.max(lag);
        }
        for v in sample.completion.sampled_versions() {
            let lag = trainer_version.saturating_sub(v);
            tokens += 1;
            token_sum += lag;
            token_max = token_max.max(lag);
        }
    }
    StalenessStats {
        head_lag_mean: if heads > 0 {
            head_sum as f64 / heads as f64
        } else {
            0.0
        },
        head_lag_max: head_max,
        token_lag_mean: if tokens > 0 {
            token_sum as f64 / tokens as f64
        } else {
            0.0
        },
        token_lag_max: token_max,
    }
}

/// Nearest-rank percentile `p` (0–100) of `values`; 0 for no values.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// What one training step reports; one line of `metrics.jsonl` (`"event": "step"`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepMetrics {
    /// Step number, from 1.
    pub step: u64,
    /// Policy version after the step (each mini-batch's optimizer step adds one).
    pub policy_version: PolicyVersion,
    /// Seconds since the run started.
    pub wall_s: f64,
    /// Mean reward of the trained samples.
    pub reward_mean: f64,
    /// Fraction of trained samples with verdict `accepted`.
    pub accepted_fraction: f64,
    /// Groups trained.
    pub groups: usize,
    /// Samples trained.
    pub samples: usize,
    /// Generated tokens trained on.
    pub trained_tokens: usize,
    /// Tokens through the forward and backward passes (prompts included).
    pub packed_tokens: usize,
    /// Mean completion length.
    pub response_len_mean: f64,
    /// Longest completion.
    pub response_len_max: usize,
    /// Staleness of the trained data.
    #[serde(flatten)]
    pub staleness: StalenessStats,
    /// Tokens generated per second since the previous step (all samples, trained or not).
    pub gen_tokens_per_s: f64,
    /// Packed tokens (prompt + completion) through forward and backward per second of the
    /// trainer's compute.
    pub train_tokens_per_s: f64,
    /// Median reward latency (queue + verification) in milliseconds since the previous step.
    pub reward_latency_p50_ms: f64,
    /// 99th-percentile reward latency in milliseconds since the previous step.
    pub reward_latency_p99_ms: f64,
    /// The share of rewards since the previous step that the reward cache answered (0 without
    /// `reward_service.cache`).
    #[serde(default)]
    pub reward_cache_hit_rate: f64,
    /// Groups waiting in the buffer after this step took its batch.
    pub buffer_size: usize,
    /// Rollouts generating when the step ended.
    pub running: u64,
    /// Groups accepted so far.
    pub accepted_total: u64,
    /// Groups rejected so far (failed or filtered).
    pub rejected_total: u64,
    /// Samples lost to verifier failures since the previous step.
    pub reward_failures: u64,
    /// Samples whose generation was interrupted by a weight update since the previous step.
    pub interrupted_samples: u64,
    /// Training episodes that ended since the previous step (trained or not; evaluation's
    /// are not counted).
    #[serde(default)]
    pub episodes: u64,
    /// Turns per episode, over those episodes (1 for single-turn runs).
    #[serde(default)]
    pub turns_per_episode: f64,
    /// The share of those episodes that called a tool at least once.
    #[serde(default)]
    pub tool_call_fraction: f64,
    /// Tool calls those episodes made.
    #[serde(default)]
    pub tool_calls: u64,
    /// Of which came back as errors (a malformed call, an unknown tool, a limit, a traceback).
    #[serde(default)]
    pub tool_errors: u64,
    /// Of those episodes, those compared with their conversation as the model's chat template
    /// renders it (prompts in the chat format, environment text appended as messages).
    #[serde(default)]
    pub retokenization_checked: u64,
    /// Of which spelled another text than the template renders for their conversation (0 for
    /// areal-rs's own episodes where the template writes history as it was generated).
    #[serde(default)]
    pub retokenization_mismatches: u64,
    /// Of which spelled the rendering in other tokens than tokenizing it again gives: what a
    /// system that decodes and tokenizes again would have trained on instead.
    #[serde(default)]
    pub retokenization_drift: u64,
    /// Times an episode split its sample in two, where a client rewrote the history its
    /// next turn reads (the agent proxy): each part is a sample of its own, nothing is
    /// tokenized again.
    #[serde(default)]
    pub episode_splits: u64,
    /// Loss summed over mini-batches.
    pub loss: f64,
    /// Gradient norm before clipping (last mini-batch).
    pub grad_norm: f64,
    /// Micro-batches in the step.
    pub microbatches: usize,
    /// Milliseconds the trainer waited for data.
    pub wait_ms: f64,
    /// Milliseconds of the training computation.
    pub train_ms: f64,
    /// Milliseconds from new weights ready to generators resumed.
    pub weight_sync_ms: f64,
    /// Fraction of the time since the previous step that the generator spent computing
    /// (`None` when the generator does not measure it).
    pub gen_busy: Option<f64>,
    /// Mean milliseconds from a weight update interrupting decoding to decoding running again
    /// (weights loaded, interrupted samples prefilled again), over the updates since the
    /// previous step that interrupted something (`None` when none did or not measured).
    pub resume_ms: Option<f64>,
    /// Mean |logπ_prox − logπ_behav| over tokens sampled by the trainer's version: 0 up to
    /// rounding when generator and trainer agree.
    pub on_policy_logprob_gap: f64,
    /// Mismatch (generator against trainer on tokens of the trainer's version) apart from
    /// staleness (π_behav against the trainer's version on older tokens): every token with
    /// the proximal recompute, the first mini-batch's without it; `docs/architecture.md` has
    /// the formulas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_policy: Option<OffPolicyStats>,
    /// Samples of the batch that trained no token for their lag (`rollout.max_lag_policy =
    /// "withhold"`); their rewards were in their groups' baselines.
    #[serde(default)]
    pub samples_withheld: usize,
    /// Statistics reported by the algorithm (clip fraction, ...).
    pub algorithm: BTreeMap<String, f64>,
    /// The ids of the samples trained, as ranges `[start, end)`.
    pub sample_ids: Vec<[u64; 2]>,
}

/// One held-out evaluation; a line of `metrics.jsonl` (`"event": "eval"`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    /// Steps done before this evaluation.
    pub step: u64,
    /// Policy version evaluated.
    pub policy_version: PolicyVersion,
    /// Seconds since the run started.
    pub wall_s: f64,
    /// Fraction of items whose greedy completion was `accepted`.
    pub accuracy: f64,
    /// Mean reward.
    pub reward_mean: f64,
    /// Items evaluated.
    pub items: usize,
    /// Items lost to verifier failures.
    pub failures: usize,
}

/// Appends events to `metrics.jsonl`.
#[derive(Debug)]
pub struct MetricsWriter {
    file: AppendFile,
}

impl MetricsWriter {
    /// Create (truncate) `path`.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        AppendFile::create(path).map(|file| Self { file })
    }

    /// Open `path` to go on after its first `bytes` bytes (what follows is cut off).
    pub fn resume(path: &Path, bytes: u64) -> std::io::Result<Self> {
        AppendFile::resume(path, bytes).map(|file| Self { file })
    }

    /// Put everything written on disk; the file's length.
    pub fn sync(&mut self) -> std::io::Result<u64> {
        self.file.sync()
    }

    /// The file written to.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Write one event: the record's fields plus `"event": kind`.
    pub fn write<T: Serialize>(&mut self, kind: &str, record: &T) -> std::io::Result<()> {
        let mut value = serde_json::to_value(record).map_err(std::io::Error::other)?;
        if let serde_json::Value::Object(map) = &mut value {
            map.insert("event".into(), kind.into());
        }
        let out = self.file.writer();
        serde_json::to_writer(&mut *out, &value).map_err(std::io::Error::other)?;
        out.write_all(b"\n")?;
        out.flush()
    }
}

/// One line of `metrics.jsonl` (`"event": "warmup"`) per evaluation of the warm-up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmupMetrics {
    /// Warm-up steps done.
    pub step: u64,
    /// Mean loss (negative logprob per demonstration token) since the previous evaluation.
    pub loss: f64,
    /// Greedy accuracy on the validation split.
    pub validation_accuracy: f64,
    /// Mean negative logprob per token of the validation split's demonstrations.
    pub validation_loss: f64,
    /// Seconds since the warm-up started.
    pub seconds: f64,
    /// Demonstration tokens trained per second since the previous evaluation.
    pub tokens_per_s: f64,
}

/// What the warm-up did (or what the cached one it reused did).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmupReport {
    /// Steps trained.
    pub steps: u64,
    /// Wall time of the warm-up when it ran (also when it is reused from the cache).
    pub seconds: f64,
    /// The step whose weights the warm-up ends with: the evaluation with the best validation
    /// accuracy (the first of equals), or the last step when the policy cannot save.
    #[serde(default)]
    pub best_step: u64,
    /// Validation accuracy at the last evaluation.
    pub validation_accuracy: f64,
    /// Best validation accuracy seen: that of the weights the warm-up ends with.
    pub best_validation_accuracy: f64,
    /// Whether it stopped at a plateau (rather than at `max_steps`).
    pub plateau: bool,
    /// Every evaluation.
    pub curve: Vec<WarmupMetrics>,
    /// Whether this run reused a cached warm-up.
    #[serde(default)]
    pub cached: bool,
}

/// What the summary needs of the steps so far; a checkpoint carries it, so that the summary
/// of a resumed run covers the whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct RlTotals {
    pub(crate) steps: u64,
    pub(crate) trained_tokens: u64,
    /// Σ token lag (token-weighted), for the mean.
    pub(crate) token_lag_sum: f64,
    pub(crate) token_lag_max: u64,
    pub(crate) train_ms: f64,
    pub(crate) weight_sync_ms: f64,
    pub(crate) reward_failures: u64,
    pub(crate) reward_mean_first: f64,
    pub(crate) reward_mean_last: f64,
    pub(crate) policy_version: PolicyVersion,
    /// The RL clock of the run's earlier processes.
    pub(crate) clock: ClockTotals,
    /// Re-issued samples and failed endpoints of the earlier processes.
    pub(crate) reissued_samples: u64,
    pub(crate) endpoint_failures: u64,
    /// Mismatch and staleness over the steps that measured them.
    #[serde(default)]
    pub(crate) mismatch: GapTotals,
    #[serde(default)]
    pub(crate) staleness: GapTotals,
    #[serde(default)]
    pub(crate) samples_withheld: u64,
}

/// Token-weighted sums of the steps' [`LogprobGap`]s.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct GapTotals {
    pub(crate) tokens: u64,
    pub(crate) abs_sum: f64,
    pub(crate) abs_max: f64,
    pub(crate) kl_k3_sum: f64,
}

impl GapTotals {
    fn add(&mut self, g: &LogprobGap) {
        let n = g.tokens as f64;
        self.tokens += g.tokens;
        self.abs_sum += g.abs_mean * n;
        self.abs_max = self.abs_max.max(g.abs_max);
        self.kl_k3_sum += g.kl_k3 * n;
    }

    /// Mean |Δ log π| and mean k3 over the tokens counted (`None` when none was).
    pub(crate) fn means(&self) -> Option<(f64, f64)> {
        (self.tokens > 0).then(|| {
            let n = self.tokens as f64;
            (self.abs_sum / n, self.kl_k3_sum / n)
        })
    }
}

impl RlTotals {
    /// Count the step `m`.
    pub(crate) fn add(&mut self, m: &StepMetrics) {
        if self.steps == 0 {
            self.reward_mean_first = m.reward_mean;
        }
        self.steps += 1;
        self.trained_tokens += m.trained_tokens as u64;
        self.token_lag_sum += m.staleness.token_lag_mean * m.trained_tokens as f64;
        self.token_lag_max = self.token_lag_max.max(m.staleness.token_lag_max);
        self.train_ms += m.train_ms;
        self.weight_sync_ms += m.weight_sync_ms;
        self.reward_failures += m.reward_failures;
        self.reward_mean_last = m.reward_mean;
        self.policy_version = m.policy_version;
        if let Some(o) = &m.off_policy {
            self.mismatch.add(&o.mismatch);
            self.staleness.add(&o.staleness);
        }
        self.samples_withheld += m.samples_withheld as u64;
    }
}

/// The RL clock of a run's earlier processes: seconds of RL, and the generator's busy time and
/// resumes in them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ClockTotals {
    pub(crate) seconds: f64,
    pub(crate) busy_seconds: Option<f64>,
    pub(crate) resumes: u64,
    pub(crate) resume_seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use areal_sdk::{Completion, FinishReason, Reward, Trajectory, Verdict};

    fn sample(versions: &[u64]) -> Trajectory {
        Trajectory {
            sample_id: 0,
            completion: Completion {
                token_ids: vec![0; versions.len()],
                behaviour_logprobs: vec![-1.0; versions.len()],
                versions: versions.to_vec(),
                finish_reason: FinishReason::Stop,
            },
            reward: Reward::new(0.0, Verdict::WrongAnswer),
        }
    }

    #[test]
    fn staleness_on_a_constructed_schedule() {
        // trained at version 5:
        //   a: started at 2, interrupted twice → tokens at 2, 2, 3, 4     head lag 3, token lags 3,3,2,1
        //   b: all at 5                                                  head lag 0, token lags 0,0
        //   c: started at 4, continued at 5                              head lag 1, token lags 1,0,0
        //   d: empty completion (no head)                                —
        let groups = vec![
            TrajectoryGroup {
                group_id: 0,
                item_id: "x".into(),
                prompt_ids: vec![1],
                admitted_at: 2,
                samples: vec![sample(&[2, 2, 3, 4]), sample(&[5, 5])],
            },
            TrajectoryGroup {
                group_id: 1,
                item_id: "y".into(),
                prompt_ids: vec![1],
                admitted_at: 4,
                samples: vec![sample(&[4, 5, 5]), sample(&[])],
            },
        ];
        let s = staleness(&groups, 5);
        assert_eq!(s.head_lag_max, 3);
        assert!((s.head_lag_mean - 4.0 / 3.0).abs() < 1e-12, "{s:?}");
        assert_eq!(s.token_lag_max, 3);
        assert!((s.token_lag_mean - 10.0 / 9.0).abs() < 1e-12, "{s:?}");
        assert_eq!(staleness(&[], 3), StalenessStats::default());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), 2.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
