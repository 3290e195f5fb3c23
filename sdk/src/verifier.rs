//! The [`RewardVerifier`] trait: what a verifier is given for a sample, and its deadline.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::PluginError;
use crate::generator::FaultStats;
use crate::reward::Reward;
use crate::trajectory::FinishReason;

/// What a verifier is given for one sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RewardInput {
    /// Unique id of the sample in the run.
    pub sample_id: u64,
    /// Id of the task item.
    pub item_id: String,
    /// The prompt text.
    pub prompt: String,
    /// The decoded completion.
    pub completion: String,
    /// The completion's token ids.
    pub completion_ids: Vec<u32>,
    /// Why generation ended (a truncated answer may deserve less).
    pub finish_reason: FinishReason,
    /// The task's reference for this item: an answer, unit tests...
    pub reference: Value,
    /// What else is known of the sample: the engine sets `data_source` (the task's name) and
    /// `split`; a caller such as `areal grade reward` passes its own keys. Plugins loaded at
    /// run time see it, with `item_id`, `finish_reason` and `completion_tokens` added (not
    /// `sample_id`: a reward is the sample's content's, and the reward cache keys it so).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
}

/// Call context of one verification.
#[derive(Clone, Debug)]
pub struct VerifyContext {
    deadline: Instant,
}

impl VerifyContext {
    /// A context whose deadline is `timeout` from now.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            deadline: Instant::now() + timeout,
        }
    }

    /// When the engine stops waiting. Past it, the sample is lost to a `verifier_timeout`
    /// whatever the verifier returns later, so long verifications should check it.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether the deadline has passed.
    pub fn expired(&self) -> bool {
        Instant::now() >= self.deadline
    }
}

/// Turns a sample into a [`Reward`].
///
/// Runs on the engine's reward threads, never on the generation path. A wrong answer is
/// `Ok` with a low reward; `Err` (or a panic, or missing the deadline) means the verifier
/// failed, and costs that one sample.
pub trait RewardVerifier: Send + Sync + 'static {
    /// Registered name.
    fn name(&self) -> &str;

    /// Verify one sample.
    fn verify(&self, input: &RewardInput, ctx: &VerifyContext) -> Result<Reward, PluginError>;

    /// What, beyond the sample, decides this verifier's rewards: its version, the sha256 of
    /// any plugin file it runs, its limits, options and environment. With
    /// `reward_service.cache = true` the engine keeps rewards under it and every field of the
    /// [`RewardInput`] but `sample_id`, so a verifier must change it whenever its rewards
    /// could change, and must not let a reward depend on `sample_id`. `None` (the default)
    /// keeps its rewards out of the cache.
    fn cache_identity(&self) -> Option<String> {
        None
    }

    /// What a verifier that calls servers lost on the way (samples sent again, servers that
    /// failed), for the run's summary; a verifier that computes in process keeps the default.
    fn faults(&self) -> FaultStats {
        FaultStats::default()
    }

    /// The async path of a verifier whose work is done elsewhere (a reward server): the
    /// engine's reward service awaits it instead of lending it one of its threads, so that
    /// any number of samples can be in flight whatever `reward_service.threads` says. `None`
    /// (the default): [`verify`](Self::verify) runs on the service's threads.
    fn as_async(&self) -> Option<&dyn AsyncVerifier> {
        None
    }
}

/// Verification that waits rather than computes (see [`RewardVerifier::as_async`]).
///
/// It bounds its own time: the engine awaits it without a deadline of its own, as a sample
/// waiting for a free server waits in the queue of the reward service's threads. The
/// deadline in `ctx` is the sample's budget once its verification starts.
#[async_trait::async_trait]
pub trait AsyncVerifier: Send + Sync {
    /// Verify one sample, as [`RewardVerifier::verify`] does.
    async fn verify(&self, input: &RewardInput, ctx: &VerifyContext)
    -> Result<Reward, PluginError>;
}
