//! The warm-up stage: supervised training on the task's demonstrations until held-out
//! accuracy and loss stop improving, then back to the weights with the best validation
//! accuracy; RL starts from them. The result is cached by everything that determines it, so a
//! later run with the same settings reuses it.

use std::sync::Arc;
use std::time::Instant;

use areal_sdk::{DemoTurn, PluginError, Split, Task, mix_seed};

use crate::context::RunContext;
use crate::error::EngineError;
use crate::group_runner::GroupRunner;
use crate::metrics::{WarmupMetrics, WarmupReport};
use crate::order::DataOrder;
use crate::resume::WarmupProgress;
use crate::trainer::sft::Example;

mod cache;

/// Reuse a cached warm-up, or train on demonstrations until validation accuracy stops
/// improving (and cache the result); go on from `resumed` (a checkpoint's progress and its
/// best weights) when given. The generator is left holding the warmed-up weights (version 0).
pub(crate) async fn warm_up(
    ctx: &mut RunContext,
    resumed: Option<(WarmupProgress, Option<tempfile::TempDir>)>,
) -> Result<WarmupReport, EngineError> {
    let report = match resumed {
        Some((progress, best)) => train(ctx, progress, best).await?,
        None => match reuse(ctx).await? {
            Some(report) => report,
            None => {
                let fresh = WarmupProgress {
                    can_snapshot: true,
                    ..WarmupProgress::default()
                };
                train(ctx, fresh, None).await?
            }
        },
    };
    ctx.load_generator(0, "the warmed-up weights").await?;
    Ok(report)
}

/// The cached warm-up for these settings, loaded into the policy, if there is a sound one.
async fn reuse(ctx: &mut RunContext) -> Result<Option<WarmupReport>, EngineError> {
    let Some(dir) = cache::path(
        &ctx.config,
        &ctx.task_fingerprint,
        ctx.reward_identity().as_deref(),
    ) else {
        return Ok(None);
    };
    let Some(mut report) = cache::read(&dir) else {
        return Ok(None);
    };
    match ctx.worker.load(dir.clone()).await? {
        Ok(()) => {
            report.cached = true;
            tracing::info!(target: "areal::warmup", dir = %dir.display(), seconds = report.seconds, "reusing a cached warm-up");
            for m in &report.curve {
                ctx.log.record("warmup", m)?;
                ctx.observer.on_warmup(m);
            }
            Ok(Some(report))
        }
        // Unloadable although its checksums hold (the policy is left as it was): warm up
        // again, and the new warm-up replaces it.
        Err(e) => {
            tracing::warn!(target: "areal::warmup", dir = %dir.display(), error = %crate::error::chain(&e), "the cached warm-up cannot be loaded; warming up again");
            Ok(None)
        }
    }
}

/// Warm up from `progress` (from scratch, or a checkpoint's with its best weights in `best`).
async fn train(
    ctx: &mut RunContext,
    mut p: WarmupProgress,
    best: Option<tempfile::TempDir>,
) -> Result<WarmupReport, EngineError> {
    let w = ctx.config.warmup.clone();
    let started = Instant::now();
    let runner = ctx.controller.runner().clone();
    let task = ctx.task.clone();
    // The warm-up draws from a part of an unbounded train split that RL does not start from;
    // a finite one (a dataset) it goes through like RL does, shuffled afresh each epoch.
    let train_len = task.len(Split::Train);
    let first = if train_len.is_none() { 1u64 << 40 } else { 0 };
    let mut order = DataOrder::new(train_len, mix_seed(ctx.config.seed, 7));
    let validation_items = task.len(Split::Validation).unwrap_or(0) as u64;
    let validation = Arc::new(examples(
        task.as_ref(),
        &runner,
        Split::Validation,
        0..validation_items,
    )?);
    // The weights with the best validation accuracy so far: the warm-up ends with them, so the
    // baseline is the best the demonstrations gave, not wherever the last step happened to be.
    let snapshots = match best {
        Some(dir) => dir,
        None => tempfile::tempdir().map_err(|e| EngineError::io("(temp dir)", e))?,
    };
    let best_dir = snapshots.path().to_owned();
    let mut window = Instant::now();
    let mut plateau = false;
    let mut interrupted = false;
    let seconds = |p: &WarmupProgress| p.seconds + started.elapsed().as_secs_f64();
    while p.steps < w.max_steps {
        if ctx.interrupt.is_requested() {
            interrupted = true;
            break;
        }
        let indices: Vec<u64> = (0..w.batch_size as u64)
            .map(|i| first + order.index(p.steps * w.batch_size as u64 + i))
            .collect();
        p.steps += 1;
        let batch = examples(task.as_ref(), &runner, Split::Train, indices.into_iter())?;
        let (loss, n) = ctx.worker.sft_step(batch).await?;
        p.loss_sum += loss * n as f64;
        p.tokens += n;
        if !p.steps.is_multiple_of(w.eval_every) && p.steps != w.max_steps {
            continue;
        }
        ctx.load_generator(0, "warm-up weights").await?;
        let eval = ctx.evaluate(Split::Validation, p.steps, 0).await?;
        let validation_loss = ctx.worker.validation_loss(validation.clone()).await?;
        let m = WarmupMetrics {
            step: p.steps,
            loss: p.loss_sum / p.tokens.max(1) as f64,
            validation_accuracy: eval.accuracy,
            validation_loss,
            seconds: seconds(&p),
            tokens_per_s: p.tokens as f64 / window.elapsed().as_secs_f64().max(1e-9),
        };
        tracing::info!(
            target: "areal::warmup",
            step = p.steps,
            loss = m.loss,
            validation_loss,
            validation_accuracy = m.validation_accuracy,
            "warm-up"
        );
        ctx.log.record("warmup", &m)?;
        ctx.log.warmup_point(ctx.wall_s(), m.validation_accuracy);
        ctx.observer.on_warmup(&m);
        p.curve.push(m);
        (p.loss_sum, p.tokens, window) = (0.0, 0, Instant::now());
        let best = p.best.unwrap_or(f64::NEG_INFINITY);
        let best_loss = p.best_loss.unwrap_or(f64::INFINITY);
        let accuracy_improved = eval.accuracy >= best + w.min_delta;
        let loss_improved = validation_loss <= best_loss * (1.0 - w.min_loss_improvement);
        if eval.accuracy > best && p.can_snapshot {
            match ctx.worker.save(best_dir.clone()).await? {
                Ok(()) => p.best_step = p.steps,
                Err(e) if e.is_unsupported() => p.can_snapshot = false,
                Err(e) => return Err(EngineError::plugin("saving the best warm-up weights", e)),
            }
        }
        p.best = Some(best.max(eval.accuracy));
        p.best_loss = Some(best_loss.min(validation_loss));
        if accuracy_improved || loss_improved {
            p.since_best = 0;
        } else {
            p.since_best += 1;
            if p.since_best >= w.patience {
                plateau = true;
                break;
            }
        }
        checkpoint(ctx, &p, started, &best_dir).await?;
    }
    if interrupted {
        checkpoint(ctx, &p, started, &best_dir).await?;
    }
    let last_step = p.curve.last().map_or(0, |m| m.step);
    let mut best_step = p.best_step;
    if p.can_snapshot && best_step > 0 && best_step != last_step {
        ctx.worker
            .load(best_dir)
            .await?
            .map_err(|e| EngineError::plugin("restoring the best warm-up weights", e))?;
    } else {
        best_step = last_step;
    }
    let report = WarmupReport {
        steps: p.steps,
        seconds: seconds(&p),
        best_step,
        validation_accuracy: p.curve.last().map_or(0.0, |m| m.validation_accuracy),
        best_validation_accuracy: p.best.unwrap_or(0.0).max(0.0),
        plateau,
        curve: p.curve,
        cached: false,
    };
    // A cache is only a saving: failing to write one costs the next run time, not this run.
    if let Some(dir) = cache::path(
        &ctx.config,
        &ctx.task_fingerprint,
        ctx.reward_identity().as_deref(),
    ) && !interrupted
        && let Err(e) = cache::write(&dir, &ctx.worker, &report).await
    {
        tracing::warn!(target: "areal::warmup", dir = %dir.display(), error = %crate::error::chain(&e), "cannot cache the warm-up; the next run with these settings warms up again");
    }
    Ok(report)
}

/// A resume checkpoint of the warm-up at `p` (its best weights from `best_dir`, if saved).
async fn checkpoint(
    ctx: &mut RunContext,
    p: &WarmupProgress,
    started: Instant,
    best_dir: &std::path::Path,
) -> Result<(), EngineError> {
    let progress = WarmupProgress {
        seconds: p.seconds + started.elapsed().as_secs_f64(),
        ..p.clone()
    };
    let best = (p.best_step > 0).then_some(best_dir);
    crate::resume::save(ctx, crate::resume::Stage::Warmup(progress), best).await
}

/// The examples of one step: each demonstration's turns after its prompt, the policy's ended
/// with the stop token and trained on, the environment's text between them read only.
pub(crate) fn examples(
    task: &dyn Task,
    runner: &GroupRunner,
    split: Split,
    indices: impl Iterator<Item = u64>,
) -> Result<Vec<Example>, EngineError> {
    let tokenizer = runner.tokenizer();
    let stop = tokenizer.stop_token_ids().first().copied();
    let plugin = |e: PluginError| EngineError::plugin("preparing warm-up demonstrations", e);
    indices
        .map(|i| {
            let item = task.item(split, i).map_err(plugin)?;
            let turns = task
                .demonstration_turns(&item)
                .map_err(plugin)?
                .ok_or_else(|| {
                    EngineError::setup(format!(
                        "task {} has no demonstrations to warm up on",
                        task.name()
                    ))
                })?;
            let prompt = runner.task_prompt_ids(&item).map_err(plugin)?;
            let (mut response, mut trained) = (Vec::new(), Vec::new());
            for turn in turns {
                let (ids, policy) = match turn {
                    DemoTurn::Policy(text) => {
                        let mut ids = tokenizer.encode(&text).map_err(plugin)?;
                        ids.extend(stop);
                        (ids, true)
                    }
                    DemoTurn::Environment(text) => {
                        (tokenizer.encode(&text).map_err(plugin)?, false)
                    }
                };
                trained.extend(std::iter::repeat_n(policy, ids.len()));
                response.extend(ids);
            }
            Ok(Example {
                prompt,
                response,
                trained,
            })
        })
        .collect()
}
