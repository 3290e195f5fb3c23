//! A whole run, its stages in order: warm-up, baseline evaluation, RL (with its evaluations),
//! final checkpoint, final evaluation, summary; or the same run resumed from a checkpoint,
//! going on from the stage it was in.
//!
//! The run itself is async work on the caller's runtime; the policy lives on the compute
//! worker's thread, generation and rewards behind the controller.

use std::path::Path;
use std::sync::Arc;

use areal_sdk::{Split, Task};
use serde::Serialize;

use crate::checkpoint;
use crate::config::Config;
use crate::context::RunContext;
use crate::controller::Controller;
use crate::error::EngineError;
use crate::group_runner::GroupRunner;
use crate::observer::RunOptions;
use crate::plugins::Plugins;
use crate::resume::{self, Found, Stage};
use crate::reward_service::RewardService;
use crate::rl;
use crate::rollout::RolloutState;
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
        episode,
        tools,
    } = plugins;
    check_task(task.as_ref(), &config)?;
    crate::eval::check_rounds(episode.as_ref(), config.deterministic)?;
    let task_fingerprint = crate::fingerprint::task_fingerprint(task.as_ref(), &config);
    let out_dir = options.out_dir.as_deref();
    let (found, log, resumes) = match (out_dir, options.resume) {
        (Some(dir), true) => open_resumed(dir, &config, &task_fingerprint, options.allow_changes)?,
        (None, true) => {
            return Err(EngineError::resume(
                "resuming a run needs its run folder (RunOptions::out_dir)",
            ));
        }
        (dir, false) => (None, RunLog::new(dir, &config, options.overwrite)?, 0),
    };
    let (verifier, _workers) = start_reward_workers(&config, verifier, out_dir).await?;
    let rewards = RewardService::from_config(verifier, &config.reward_service);
    let runner = Arc::new(
        GroupRunner::new(generator, policy.tokenizer(), rewards)
            .with_data_source(task.name())
            .with_episode(episode, tools)
            .with_prompt(config.prompt.clone())
            .map_err(|e| EngineError::plugin("preparing prompts", e))?,
    );
    let rollout = match found.as_ref().map(|f| &f.state.stage) {
        Some(Stage::Rl(rl)) => RolloutState::restore(&config, task.as_ref(), rl.rollout.clone()),
        _ => RolloutState::new(&config, task.as_ref()),
    };
    let controller = Controller::new(
        &config,
        runner,
        task.clone(),
        algorithm.clone(),
        options.observer.clone(),
        rollout,
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
        elapsed_before: 0.0,
        interrupt: options.stop,
        evals: Vec::new(),
        task_fingerprint,
        resumes,
        checkpoints: Default::default(),
    };
    if let Some(found) = &found {
        ctx.elapsed_before = found.state.elapsed_s;
        ctx.evals = found.state.evals.clone();
        ctx.checkpoints = found.state.checkpoints.clone();
    }
    ctx.controller
        .runner()
        .generator()
        .check_tokenizer(ctx.controller.runner().tokenizer().as_ref())
        .await
        .map_err(|e| EngineError::plugin("checking the generator's tokenizer", e))?;
    if found.is_none() {
        // (a resumed run loads the checkpoint's weights when it has restored them)
        ctx.load_generator(0, "the initial weights").await?;
    }
    ctx.observer.on_start(ctx.config.train.steps);
    let result = stages(&mut ctx, found).await;
    ctx.controller.shutdown().await;
    let (summary, checkpoint_error) = result?;
    if let Some(dir) = ctx.log.dir() {
        let path = dir.join(crate::runlog::SUMMARY_FILE);
        let json = serde_json::to_string_pretty(&summary).expect("the summary serialises");
        crate::atomic::write(&path, (json + "\n").as_bytes())
            .map_err(|e| EngineError::io(path, e))?;
    }
    match checkpoint_error {
        Some(e) => Err(e),
        None => Ok(summary),
    }
}

/// A `"resume"` line of `metrics.jsonl`: where a resumed run went on from.
#[derive(Serialize)]
struct ResumeRecord {
    /// The RL steps the checkpoint had done (0 in the warm-up).
    step: u64,
    /// Warm-up steps the checkpoint had done (its warm-up).
    warmup_step: u64,
    /// The checkpoint's folder name.
    checkpoint: String,
    /// Steps recorded after the checkpoint by the process that died, cut off (they are
    /// trained again).
    discarded_steps: u64,
    /// Newer checkpoints passed over as damaged, with why.
    skipped: Vec<String>,
    /// Resumes so far, this one included.
    resumes: u64,
}

/// The run folder `dir` opened to go on: its newest sound checkpoint (none: the run starts
/// again from the beginning), its log cut back to that checkpoint, and the resume count.
fn open_resumed(
    dir: &Path,
    config: &Config,
    task_fingerprint: &str,
    allow_changes: bool,
) -> Result<(Option<Found>, RunLog, u64), EngineError> {
    if !dir.join(crate::runlog::CONFIG_FILE).exists() {
        return Err(EngineError::resume(format!(
            "{} is not a run folder (it has no config.toml)",
            dir.display()
        )));
    }
    let before = resume::resumes(dir);
    let Some(found) = resume::latest(dir)? else {
        if finished(dir) {
            // (a run with `checkpoint.every = 0` has none): its records must not be wiped
            // by training it again from scratch
            return Err(EngineError::resume(format!(
                "the run in {} is complete and has no checkpoint to go on from (checkpoint.every = 0?); start a new run to train again",
                dir.display()
            )));
        }
        tracing::warn!(target: "areal::train", dir = %dir.display(), "the run has no checkpoint yet; starting it again from the beginning");
        // (asked to resume this run: its records so far are replaced)
        let log = RunLog::new(Some(dir), config, true)?;
        let resumes = resume::count_resume(dir, before)?;
        return Ok((None, log, resumes));
    };
    let name = found
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if found.state.task != task_fingerprint && !allow_changes {
        return Err(EngineError::resume(format!(
            "the task's data changed since checkpoint {name} (sha256 {} then, {} now); resume with --allow-config-change to train on the new data",
            &found.state.task[..12.min(found.state.task.len())],
            &task_fingerprint[..12.min(task_fingerprint.len())]
        )));
    }
    check_config(&found, &name, config, allow_changes)?;
    let (step, warmup_step) = match &found.state.stage {
        Stage::Rl(rl) => (rl.step, 0),
        Stage::Warmup(w) => (0, w.steps),
    };
    if step >= config.train.steps && finished(dir) {
        return Err(EngineError::resume(format!(
            "the run in {} is complete ({step} of {} steps); to train it further, resume with --set train.steps=N --allow-config-change",
            dir.display(),
            config.train.steps
        )));
    }
    let (mut log, discarded_steps) = RunLog::resume(dir, config, &found.state.log)?;
    let resumes = resume::count_resume(dir, before)?;
    let record = ResumeRecord {
        step,
        warmup_step,
        checkpoint: name.clone(),
        discarded_steps,
        skipped: found
            .skipped
            .iter()
            .map(|(name, why)| format!("{name}: {why}"))
            .collect(),
        resumes,
    };
    tracing::info!(target: "areal::train", checkpoint = %found.dir.display(), step, warmup_step, discarded_steps, "resuming");
    log.record("resume", &record)?;
    Ok((Some(found), log, resumes))
}

/// Refuse to resume from checkpoint `name` with a config other than the one it was trained
/// with (what it recorded, not the run folder's `config.toml`, which anyone can replace),
/// unless `allow_changes` ([`resume_changes`](crate::config::resume_changes)).
fn check_config(
    found: &Found,
    name: &str,
    config: &Config,
    allow_changes: bool,
) -> Result<(), EngineError> {
    let Some(recorded) = &found.state.config else {
        return Ok(());
    };
    let recorded: Config = match serde_json::from_value(recorded.clone()) {
        Ok(c) => c,
        Err(_) if allow_changes => return Ok(()),
        Err(e) => {
            return Err(EngineError::resume(format!(
                "checkpoint {name} records a config this areal cannot read ({e}); resume with --allow-config-change to go on with the one given"
            )));
        }
    };
    match crate::config::resume_changes(&recorded, config, allow_changes) {
        Ok(_) => Ok(()),
        Err(crate::config::ResumeRefusal::Fixed(list)) => Err(EngineError::resume(format!(
            "checkpoint {name} was trained with another config, and these keys never change on resume:\n{list}"
        ))),
        Err(crate::config::ResumeRefusal::NotAllowed(list)) => Err(EngineError::resume(format!(
            "checkpoint {name} was trained with another config than the one given (its own is recorded in it; the run folder's config.toml does not decide):\n{list}\nresume with the run's config, or add --allow-config-change to change it on purpose"
        ))),
    }
}

/// Whether the run in `dir` ended (its summary says it was not stopped before its end).
fn finished(dir: &Path) -> bool {
    std::fs::read(dir.join(crate::runlog::SUMMARY_FILE))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .is_some_and(|s| s.get("interrupted") == Some(&serde_json::Value::Bool(false)))
}

/// The stages in order, from where `found` (a checkpoint) left the run; the summary, and the
/// checkpoint's failure if saving it failed (the summary is still written).
async fn stages(
    ctx: &mut RunContext,
    found: Option<Found>,
) -> Result<(RunSummary, Option<EngineError>), EngineError> {
    let (warmup, from) = match found {
        None => {
            let warmup = if ctx.config.warmup.enabled {
                Some(warmup::warm_up(ctx, None).await?)
            } else {
                None
            };
            (warmup, None)
        }
        Some(Found { dir, state, .. }) => match state.stage {
            Stage::Warmup(progress) => {
                ctx.worker
                    .load_state(resume::trainer_dir(&dir), state.trainer)
                    .await?;
                let best = resume::warmup_best(&dir)?;
                (
                    Some(warmup::warm_up(ctx, Some((progress, best))).await?),
                    None,
                )
            }
            Stage::Rl(rl) => {
                ctx.worker.start_rl().await?;
                ctx.worker
                    .load_state(resume::trainer_dir(&dir), state.trainer)
                    .await?;
                ctx.load_generator(rl.version, "the checkpoint's weights")
                    .await?;
                (rl.warmup.clone(), Some(*rl))
            }
        },
    };
    // Asked to stop during the warm-up: no evaluation, no RL; what there is gets saved.
    let stop_before_rl = ctx.interrupt.is_requested();
    if from.is_none() && ctx.config.eval.enabled && !stop_before_rl {
        ctx.eval(0, 0).await?;
    }
    let rl = rl::train(ctx, !stop_before_rl, from, warmup.as_ref()).await?;
    let interrupted = ctx.interrupt.is_requested();
    if interrupted {
        tracing::warn!(target: "areal::train", steps = rl.totals.steps, "stopped on request; saving the checkpoint and summary");
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
        ctx.eval(rl.totals.steps, rl.version).await?;
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

/// `verifier`, or with `reward_service.workers` the workers started (logs in the run folder's
/// `reward-workers/`) and what verifies through them; starting them waits off the runtime.
async fn start_reward_workers(
    config: &Config,
    mut verifier: Arc<dyn areal_sdk::RewardVerifier>,
    out_dir: Option<&std::path::Path>,
) -> Result<
    (
        Arc<dyn areal_sdk::RewardVerifier>,
        Option<crate::reward_workers::RewardWorkers>,
    ),
    EngineError,
> {
    if config.reward_service.workers == 0 {
        return Ok((verifier, None));
    }
    let config = config.clone();
    let dir = out_dir.map(|d| d.join(crate::runlog::REWARD_WORKERS_DIR));
    tokio::task::spawn_blocking(move || {
        let workers = crate::reward_workers::in_workers(&config, &mut verifier, dir.as_deref())?;
        Ok((verifier, workers))
    })
    .await
    .map_err(|e| EngineError::Internal {
        message: format!("starting the reward workers: {e}"),
    })?
}
