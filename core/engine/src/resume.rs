//! Resume checkpoints: everything a run needs to go on as if it had not stopped, in
//! `checkpoints/<name>/` of the run folder.
//!
//! A checkpoint is the trainer's state (the policy's parameters, the optimizer's state, the
//! reference policy; `trainer/`), the warm-up's best weights while it runs (`warmup-best/`),
//! and `state.json`: the stage and its progress (the warm-up's counters and curve, or the RL
//! step, the policy version, the rollout state with its partial samples, the sample ids
//! trained, the summary's totals), the evaluations, where the records had got to, and the
//! checksum of the task's data. `manifest.json`, written last, holds the sha256 of every other
//! file ([`crate::manifest`]). The folder is written under a temporary name, synced, and renamed into place, so a
//! crash at any moment leaves the previous checkpoints whole; a checkpoint that does not match
//! its manifest is reported by name and passed over for the one before it.
//!
//! Random streams need nothing of their own: every one is keyed by the seed and a counter
//! the state holds (the data order by the group id, sampling by the sample id and its
//! position, the warm-up's order by its step).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::atomic::StagedDir;
use crate::context::{CheckpointStats, RunContext};
use crate::error::EngineError;
use crate::ids::IdRanges;
use crate::metrics::{EvalMetrics, RlTotals, WarmupMetrics, WarmupReport};
use crate::rollout::RolloutSnapshot;
use crate::runlog::LogPosition;
use crate::worker::TrainerState;

/// The folder of resume checkpoints in a run folder.
pub(crate) const DIR: &str = crate::runlog::CHECKPOINTS_DIR;
const STATE_FILE: &str = "state.json";
const TRAINER_DIR: &str = "trainer";
/// The warm-up's best weights so far, in a warm-up checkpoint.
const WARMUP_BEST_DIR: &str = "warmup-best";
/// Resumes so far, in `checkpoints/`.
const RESUMES_FILE: &str = "resumes";
/// What `state.json` means; a checkpoint of another format is not read.
const FORMAT: u32 = 1;

/// `state.json` of a checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RunState {
    pub(crate) format: u32,
    /// The sha256 of the task's data.
    pub(crate) task: String,
    /// Seconds of the run up to the checkpoint (its `wall_s`).
    pub(crate) elapsed_s: f64,
    /// Where the records had got to.
    pub(crate) log: LogPosition,
    /// Every held-out evaluation so far.
    pub(crate) evals: Vec<EvalMetrics>,
    /// What `trainer/` holds.
    pub(crate) trainer: TrainerState,
    /// The checkpoints written before this one.
    pub(crate) checkpoints: CheckpointStats,
    /// The stage and its progress.
    pub(crate) stage: Stage,
    /// The config the run was trained with up to here (what a resume is compared with, not
    /// the folder's `config.toml`, which anyone can replace). Absent in checkpoints written
    /// before it was recorded.
    #[serde(default)]
    pub(crate) config: Option<serde_json::Value>,
}

/// The largest step or version a checkpoint may name: far past any run (2^53), and far from
/// the 2^64 at which a counter wraps.
const MAX_COUNT: u64 = 1 << 53;

impl RunState {
    /// Why this state, read from a checkpoint, cannot be where a run was: a records file named
    /// outside the run folder, a counter past any run, counts that do not add up, a sample the
    /// run could not have trained on. A checkpoint file is untrusted input.
    pub(crate) fn check(&self) -> Result<(), String> {
        let events = &self.log.events_file;
        if !crate::runlog::is_event_file_name(events) {
            return Err(format!(
                "log.events_file {events:?} is not the name of an event file of the run folder"
            ));
        }
        match &self.stage {
            Stage::Warmup(w) => {
                if w.steps > MAX_COUNT || w.best_step > w.steps {
                    return Err(format!(
                        "the warm-up's step {} (best {}) is past any run",
                        w.steps, w.best_step
                    ));
                }
            }
            Stage::Rl(rl) => {
                if rl.step > MAX_COUNT || rl.version > MAX_COUNT {
                    return Err(format!(
                        "stage.step {} or stage.version {} is past any run",
                        rl.step, rl.version
                    ));
                }
                rl.rollout
                    .check(rl.version)
                    .map_err(|why| format!("stage.rollout: {why}"))?;
            }
        }
        Ok(())
    }
}

/// Where a run was.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "stage", rename_all = "snake_case")]
pub(crate) enum Stage {
    /// In the warm-up.
    Warmup(WarmupProgress),
    /// In RL (from the moment it starts, after the baseline evaluation).
    Rl(Box<RlProgress>),
}

/// Where a warm-up is, as a checkpoint holds it: everything its loop carries from one step to
/// the next (the policy and optimizer are saved beside it, and the best weights so far).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct WarmupProgress {
    /// Steps trained.
    pub(crate) steps: u64,
    /// Best validation accuracy and loss so far (none before the first evaluation).
    pub(crate) best: Option<f64>,
    pub(crate) best_loss: Option<f64>,
    /// Evaluations in a row without improvement.
    pub(crate) since_best: u32,
    /// The step of the best weights, saved (0: none saved yet).
    pub(crate) best_step: u64,
    /// False once the policy said it cannot save.
    pub(crate) can_snapshot: bool,
    /// Every evaluation.
    pub(crate) curve: Vec<WarmupMetrics>,
    /// Loss and demonstration tokens since the last evaluation.
    pub(crate) loss_sum: f64,
    pub(crate) tokens: usize,
    /// Seconds the warm-up ran before this process.
    pub(crate) seconds: f64,
}

/// Where RL was: after `step` steps, at `version`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RlProgress {
    pub(crate) step: u64,
    pub(crate) version: u64,
    /// The warm-up this run did or reused.
    pub(crate) warmup: Option<WarmupReport>,
    pub(crate) totals: RlTotals,
    /// Every sample id trained on.
    pub(crate) trained: IdRanges,
    pub(crate) rollout: RolloutSnapshot,
}

impl Stage {
    /// The checkpoint's folder name: `warmup-<step>` or `step-<step>`, which sort in the order
    /// they were written (see [`order`]).
    fn name(&self) -> String {
        match self {
            Stage::Warmup(w) => format!("warmup-{:08}", w.steps),
            Stage::Rl(rl) => format!("step-{:08}", rl.step),
        }
    }
}

/// Newest first: RL after warm-up, a later step after an earlier one.
fn order(name: &str) -> Option<(u8, u64)> {
    let (kind, n) = name.split_once('-')?;
    let rank = match kind {
        "warmup" => 0,
        "step" => 1,
        _ => return None,
    };
    Some((rank, n.parse().ok()?))
}

/// Write a checkpoint of `stage` for the run of `ctx` (nothing without a run folder, or with
/// `checkpoint.every = 0`). The warm-up's best weights so far are copied from `best` when
/// given. Older checkpoints beyond `checkpoint.keep` are removed once it is in place.
///
/// A checkpoint that cannot be written (a full disk, say) is a warning, not the run's end:
/// nothing of it is left, the ones before it stay, and training goes on; only the compute
/// worker's failure stops the run.
pub(crate) async fn save(
    ctx: &mut RunContext,
    stage: Stage,
    best: Option<&Path>,
) -> Result<(), EngineError> {
    let Some(run_dir) = ctx.log.dir().map(ToOwned::to_owned) else {
        return Ok(());
    };
    if ctx.config.checkpoint.every == 0 || !ctx.checkpoints.possible {
        return Ok(());
    }
    let name = stage.name();
    match write(ctx, &run_dir.join(DIR), stage, best).await {
        Ok(()) => Ok(()),
        Err(e @ EngineError::Internal { .. }) => Err(e),
        Err(EngineError::Plugin { source, .. }) if source.is_unsupported() => {
            tracing::warn!(target: "areal::checkpoint", error = %crate::error::chain(&source), "the policy cannot save its training state: this run writes no resume checkpoints");
            ctx.checkpoints.possible = false;
            Ok(())
        }
        Err(e) => {
            tracing::warn!(target: "areal::checkpoint", checkpoint = name, error = %crate::error::chain(&e), "cannot write the resume checkpoint; training goes on, and a resume would go back to the checkpoint before it");
            Ok(())
        }
    }
}

async fn write(
    ctx: &mut RunContext,
    root: &Path,
    stage: Stage,
    best: Option<&Path>,
) -> Result<(), EngineError> {
    let started = Instant::now();
    let target = root.join(stage.name());
    let staged = StagedDir::new(&target).map_err(|e| EngineError::io(e.path, e.source))?;
    let dir = staged.path().to_owned();
    let trainer = ctx.worker.save_state(dir.join(TRAINER_DIR)).await?;
    if let Some(best) = best {
        copy_dir(best, &dir.join(WARMUP_BEST_DIR))?;
    }
    let state = RunState {
        format: FORMAT,
        task: ctx.task_fingerprint.clone(),
        elapsed_s: ctx.wall_s(),
        log: ctx.log.position()?,
        evals: ctx.evals.clone(),
        trainer,
        checkpoints: ctx.checkpoints.clone(),
        stage,
        config: Some(serde_json::to_value(&ctx.config).expect("a config is JSON")),
    };
    let json = serde_json::to_vec_pretty(&state).expect("the run state serialises");
    let path = dir.join(STATE_FILE);
    std::fs::write(&path, json).map_err(|e| EngineError::io(&path, e))?;
    let size = crate::manifest::write(&dir)?;
    crate::failpoint::hit("checkpoint");
    staged
        .commit()
        .map_err(|e| EngineError::io(e.path, e.source))?;
    prune(root, ctx.config.checkpoint.keep)?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let stats = &mut ctx.checkpoints;
    stats.written += 1;
    stats.ms_sum += ms;
    stats.ms_max = stats.ms_max.max(ms);
    stats.bytes = stats.bytes.max(size);
    tracing::info!(target: "areal::checkpoint", name = %target.display(), ms, bytes = size, "checkpoint written");
    Ok(())
}

/// A checkpoint found to resume from.
pub(crate) struct Found {
    /// Its folder.
    pub(crate) dir: PathBuf,
    /// Its `state.json`.
    pub(crate) state: RunState,
    /// Newer checkpoints passed over, each with why.
    pub(crate) skipped: Vec<(String, String)>,
}

/// The newest sound checkpoint of the run folder `run_dir`: every file its manifest lists is
/// there with its checksum and its state reads. Damaged ones are reported by name and passed
/// over; leftovers of a checkpoint that was being written when the run died are removed.
pub(crate) fn latest(run_dir: &Path) -> Result<Option<Found>, EngineError> {
    let root = run_dir.join(DIR);
    if !root.exists() {
        return Ok(None);
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&root).map_err(|e| EngineError::io(&root, e))? {
        let entry = entry.map_err(|e| EngineError::io(&root, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            // a checkpoint staged or replaced when the run died: never complete
            let path = entry.path();
            let _ = std::fs::remove_dir_all(&path);
            continue;
        }
        if let Some(key) = order(&name) {
            names.push((key, name));
        }
    }
    names.sort();
    let mut skipped = Vec::new();
    for (_, name) in names.into_iter().rev() {
        let dir = root.join(&name);
        match verify(&dir) {
            Ok(state) => {
                return Ok(Some(Found {
                    dir,
                    state,
                    skipped,
                }));
            }
            Err(why) => {
                tracing::warn!(target: "areal::checkpoint", checkpoint = %dir.display(), "damaged checkpoint ({why}); trying the one before");
                skipped.push((name, why));
            }
        }
    }
    if skipped.is_empty() {
        return Ok(None);
    }
    Err(EngineError::resume(format!(
        "every checkpoint in {} is damaged: {}",
        root.display(),
        skipped
            .iter()
            .map(|(name, why)| format!("{name} ({why})"))
            .collect::<Vec<_>>()
            .join("; ")
    )))
}

/// The state of the checkpoint `dir`, if its files match its manifest.
fn verify(dir: &Path) -> Result<RunState, String> {
    crate::manifest::verify(dir, STATE_FILE)?;
    let text = areal_sdk::resources::read_file(
        &dir.join(STATE_FILE),
        areal_sdk::resources::MAX_JSON_FILE_BYTES * 16,
    )
    .map_err(|e| format!("{STATE_FILE}: {e}"))?;
    let state = parse_state(&text)?;
    // the base adapters train over is frozen: the one the state holds must be the one they
    // were trained over
    for part in [crate::worker::POLICY_DIR, crate::worker::REFERENCE_DIR] {
        areal_sdk_train::state::check_frozen(&trainer_dir(dir).join(part))
            .map_err(|why| why.replace(&format!("{}/", dir.display()), ""))?;
    }
    Ok(state)
}

/// A checkpoint's `state.json`, read and checked ([`RunState::check`]); why not otherwise.
pub(crate) fn parse_state(text: &[u8]) -> Result<RunState, String> {
    let state: RunState = serde_json::from_slice(text).map_err(|e| format!("{STATE_FILE}: {e}"))?;
    if state.format != FORMAT {
        return Err(format!(
            "{STATE_FILE} is of format {}, this areal reads {FORMAT}",
            state.format
        ));
    }
    state
        .check()
        .map_err(|why| format!("{STATE_FILE}: {why}"))?;
    Ok(state)
}

/// Folder of the trainer's state in the checkpoint `dir`.
pub(crate) fn trainer_dir(dir: &Path) -> PathBuf {
    dir.join(TRAINER_DIR)
}

/// How many times the run in `run_dir` was resumed so far.
pub(crate) fn resumes(run_dir: &Path) -> u64 {
    std::fs::read_to_string(run_dir.join(DIR).join(RESUMES_FILE))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Count one more resume of the run in `run_dir` after `before`; the count, this one included.
pub(crate) fn count_resume(run_dir: &Path, before: u64) -> Result<u64, EngineError> {
    let root = run_dir.join(DIR);
    let path = root.join(RESUMES_FILE);
    std::fs::create_dir_all(&root).map_err(|e| EngineError::io(&root, e))?;
    crate::atomic::write(&path, format!("{}\n", before + 1).as_bytes())
        .map_err(|e| EngineError::io(&path, e))?;
    Ok(before + 1)
}

/// The warm-up's best weights of the checkpoint `dir`, copied into a folder of their own (the
/// checkpoint may be pruned while the warm-up still needs them); `None` if it has none.
pub(crate) fn warmup_best(dir: &Path) -> Result<Option<tempfile::TempDir>, EngineError> {
    let best = dir.join(WARMUP_BEST_DIR);
    if !best.exists() {
        return Ok(None);
    }
    let copy = tempfile::tempdir().map_err(|e| EngineError::io("(temp dir)", e))?;
    copy_dir(&best, copy.path())?;
    Ok(Some(copy))
}

/// Keep the newest `keep` checkpoints under `root`.
fn prune(root: &Path, keep: usize) -> Result<(), EngineError> {
    let mut names: Vec<((u8, u64), String)> = std::fs::read_dir(root)
        .map_err(|e| EngineError::io(root, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            order(&name).map(|key| (key, name))
        })
        .collect();
    names.sort();
    let old = names.len().saturating_sub(keep);
    for (_, name) in names.into_iter().take(old) {
        // renamed first, so that a crash while deleting leaves no half checkpoint under a
        // checkpoint's name
        let path = root.join(&name);
        let trash = root.join(format!(".{name}.removed"));
        std::fs::rename(&path, &trash).map_err(|e| EngineError::io(&path, e))?;
        std::fs::remove_dir_all(&trash).map_err(|e| EngineError::io(&trash, e))?;
    }
    Ok(())
}

/// Copy the files of `from` (one level) into a new folder `to`.
fn copy_dir(from: &Path, to: &Path) -> Result<(), EngineError> {
    std::fs::create_dir_all(to).map_err(|e| EngineError::io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| EngineError::io(from, e))? {
        let path = entry.map_err(|e| EngineError::io(from, e))?.path();
        if path.is_file() {
            let dest = to.join(path.file_name().expect("a file"));
            std::fs::copy(&path, &dest).map_err(|e| EngineError::io(&dest, e))?;
        }
    }
    Ok(())
}
