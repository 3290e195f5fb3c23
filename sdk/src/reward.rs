//! What a reward is: a value, a verdict and its provenance (plain data, carried by every
//! rewarded sample).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The outcome of verifying one sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Verdict {
    /// Fully correct.
    Accepted,
    /// Partly correct (a reward strictly between the minimum and the maximum).
    Partial,
    /// An answer was found and it is wrong.
    WrongAnswer,
    /// No answer could be extracted from the completion.
    NoAnswer,
    /// No code block could be extracted from the completion.
    NoCode,
    /// The graded program raised an error.
    RuntimeError,
    /// The graded program ran past its time limit.
    TimeLimit,
    /// The graded program ran past its memory limit.
    MemoryLimit,
    /// The graded program printed more than allowed.
    OutputLimit,
    /// The verifier did not finish before its deadline (set by the engine; costs the sample).
    VerifierTimeout,
    /// The verifier panicked (set by the engine; costs the sample).
    VerifierCrashed,
    /// The verifier failed (returned `Err`); costs the sample.
    Error,
}

impl Verdict {
    /// Whether the verifier, not the sample, failed: such samples are not trained on.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            Verdict::VerifierTimeout | Verdict::VerifierCrashed | Verdict::Error
        )
    }

    /// The verdict as it is written in JSON (`"wrong_answer"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Partial => "partial",
            Verdict::WrongAnswer => "wrong_answer",
            Verdict::NoAnswer => "no_answer",
            Verdict::NoCode => "no_code",
            Verdict::RuntimeError => "runtime_error",
            Verdict::TimeLimit => "time_limit",
            Verdict::MemoryLimit => "memory_limit",
            Verdict::OutputLimit => "output_limit",
            Verdict::VerifierTimeout => "verifier_timeout",
            Verdict::VerifierCrashed => "verifier_crashed",
            Verdict::Error => "error",
        }
    }
}

/// Where a reward came from: enough to audit or reproduce it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Registered name of the verifier.
    pub verifier: String,
    /// Version of the verifier (and of anything it embeds, such as an interpreter hash).
    pub verifier_version: String,
    /// Wall time of the verification in milliseconds, measured by the engine.
    pub wall_ms: f64,
    /// Fuel spent, for verifiers that meter execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Limits that applied (time, memory, output...).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub limits: Map<String, Value>,
    /// Anything else worth recording (parsed answers, failing test...).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub details: Map<String, Value>,
}

/// The largest reward magnitude the engine trains on: a reward must be finite and within
/// `±MAX_REWARD` (a million). Group statistics square rewards and sum them over a batch, and
/// rewards of order 10³⁰⁸ overflow them; real rewards are a few units. A verifier's reward
/// outside the range costs that sample (verdict `error`, naming the verifier and the value).
pub const MAX_REWARD: f64 = 1e6;

/// A reward given at the end of one turn of an episode
/// ([`EpisodeContext::reward_turn`](crate::EpisodeContext::reward_turn)).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnReward {
    /// Where the turn ends in the completion: the index after its last token.
    pub end: usize,
    /// The reward.
    pub value: f64,
}

/// A reward: a scalar for training plus what it means and where it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reward {
    /// The scalar the trainer sees: the reward at the end of the sample (an episode's outcome).
    pub value: f64,
    /// What the verifier concluded.
    pub verdict: Verdict,
    /// How it was obtained.
    pub provenance: Provenance,
    /// Rewards an episode gave at the end of earlier turns, in order (none for a single answer):
    /// each at the last token of its turn. The sample's return is `value` plus these
    /// ([`total`](Self::total)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<TurnReward>,
}

impl Reward {
    /// A reward of `value` with `verdict` and empty provenance.
    pub fn new(value: f64, verdict: Verdict) -> Self {
        Self {
            value,
            verdict,
            provenance: Provenance::default(),
            turns: Vec::new(),
        }
    }

    /// The sample's return: `value` plus the rewards of its turns.
    pub fn total(&self) -> f64 {
        self.value + self.turns.iter().map(|t| t.value).sum::<f64>()
    }

    /// Record a limit that applied.
    pub fn with_limit(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.provenance.limits.insert(key.to_owned(), value.into());
        self
    }

    /// Record a detail.
    pub fn with_detail(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.provenance.details.insert(key.to_owned(), value.into());
        self
    }

    /// Whether `value` is a reward the engine trains on (finite, within ±[`MAX_REWARD`]);
    /// the error says why not, naming the value.
    pub fn check_value(value: f64) -> Result<(), String> {
        if !value.is_finite() {
            Err(format!("a reward of {value}, which is not finite"))
        } else if value.abs() > MAX_REWARD {
            Err(format!(
                "a reward of {value:e}, outside ±{MAX_REWARD:e}, the range the engine trains on"
            ))
        } else {
            Ok(())
        }
    }

    /// Record the verifier's version.
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.provenance.verifier_version = version.into();
        self
    }
}
