//! Held-out evaluation: greedy pass@1 and sampled pass@k over a task split.

use std::path::Path;
use std::sync::Arc;

use areal_sdk::{SamplingParams, Split, Task, TaskItem, Verdict, WeightUpdate};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::config::Config;
use crate::episode::{EpisodeRun, Rounds, Sampler};
use crate::error::EngineError;
use crate::group_runner::{Evaluating, GroupRunner, SampleProgress};
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
    /// Hand every request to the generator in one batch ([`areal_sdk::Generator::
    /// generate_batch`]), so that it batches them the same way every time (deterministic
    /// mode), instead of `concurrency` at a time as they finish.
    pub batched: bool,
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
            batched: config.deterministic,
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
    check_rounds(runner.episode().as_ref(), spec.batched)?;
    let graded = grade_episodes(task, runner, spec, items, samples).await?;
    summarise(task, spec, graded)
}

/// Refuse to run `episode` in rounds (deterministic mode) when it drives an outside program:
/// a round waits for every episode to ask for a turn or end, which an agent waiting for a
/// program (or for one to take its session) may never do, and a program's turns do not come
/// the same way each time.
pub(crate) fn check_rounds(
    episode: &dyn areal_sdk::Episode,
    in_rounds: bool,
) -> Result<(), EngineError> {
    if in_rounds && episode.traits().not_replayable {
        return Err(EngineError::setup(format!(
            "deterministic = true: the {} episode drives an outside program, whose turns do not \
             come the same way each time; deterministic mode needs episodes that do (set \
             deterministic = false)",
            episode.name()
        )));
    }
    Ok(())
}

/// Item `index` of `split`, or an error naming it.
fn read_item(task: &Arc<dyn Task>, split: Split, index: usize) -> Result<TaskItem, EngineError> {
    task.item(split, index as u64)
        .map_err(|e| EngineError::plugin(format!("reading {} item {index}", split.as_str()), e))
}

/// The id of completion `j` of eval item `index` (apart from the ids of training samples).
fn eval_sample_id(index: usize, j: usize, samples: usize) -> u64 {
    u64::MAX / 2 + (index * samples + j) as u64
}

/// Every completion of `items` items, `samples` each, graded: an episode each, at most
/// `spec.concurrency` at a time as they finish, or (`spec.batched`) all together in rounds,
/// each round's turns handed to the generator in one batch, in item order.
async fn grade_episodes(
    task: &Arc<dyn Task>,
    runner: &Arc<GroupRunner>,
    spec: &EvalSpec,
    items: usize,
    samples: usize,
) -> Result<Vec<Vec<Graded>>, EngineError> {
    let rounds = Arc::new(Rounds::default());
    let sampler = if spec.batched {
        Sampler::Rounds {
            rounds: rounds.clone(),
            chunk: spec.max_new_tokens,
        }
    } else {
        Sampler::Live
    };
    let permits = Arc::new(Semaphore::new(if spec.batched {
        Semaphore::MAX_PERMITS
    } else {
        spec.concurrency.max(1)
    }));
    let mut jobs = JoinSet::new();
    for index in 0..items {
        let item = read_item(task, spec.split, index)?;
        let prompt = runner
            .prompt_ids(&item)
            .map_err(|e| EngineError::plugin("evaluating", e))?;
        let (item, prompt) = (Arc::new(item), Arc::new(prompt));
        for j in 0..samples {
            let (runner, permits, item, prompt) = (
                runner.clone(),
                permits.clone(),
                item.clone(),
                prompt.clone(),
            );
            let (sampling, max_new_tokens) = (spec.sampling.clone(), spec.max_new_tokens);
            let sampler = sampler.clone();
            let sample_id = eval_sample_id(index, j, samples);
            let busy = spec.batched.then(|| rounds.enter(sample_id));
            jobs.spawn(async move {
                let _busy = busy;
                let _permit = permits.acquire().await.expect("semaphore is never closed");
                let samples = EpisodeRun::run(
                    &runner,
                    &sampler,
                    &item,
                    &prompt,
                    sample_id,
                    max_new_tokens,
                    &sampling,
                    SampleProgress::default(),
                    &Evaluating,
                    j,
                )
                .await?;
                // (the episode's last sample, where it split: the one its reward is for)
                let last = samples.into_iter().last().expect("an episode has a sample");
                let text = runner.tokenizer().decode(&last.completion.token_ids)?;
                Ok::<_, areal_sdk::PluginError>((index, j, text, last.reward))
            });
        }
    }
    if spec.batched {
        loop {
            rounds.settled().await;
            if rounds.run_round(runner).await == 0 {
                break;
            }
        }
    }
    let mut graded = vec![vec![None; samples]; items];
    while let Some(joined) = jobs.join_next().await {
        let (index, j, text, reward) = joined
            .map_err(|e| EngineError::internal(format!("evaluation task failed: {e}")))?
            .map_err(|e| EngineError::plugin("evaluating", e))?;
        graded[index][j] = Some(Graded {
            completion: text,
            reward: reward.total(),
            verdict: reward.verdict,
        });
    }
    Ok(graded
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|g| g.expect("every completion was graded"))
                .collect()
        })
        .collect())
}

/// The outcome of graded completions, `graded[item][j]`.
fn summarise(
    task: &Arc<dyn Task>,
    spec: &EvalSpec,
    graded: Vec<Vec<Graded>>,
) -> Result<EvalOutcome, EngineError> {
    let (items, samples) = (graded.len(), spec.samples.max(1));
    let (mut accuracy, mut solved, mut reward_sum, mut failures) = (0.0, 0usize, 0.0, 0usize);
    let mut results = Vec::with_capacity(items);
    for (index, row) in graded.into_iter().enumerate() {
        let item = task
            .item(spec.split, index as u64)
            .map_err(|e| EngineError::plugin("reading an eval item", e))?;
        let outcome = ItemOutcome {
            item_id: item.id,
            prompt: item.prompt,
            completions: row,
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
    pub fn new(config: &Config, plugins: Plugins) -> Result<Self, EngineError> {
        let rewards = RewardService::from_config(plugins.verifier, &config.reward_service);
        let runner = Arc::new(
            GroupRunner::new(plugins.generator, plugins.policy.tokenizer(), rewards)
                .with_data_source(plugins.task.name())
                .with_episode(plugins.episode, plugins.tools)
                .with_prompt(config.prompt.clone())
                .map_err(|e| EngineError::plugin("preparing prompts", e))?,
        );
        Ok(Self {
            task: plugins.task,
            runner,
        })
    }

    /// Load `weights` into the generator and evaluate them.
    pub async fn evaluate(
        &self,
        weights: WeightUpdate,
        spec: &EvalSpec,
    ) -> Result<EvalOutcome, EngineError> {
        let version = weights.version;
        let generator = self.runner.generator();
        generator
            .check_tokenizer(self.runner.tokenizer().as_ref())
            .await
            .map_err(|e| EngineError::plugin("checking the generator's tokenizer", e))?;
        generator.update_weights(weights).await.map_err(|e| {
            EngineError::plugin(
                format!("loading weights of version {version} into the generator"),
                e,
            )
        })?;
        evaluate(&self.task, &self.runner, spec).await
    }
}

/// Evaluate the checkpoint in `dir` with the plugins of `config`. `dir` may also be anything
/// else the policy loads over the weights it holds (a PEFT adapter folder, for the
/// transformer); [`evaluate_adapted`] loads one over a checkpoint.
pub async fn evaluate_checkpoint(
    config: &Config,
    plugins: Plugins,
    dir: &Path,
    spec: &EvalSpec,
) -> Result<EvalOutcome, EngineError> {
    evaluate_adapted(config, plugins, dir, None, spec).await
}

/// Evaluate the checkpoint in `dir` with the adapter folder `adapter` loaded over it (in the
/// policy's format: PEFT's for the transformer), if given.
pub async fn evaluate_adapted(
    config: &Config,
    mut plugins: Plugins,
    dir: &Path,
    adapter: Option<&Path>,
    spec: &EvalSpec,
) -> Result<EvalOutcome, EngineError> {
    for (what, dir) in std::iter::once(("checkpoint", dir)).chain(adapter.map(|a| ("adapter", a))) {
        plugins
            .policy
            .load(dir)
            .map_err(|e| EngineError::plugin(format!("loading {what} {}", dir.display()), e))?;
    }
    let weights = weight_update(plugins.policy.as_ref(), 0);
    Evaluator::new(config, plugins)?
        .evaluate(weights, spec)
        .await
}
