//! Held-out evaluation: greedy pass@1 and sampled pass@k over a task split.

use std::path::Path;
use std::sync::Arc;

use areal_sdk::{SamplingParams, Split, Task, Verdict, WeightUpdate};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::config::Config;
use crate::error::EngineError;
use crate::group_runner::GroupRunner;
use crate::plugins::Plugins;
use crate::reward_service::RewardService;
use crate::worker::weight_update;

/// What to evaluate.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalSpec {
    /// The split.
    pub split: Split,
    /// At most this many items; 0 means all.
    pub max_items: usize,
    /// Completions per item (k of pass@k).
    pub samples: usize,
    /// How to sample them (greedy for pass@1).
    pub sampling: SamplingParams,
    /// Token budget per completion.
    pub max_new_tokens: usize,
    /// Completions generated at once.
    pub concurrency: usize,
}

impl EvalSpec {
    /// Greedy pass@1 over at most `max_items` items (0: all) of `split`, with the token
    /// budget and concurrency of `config`'s `[rollout]` section.
    pub fn greedy(config: &Config, split: Split, max_items: usize) -> Self {
        let r = &config.rollout;
        Self {
            split,
            max_items,
            samples: 1,
            sampling: SamplingParams::greedy(),
            max_new_tokens: r.max_new_tokens,
            concurrency: r.max_concurrent * r.group_size,
        }
    }
}

/// One completion of one item.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Graded {
    /// The decoded completion.
    pub completion: String,
    /// Its reward.
    pub reward: f64,
    /// Its verdict.
    pub verdict: Verdict,
}

/// Results of one item.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ItemOutcome {
    /// Item id.
    pub item_id: String,
    /// Prompt.
    pub prompt: String,
    /// Its completions.
    pub completions: Vec<Graded>,
}

/// Results of an evaluation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvalOutcome {
    /// Items evaluated.
    pub items: usize,
    /// Completions per item.
    pub samples: usize,
    /// Mean over items of the fraction of `accepted` completions (pass@1; greedy when the
    /// sampling is greedy).
    pub accuracy: f64,
    /// Fraction of items with at least one `accepted` completion (pass@k, k = `samples`).
    pub pass_at_k: f64,
    /// Mean reward over all completions.
    pub reward_mean: f64,
    /// Completions whose verifier failed (they count as wrong).
    pub failures: usize,
    /// Every item, in split order.
    #[serde(skip)]
    pub results: Vec<ItemOutcome>,
}

/// Generate and grade `spec.samples` completions for each item of `spec.split`.
pub async fn evaluate(
    task: &Arc<dyn Task>,
    runner: &Arc<GroupRunner>,
    spec: &EvalSpec,
) -> Result<EvalOutcome, EngineError> {
    let total = task.len(spec.split).ok_or_else(|| {
        EngineError::setup(format!(
            "task {} has no finite {} split",
            task.name(),
            spec.split.as_str()
        ))
    })?;
    let items = match spec.max_items {
        0 => total,
        max => total.min(max),
    };
    let samples = spec.samples.max(1);
    let permits = Arc::new(Semaphore::new(spec.concurrency.max(1)));
    let mut jobs = JoinSet::new();
    for index in 0..items {
        let item = task.item(spec.split, index as u64).map_err(|e| {
            EngineError::plugin(format!("reading {} item {index}", spec.split.as_str()), e)
        })?;
        let item = Arc::new(item);
        for j in 0..samples {
            let (runner, permits, item) = (runner.clone(), permits.clone(), item.clone());
            let (sampling, max_new_tokens) = (spec.sampling.clone(), spec.max_new_tokens);
            jobs.spawn(async move {
                let _permit = permits.acquire().await.expect("semaphore is never closed");
                let sample_id = u64::MAX / 2 + (index * samples + j) as u64;
                let prompt = runner.tokenizer().encode(&item.prompt)?;
                let completion = runner
                    .generate(sample_id, &prompt, max_new_tokens, &sampling)
                    .await?;
                let verified = runner.reward(sample_id, &item, &completion).await?;
                let text = runner.tokenizer().decode(&completion.token_ids)?;
                Ok::<_, areal_sdk::PluginError>((index, j, text, verified.reward))
            });
        }
    }
    let mut graded = vec![vec![None; samples]; items];
    while let Some(joined) = jobs.join_next().await {
        let (index, j, text, reward) = joined
            .map_err(|e| EngineError::internal(format!("evaluation task failed: {e}")))?
            .map_err(|e| EngineError::plugin("evaluating", e))?;
        graded[index][j] = Some(Graded {
            completion: text,
            reward: reward.value,
            verdict: reward.verdict,
        });
    }
    let (mut accuracy, mut solved, mut reward_sum, mut failures) = (0.0, 0usize, 0.0, 0usize);
    let mut results = Vec::with_capacity(items);
    for (index, row) in graded.into_iter().enumerate() {
        let item = task
            .item(spec.split, index as u64)
            .map_err(|e| EngineError::plugin("reading an eval item", e))?;
        let outcome = ItemOutcome {
            item_id: item.id,
            prompt: item.prompt,
            completions: row
                .into_iter()
                .map(|g| g.expect("every completion was graded"))
                .collect(),
        };
        let accepted = outcome
            .completions
            .iter()
            .filter(|g| g.verdict == Verdict::Accepted)
            .count();
        failures += outcome
            .completions
            .iter()
            .filter(|g| g.verdict.is_failure())
            .count();
        reward_sum += outcome.completions.iter().map(|g| g.reward).sum::<f64>();
        accuracy += accepted as f64 / samples as f64;
        solved += usize::from(accepted > 0);
        results.push(outcome);
    }
    let n = items.max(1) as f64;
    Ok(EvalOutcome {
        items,
        samples,
        accuracy: accuracy / n,
        pass_at_k: solved as f64 / n,
        reward_mean: reward_sum / (n * samples as f64),
        failures,
        results,
    })
}

/// Evaluates weights with the plugins of a config: its generator loads each set of weights
/// in turn and the task's split is generated and graded.
pub struct Evaluator {
    task: Arc<dyn Task>,
    runner: Arc<GroupRunner>,
}

impl Evaluator {
    /// An evaluator on `plugins` (their policy gives the tokenizer; its weights are not used).
    pub fn new(config: &Config, plugins: Plugins) -> Self {
        let rewards = RewardService::new(
            plugins.verifier,
            config.reward_service.threads,
            std::time::Duration::from_millis(config.reward_service.deadline_ms),
        );
        let runner = Arc::new(GroupRunner::new(
            plugins.generator,
            plugins.policy.tokenizer(),
            rewards,
        ));
        Self {
            task: plugins.task,
            runner,
        }
    }

    /// Load `weights` into the generator and evaluate them.
    pub async fn evaluate(
        &self,
        weights: WeightUpdate,
        spec: &EvalSpec,
    ) -> Result<EvalOutcome, EngineError> {
        let version = weights.version;
        self.runner
            .generator()
            .update_weights(weights)
            .await
            .map_err(|e| {
                EngineError::plugin(
                    format!("loading weights of version {version} into the generator"),
                    e,
                )
            })?;
        evaluate(&self.task, &self.runner, spec).await
    }
}

/// Evaluate the checkpoint in `dir` with the plugins of `config`.
pub async fn evaluate_checkpoint(
    config: &Config,
    mut plugins: Plugins,
    dir: &Path,
    spec: &EvalSpec,
) -> Result<EvalOutcome, EngineError> {
    plugins
        .policy
        .load(dir)
        .map_err(|e| EngineError::plugin(format!("loading checkpoint {}", dir.display()), e))?;
    let weights = weight_update(plugins.policy.as_ref(), 0);
    Evaluator::new(config, plugins)
        .evaluate(weights, spec)
        .await
}
