//! A whole run, its stages in order: warm-up, baseline evaluation, RL (with its evaluations),
//! final checkpoint, final evaluation, summary.
//!
//! The run itself is async work on the caller's runtime; the policy lives on the compute
//! worker's thread, generation and rewards behind the controller.

use std::sync::Arc;
use std::time::Duration;

use areal_sdk::{Split, Task};

use crate::checkpoint;
use crate::config::Config;
use crate::context::RunContext;
use crate::controller::Controller;
use crate::error::EngineError;
use crate::group_runner::GroupRunner;
use crate::observer::RunOptions;
use crate::plugins::Plugins;
use crate::reward_service::RewardService;
use crate::rl;
use crate::runlog::RunLog;
use crate::summary::{RunSummary, summarise};
use crate::warmup;
use crate::worker::ComputeWorker;

/// Run `plugins` as `config` says until `train.steps` steps are trained.
pub async fn run(
    config: Config,
    plugins: Plugins,
    options: RunOptions,
) -> Result<RunSummary, EngineError> {
    let Plugins {
        policy,
        generator,
        task,
        verifier,
        algorithm,
    } = plugins;
    check_task(task.as_ref(), &config)?;
    let log = RunLog::new(options.out_dir.as_deref(), &config)?;
    let rewards = RewardService::new(
        verifier,
        config.reward_service.threads,
        Duration::from_millis(config.reward_service.deadline_ms),
    );
    let runner = Arc::new(GroupRunner::new(generator, policy.tokenizer(), rewards));
    let controller = Controller::new(
        &config,
        runner,
        task.clone(),
        algorithm.clone(),
        options.observer.clone(),
    );
    let algorithm_name = algorithm.name().to_owned();
    let worker = ComputeWorker::start(&config, policy, algorithm)?;
    let mut ctx = RunContext {
        config,
        task,
        algorithm: algorithm_name,
        controller,
        worker,
        observer: options.observer,
        log,
        started: options.started,
        interrupt: options.stop,
        evals: Vec::new(),
    };
    ctx.load_generator(0, "the initial weights").await?;
    ctx.observer.on_start(ctx.config.train.steps);
    let result = stages(&mut ctx).await;
    ctx.controller.shutdown().await;
    let (summary, checkpoint_error) = result?;
    if let Some(dir) = ctx.log.dir() {
        let path = dir.join("summary.json");
        let json = serde_json::to_string_pretty(&summary).expect("the summary serialises");
        crate::atomic::write(&path, (json + "\n").as_bytes())
            .map_err(|e| EngineError::io(path, e))?;
    }
    match checkpoint_error {
        Some(e) => Err(e),
        None => Ok(summary),
    }
}

/// The stages in order; the summary, and the checkpoint's failure if saving it failed (the
/// summary is still written).
async fn stages(ctx: &mut RunContext) -> Result<(RunSummary, Option<EngineError>), EngineError> {
    let warmup = if ctx.config.warmup.enabled {
        Some(warmup::warm_up(ctx).await?)
    } else {
        None
    };
    // Asked to stop during the warm-up: no evaluation, no RL; what there is gets saved.
    let stop_before_rl = ctx.interrupt.is_requested();
    if ctx.config.eval.enabled && !stop_before_rl {
        ctx.eval(0, 0).await?;
    }
    let rl = rl::train(ctx, !stop_before_rl).await?;
    let interrupted = ctx.interrupt.is_requested();
    if interrupted {
        tracing::warn!(target: "areal::train", steps = rl.steps.len(), "stopped on request; saving the checkpoint and summary");
    }
    // The checkpoint first: the trained model is what a failure later must not cost.
    let (checkpoint, checkpoint_error) = match ctx.log.dir().map(ToOwned::to_owned) {
        Some(dir) => match checkpoint::save(ctx, &dir).await {
            Ok(saved) => (saved, None),
            Err(e) => (None, Some(e)),
        },
        None => (None, None),
    };
    if ctx.config.eval.enabled && !interrupted {
        ctx.eval(rl.steps.len() as u64, rl.version).await?;
    }
    let mut summary = summarise(ctx, &rl, warmup);
    summary.interrupted = interrupted;
    summary.checkpoint = checkpoint;
    Ok((summary, checkpoint_error))
}

/// A task the run can use: a train split with items, an eval split when evaluating.
fn check_task(task: &dyn Task, config: &Config) -> Result<(), EngineError> {
    if task.len(Split::Train) == Some(0) {
        return Err(EngineError::setup(format!(
            "task {} has an empty train split",
            task.name()
        )));
    }
    if config.eval.enabled && matches!(task.len(Split::Eval), None | Some(0)) {
        return Err(EngineError::setup(format!(
            "task {} has no finite eval split; set eval.enabled = false to train without evaluation",
            task.name()
        )));
    }
    Ok(())
}
