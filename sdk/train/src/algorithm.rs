//! The [`Algorithm`] trait: a PPO variant as advantages plus a loss.

use std::collections::BTreeMap;
use std::ops::Range;

use areal_sdk::{PluginError, PolicyVersion, TrajectoryGroup};
use burn::tensor::Tensor;

/// log π_θ(token): the policy being optimised, tracked for gradients.
#[derive(Clone, Debug)]
pub struct CurrentLogprobs(pub Tensor<1>);

/// log π_prox(token): the trainer's weights before this update (version k when the step
/// produces k+1), or an approximation of them; a constant for the gradient.
#[derive(Clone, Debug)]
pub struct ProximalLogprobs(pub Tensor<1>);

/// log π_behav(token): the policy that sampled the token, as the generator reported it; a
/// constant for the gradient.
#[derive(Clone, Debug)]
pub struct BehaviourLogprobs(pub Tensor<1>);

/// log π_ref(token): a frozen reference policy (the weights when reinforcement learning
/// started), for KL penalties; a constant for the gradient.
#[derive(Clone, Debug)]
pub struct ReferenceLogprobs(pub Tensor<1>);

/// How the engine obtains the proximal logprobs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProximalMode {
    /// Recompute them with a no-grad forward pass before the update (decoupled PPO).
    #[default]
    Recompute,
    /// Use the behaviour logprobs (standard PPO: π_prox = π_behav). No extra pass.
    Behaviour,
    /// Interpolate in log space between behaviour and current logprobs by version:
    /// `logπ_prox ≈ logπ_behav + α·(sg(logπ_θ) − logπ_behav)`,
    /// `α = clamp((k − v_behav)/(k + 1 − v_behav), 0, 1)` for trainer version k. No extra pass.
    LogLinear,
}

/// What an algorithm needs from the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Requirements {
    /// How proximal logprobs are produced.
    pub proximal: ProximalMode,
    /// Logprobs of a frozen reference policy (a copy of the weights when RL starts), for a KL
    /// penalty. Costs one more no-grad forward pass per step.
    pub reference: bool,
    /// Value estimates from the policy's value head (a critic), before the update and with
    /// gradient; the policy must support [`Policy::values`](crate::Policy::values).
    pub values: bool,
}

impl Requirements {
    /// Requirements with the given proximal mode, no reference policy and no values.
    pub fn new(proximal: ProximalMode) -> Self {
        Self {
            proximal,
            reference: false,
            values: false,
        }
    }

    /// Also ask for reference logprobs.
    pub fn with_reference(mut self, reference: bool) -> Self {
        self.reference = reference;
        self
    }

    /// Also ask for values.
    pub fn with_values(mut self, values: bool) -> Self {
        self.values = values;
        self
    }
}

/// What advantages are computed from: the groups, and per-token numbers the engine computed
/// before the update. Every per-token vector has one entry per token of a sample's completion,
/// in flat order (groups in order, samples in order within each group). An episode's
/// completion holds the environment's tokens between the policy's turns
/// ([`Completion::is_sampled`](areal_sdk::Completion::is_sampled) is false there, and the
/// logprobs are 0): whatever an algorithm puts at those tokens is not trained on
/// ([`advantages::sampled_masks`](crate::advantages::sampled_masks) helps leave them out).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct AdvantageInput<'a> {
    /// The groups, with rewards.
    pub groups: &'a [TrajectoryGroup],
    /// log π_old of each generated token: the proximal logprobs when they are recomputed, the
    /// behaviour logprobs otherwise. A KL penalty in the reward measures this policy.
    pub old_logprobs: &'a [Vec<f32>],
    /// log π_ref of each generated token, when [`Requirements::reference`] is set.
    pub reference: Option<&'a [Vec<f32>]>,
    /// V(prefix) before each generated token, when [`Requirements::values`] is set.
    pub values: Option<&'a [Vec<f32>]>,
}

impl<'a> AdvantageInput<'a> {
    /// An input with only `groups` and `old_logprobs`.
    pub fn new(groups: &'a [TrajectoryGroup], old_logprobs: &'a [Vec<f32>]) -> Self {
        Self {
            groups,
            old_logprobs,
            reference: None,
            values: None,
        }
    }

    /// With reference logprobs.
    pub fn with_reference(mut self, reference: &'a [Vec<f32>]) -> Self {
        self.reference = Some(reference);
        self
    }

    /// With values.
    pub fn with_values(mut self, values: &'a [Vec<f32>]) -> Self {
        self.values = Some(values);
        self
    }
}

/// Advantages of every generated token, and the value targets when the algorithm trains a
/// critic. Vectors are in flat order, each as long as its sample's completion.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Advantages {
    /// Per-token advantages.
    pub advantages: Vec<Vec<f32>>,
    /// Per-token returns (value targets); `None` without a critic.
    pub returns: Option<Vec<Vec<f32>>>,
}

impl From<Vec<Vec<f32>>> for Advantages {
    fn from(advantages: Vec<Vec<f32>>) -> Self {
        Self {
            advantages,
            returns: None,
        }
    }
}

/// One micro-batch, packed, with everything a loss needs. Every tensor has one entry per token
/// of the packed sequences (prompt tokens and an episode's environment tokens included, masked
/// out by `loss_mask`): a loss must give those tokens no gradient and count only the tokens
/// the mask keeps (the testkit's `check_algorithm` checks both).
#[derive(Clone, Debug)]
pub struct LossInput {
    /// Current logprobs (with gradient).
    pub current: CurrentLogprobs,
    /// Proximal logprobs (constant).
    pub proximal: ProximalLogprobs,
    /// Behaviour logprobs (constant; 0 where no policy sampled the token).
    pub behaviour: BehaviourLogprobs,
    /// Per-token advantages (0 where no policy sampled the token).
    pub advantages: Tensor<1>,
    /// 1.0 on the tokens a policy sampled, 0.0 on the prompt's and the environment's.
    pub loss_mask: Tensor<1>,
    /// Version of the policy that sampled each token (`PROMPT_VERSION` where none did).
    pub versions: Vec<PolicyVersion>,
    /// Range of each sequence's completion in the packed layout (an episode's environment
    /// tokens inside it; [`trained_tokens`](Self::trained_tokens) counts the others).
    pub completions: Vec<Range<usize>>,
    /// Tokens trained on in the whole mini-batch (all its micro-batches): the token-mean
    /// normaliser, so that summing micro-batch losses gives the mini-batch loss.
    pub minibatch_tokens: usize,
    /// Sequences in the whole mini-batch: the normaliser of per-sequence averaging.
    pub minibatch_sequences: usize,
    /// Version k of the weights being updated (the step produces k + 1).
    pub trainer_version: PolicyVersion,
    /// Reference logprobs (constant), when [`Requirements::reference`] is set.
    pub reference: Option<ReferenceLogprobs>,
    /// Values with gradient, values before the update (constant) and returns (constant), when
    /// [`Requirements::values`] is set.
    pub critic: Option<CriticInput>,
}

impl LossInput {
    /// How many tokens of sequence `sequence`'s completion are trained on (sampled by a
    /// policy): the length a per-sequence mean divides by.
    pub fn trained_tokens(&self, sequence: usize) -> usize {
        self.completions.get(sequence).map_or(0, |r| {
            self.versions[r.clone()]
                .iter()
                .filter(|&&v| v != areal_sdk::PROMPT_VERSION)
                .count()
        })
    }
}

/// What a value loss needs; every tensor has one entry per token, like [`LossInput`]'s.
#[derive(Clone, Debug)]
pub struct CriticInput {
    /// V(prefix) from the value head, tracked for gradients.
    pub values: Tensor<1>,
    /// V(prefix) before the update (constant), for value clipping.
    pub old_values: Tensor<1>,
    /// Value targets (constant) from [`Advantages::returns`].
    pub returns: Tensor<1>,
}

/// Named statistics accumulated as sums and counts, reported as means.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LossStats {
    entries: BTreeMap<String, (f64, f64)>,
}

impl LossStats {
    /// Add `sum` over `count` items to statistic `name` (e.g. clipped tokens over all tokens).
    pub fn add(&mut self, name: &str, sum: f64, count: f64) {
        let entry = self.entries.entry(name.to_owned()).or_insert((0.0, 0.0));
        entry.0 += sum;
        entry.1 += count;
    }

    /// Fold another set of statistics into this one.
    pub fn merge(&mut self, other: &LossStats) {
        for (name, (sum, count)) in &other.entries {
            self.add(name, *sum, *count);
        }
    }

    /// Mean of each statistic (0 where nothing was counted).
    pub fn means(&self) -> BTreeMap<String, f64> {
        self.entries
            .iter()
            .map(|(name, (sum, count))| {
                (name.clone(), if *count > 0.0 { sum / count } else { 0.0 })
            })
            .collect()
    }
}

/// A loss for one micro-batch with its statistics.
#[derive(Clone, Debug)]
pub struct LossOutput {
    /// One-element tensor; the engine calls backward on it. Normalise by the mini-batch
    /// (see [`LossInput::minibatch_tokens`]), not by the micro-batch.
    pub loss: Tensor<1>,
    /// Statistics such as the clipped fraction.
    pub stats: LossStats,
}

/// A policy-gradient algorithm: how rewards become advantages, and the loss.
pub trait Algorithm: Send + Sync + 'static {
    /// Registered name.
    fn name(&self) -> &str;

    /// What the engine must provide; by default proximal logprobs are recomputed.
    fn requirements(&self) -> Requirements {
        Requirements::default()
    }

    /// Whether a finished group is worth training on (e.g. DAPO drops groups whose rewards
    /// are all equal). A dropped group counts as rejected: it frees its admission slot.
    fn keep_group(&self, group: &TrajectoryGroup) -> bool {
        let _ = group;
        true
    }

    /// Per-token advantages of every sample: one vector per sample, groups in order and
    /// samples in order within each group, each as long as the sample's completion; and
    /// value targets when the algorithm trains a critic.
    fn advantages(&self, input: &AdvantageInput<'_>) -> Result<Advantages, PluginError>;

    /// The loss of one micro-batch.
    fn loss(&self, input: &LossInput) -> Result<LossOutput, PluginError>;
}
