//! What flows from generation to training: requests, completions, trajectories, weights.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::reward::Reward;

/// A policy version: 0 for the initial weights, +1 for every optimizer step. One type end to
/// end: tokens, weight updates, admission counters and metrics.
pub type PolicyVersion = u64;

/// The version recorded for a token no policy sampled: the prompt's, and inside an episode's
/// completion the environment's (tool results, user turns, the chat template's glue between
/// turns), with behaviour logprob 0. Such tokens are read by the model and never trained on:
/// the loss mask is 0 exactly where a token carries this version. No real version reaches it
/// (a run would need 2⁶⁴ − 1 optimizer steps).
pub const PROMPT_VERSION: PolicyVersion = PolicyVersion::MAX;

/// How to sample the next token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingParams {
    /// Softmax temperature; `0.0` means greedy (arg-max) decoding.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Seed of this request's random stream, so a run is reproducible.
    pub seed: u64,
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// Whether this asks for greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// `Ok` when the parameters mean something: a finite temperature ≥ 0 and `top_p` in
    /// (0, 1]; otherwise why not, naming the values (a NaN temperature gives NaN logprobs).
    pub fn check(&self) -> Result<(), String> {
        let temperature = self.temperature.is_finite() && self.temperature >= 0.0;
        let top_p = self.top_p > 0.0 && self.top_p <= 1.0;
        if temperature && top_p {
            Ok(())
        } else {
            Err(format!(
                "temperature {} and top_p {} must be finite and ≥ 0, and in (0, 1]",
                self.temperature, self.top_p
            ))
        }
    }
}

/// One call to a [`Generator`](crate::Generator).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// Identifies the sample across resubmissions (for logs and seeds).
    pub sample_id: u64,
    /// The prompt, followed by any output already generated before an interruption.
    pub input_ids: Vec<u32>,
    /// How many new tokens may be generated at most.
    pub max_new_tokens: usize,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Generation stops after emitting any of these (the stop token is part of the output).
    pub stop_token_ids: Vec<u32>,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was emitted.
    Stop,
    /// `max_new_tokens` was reached.
    Length,
    /// The generator was paused for a weight update; the caller resubmits the prompt plus this
    /// partial output once it resumes.
    Interrupted,
}

/// Output of a generator: one entry per generated token in each of the three vectors.
///
/// In a trajectory, the tokens after the prompt: for a single-turn sample what the generator
/// returned; for an episode its turns, the policy's sampled tokens and between them the
/// environment's tokens ([`push_environment`](Self::push_environment)), which carry
/// [`PROMPT_VERSION`] and are never trained on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Generated token ids.
    pub token_ids: Vec<u32>,
    /// Log-probability of each token under the policy that sampled it (the behaviour policy),
    /// at the sampling temperature.
    pub behaviour_logprobs: Vec<f32>,
    /// Version of the policy that sampled each token.
    pub versions: Vec<PolicyVersion>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
}

impl Completion {
    /// An empty completion that ended for `finish_reason`.
    pub fn empty(finish_reason: FinishReason) -> Self {
        Self {
            token_ids: Vec::new(),
            behaviour_logprobs: Vec::new(),
            versions: Vec::new(),
            finish_reason,
        }
    }

    /// Number of generated tokens.
    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    /// Whether no token was generated.
    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    /// Append one sampled token with its behaviour logprob and the version of the weights that
    /// sampled it, keeping the three per-token vectors in step.
    pub fn push(&mut self, token_id: u32, behaviour_logprob: f32, version: PolicyVersion) {
        self.token_ids.push(token_id);
        self.behaviour_logprobs.push(behaviour_logprob);
        self.versions.push(version);
    }

    /// Append tokens the environment wrote (a tool's result, a user's turn, the chat
    /// template's markers between turns): read by the model, sampled by no policy, never
    /// trained on. They carry [`PROMPT_VERSION`] and behaviour logprob 0.
    pub fn push_environment(&mut self, token_ids: &[u32]) {
        self.token_ids.extend_from_slice(token_ids);
        self.behaviour_logprobs
            .extend(std::iter::repeat_n(0.0, token_ids.len()));
        self.versions
            .extend(std::iter::repeat_n(PROMPT_VERSION, token_ids.len()));
    }

    /// Whether token `i` was sampled by a policy (it is trained on), rather than written by
    /// the environment.
    pub fn is_sampled(&self, i: usize) -> bool {
        self.versions.get(i).is_some_and(|&v| v != PROMPT_VERSION)
    }

    /// The versions of the tokens a policy sampled, in order (the environment's left out).
    pub fn sampled_versions(&self) -> impl Iterator<Item = PolicyVersion> + '_ {
        self.versions
            .iter()
            .copied()
            .filter(|&v| v != PROMPT_VERSION)
    }

    /// How many tokens a policy sampled: all of them for a generator's answer, the policy's
    /// turns of an episode.
    pub fn sampled_len(&self) -> usize {
        self.sampled_versions().count()
    }

    /// Keep only the first `len` tokens (with their logprobs and versions).
    pub fn truncate(&mut self, len: usize) {
        self.token_ids.truncate(len);
        self.behaviour_logprobs.truncate(len);
        self.versions.truncate(len);
    }

    /// Append a continuation generated after an interruption; the finish reason becomes the
    /// continuation's. Earlier tokens keep their logprobs and versions.
    pub fn extend(&mut self, continuation: Completion) {
        self.token_ids.extend(continuation.token_ids);
        self.behaviour_logprobs
            .extend(continuation.behaviour_logprobs);
        self.versions.extend(continuation.versions);
        self.finish_reason = continuation.finish_reason;
    }

    /// Check a generator's answer: the three per-token vectors have the same length, the
    /// logprobs are finite and not positive, and every token was sampled (none carries
    /// [`PROMPT_VERSION`]); describes the first problem found.
    pub fn check(&self) -> Result<(), String> {
        self.check_trajectory()?;
        if let Some(i) = self.versions.iter().position(|&v| v == PROMPT_VERSION) {
            return Err(format!(
                "token {i} has the prompt's policy version (PROMPT_VERSION), but it was generated"
            ));
        }
        Ok(())
    }

    /// Check a trajectory's completion, which may hold the environment's tokens between the
    /// policy's: the three per-token vectors have the same length, the logprobs are finite
    /// and not positive, and an environment token's logprob is 0; describes the first
    /// problem found.
    pub fn check_trajectory(&self) -> Result<(), String> {
        let n = self.token_ids.len();
        if self.behaviour_logprobs.len() != n || self.versions.len() != n {
            return Err(format!(
                "completion has {n} tokens but {} logprobs and {} versions",
                self.behaviour_logprobs.len(),
                self.versions.len()
            ));
        }
        if let Some((i, lp)) = self
            .behaviour_logprobs
            .iter()
            .enumerate()
            .find(|(_, lp)| !lp.is_finite() || **lp > 1e-4)
        {
            return Err(format!("token {i} has behaviour logprob {lp}"));
        }
        if let Some(i) = (0..n).find(|&i| !self.is_sampled(i) && self.behaviour_logprobs[i] != 0.0)
        {
            return Err(format!(
                "token {i} was written by the environment (PROMPT_VERSION) but has behaviour \
                 logprob {}, not 0",
                self.behaviour_logprobs[i]
            ));
        }
        Ok(())
    }
}

/// One rewarded sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// Id of the sample's episode, unique within a run (the samples an episode split into,
    /// [`EpisodeContext::split`](crate::EpisodeContext::split), share it, in order).
    pub sample_id: u64,
    /// The generated tokens with their behaviour logprobs and versions.
    pub completion: Completion,
    /// Its reward.
    pub reward: Reward,
}

impl Trajectory {
    /// Version of the policy that sampled the first token a policy sampled (`None` when there
    /// is none).
    pub fn head_version(&self) -> Option<PolicyVersion> {
        self.completion.sampled_versions().next()
    }
}

/// The samples generated for one prompt; the unit of admission, buffering and training.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryGroup {
    /// Submission order of the group: the replay buffer hands out the smallest first.
    pub group_id: u64,
    /// Id of the task item the prompt came from.
    pub item_id: String,
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// Policy version of the generators when the group was admitted.
    pub admitted_at: PolicyVersion,
    /// The samples that were rewarded (a sample whose verifier failed is left out).
    pub samples: Vec<Trajectory>,
}

impl TrajectoryGroup {
    /// Returns of the samples ([`Reward::total`](crate::Reward::total)), in order.
    pub fn rewards(&self) -> Vec<f64> {
        self.samples.iter().map(|s| s.reward.total()).collect()
    }

    /// Tokens a policy sampled, over all samples (an episode's environment tokens left out).
    pub fn completion_tokens(&self) -> usize {
        self.samples
            .iter()
            .map(|s| s.completion.sampled_len())
            .sum()
    }
}

/// One named parameter tensor, as plain data (row-major `f32`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NamedTensor {
    /// Parameter name, e.g. `layers.0.attention.wq.weight`.
    pub name: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub data: Vec<f32>,
}

impl NamedTensor {
    /// `Ok` when every value of `tensors` is finite; otherwise the first that is not, with its
    /// tensor and index. Weights from a peer or a folder are checked before they are loaded: a
    /// NaN gives NaN logprobs, which nothing can train on.
    pub fn check_finite(tensors: &[NamedTensor]) -> Result<(), String> {
        for t in tensors {
            if let Some(i) = t.data.iter().position(|v| !v.is_finite()) {
                return Err(format!(
                    "tensor `{}` holds {} at index {i}: weights must be finite",
                    t.name, t.data[i]
                ));
            }
        }
        Ok(())
    }
}

/// New policy weights for the generators.
///
/// With [`adapter`](Self::adapter) set, the policy trains low-rank adapters over frozen
/// weights: `tensors` are those frozen weights (the base), the same `Arc` for every version,
/// so that a generator holding them already (`Arc::ptr_eq`) takes only the adapter; the model
/// to generate with is the base with the adapter applied.
#[derive(Clone, Debug)]
pub struct WeightUpdate {
    /// Version these weights are.
    pub version: PolicyVersion,
    /// The parameters (the base, with an adapter); shared, so that several generators receive
    /// them without copies.
    pub tensors: Arc<Vec<NamedTensor>>,
    /// What the tensors are: the model's architecture as its `config.json` would say it
    /// (`Null` when the policy does not describe itself). A generator that builds its own copy
    /// of the model reads the shapes from here.
    pub architecture: Arc<serde_json::Value>,
    /// The adapter of this version over `tensors`, when the policy trains one.
    pub adapter: Option<Arc<Adapter>>,
}

/// Low-rank adapters (LoRA) in PEFT's format: its `adapter_config.json` and the tensors of
/// `adapter_model.safetensors` under its names
/// (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`, `[rank, in]`;
/// `lora_B`, `[out, rank]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Adapter {
    /// PEFT's `adapter_config.json` (`r`, `lora_alpha`, `target_modules`, ...).
    pub config: serde_json::Value,
    /// The adapter's tensors.
    pub tensors: Vec<NamedTensor>,
}

impl Adapter {
    /// Values in all its tensors.
    pub fn len(&self) -> usize {
        self.tensors.iter().map(|t| t.data.len()).sum()
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl WeightUpdate {
    /// Weights of `version` without an architecture description.
    pub fn new(version: PolicyVersion, tensors: Vec<NamedTensor>) -> Self {
        Self {
            version,
            tensors: Arc::new(tensors),
            architecture: Arc::new(serde_json::Value::Null),
            adapter: None,
        }
    }

    /// Weights of `version` that are the shared base `tensors` with `adapter` applied.
    pub fn adapted(
        version: PolicyVersion,
        tensors: Arc<Vec<NamedTensor>>,
        adapter: Adapter,
    ) -> Self {
        Self {
            version,
            tensors,
            architecture: Arc::new(serde_json::Value::Null),
            adapter: Some(Arc::new(adapter)),
        }
    }

    /// The same weights described by `architecture`.
    pub fn with_architecture(mut self, architecture: serde_json::Value) -> Self {
        self.architecture = Arc::new(architecture);
        self
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&NamedTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::{Reward, Verdict};

    /// An episode's completion: two policy tokens, the environment's three, one more policy
    /// token.
    fn episode() -> Completion {
        let mut c = Completion::empty(FinishReason::Stop);
        c.push(4, -0.5, 2);
        c.push(5, -0.25, 3);
        c.push_environment(&[7, 8, 9]);
        c.push(6, -1.0, 3);
        c
    }

    #[test]
    fn environment_tokens_are_kept_apart_from_the_policys() {
        let c = episode();
        assert_eq!(c.token_ids, vec![4, 5, 7, 8, 9, 6]);
        assert_eq!(c.len(), 6);
        assert_eq!(c.sampled_len(), 3);
        assert_eq!(c.sampled_versions().collect::<Vec<_>>(), vec![2, 3, 3]);
        assert_eq!(
            (0..6).map(|i| c.is_sampled(i)).collect::<Vec<_>>(),
            vec![true, true, false, false, false, true]
        );
        assert!(!c.is_sampled(6), "past the end");
        assert_eq!(&c.behaviour_logprobs[2..5], &[0.0, 0.0, 0.0]);
        assert_eq!(c.check_trajectory(), Ok(()));
        let refused = c.check().unwrap_err();
        assert!(
            refused.contains("token 2") && refused.contains("generated"),
            "{refused}"
        );
    }

    #[test]
    fn an_environment_token_with_a_logprob_is_refused() {
        let mut c = episode();
        c.behaviour_logprobs[3] = -0.1;
        let why = c.check_trajectory().unwrap_err();
        assert!(
            why.contains("token 3") && why.contains("environment"),
            "{why}"
        );
    }

    #[test]
    fn the_head_version_is_the_first_sampled_tokens() {
        let mut c = Completion::empty(FinishReason::Stop);
        c.push_environment(&[1]);
        c.push(2, -0.5, 5);
        let t = Trajectory {
            sample_id: 0,
            completion: c,
            reward: Reward::new(1.0, Verdict::Accepted),
        };
        assert_eq!(t.head_version(), Some(5));
        let group = TrajectoryGroup {
            group_id: 0,
            item_id: "x".into(),
            prompt_ids: vec![0],
            admitted_at: 5,
            samples: vec![t],
        };
        assert_eq!(group.completion_tokens(), 1);
    }
}
