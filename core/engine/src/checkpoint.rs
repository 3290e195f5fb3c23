//! The final checkpoint: the policy saved into the run folder, atomically, retried while the
//! disk is full.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use areal_sdk::BoxError;

use crate::atomic::StagedDir;
use crate::context::RunContext;
use crate::error::EngineError;

/// The checkpoint's folder in a run folder.
pub(crate) const NAME: &str = crate::runlog::CHECKPOINT_DIR;

/// How long to wait between attempts at saving the checkpoint.
const RETRY_EVERY: Duration = Duration::from_secs(10);

/// Save the policy into `checkpoint/` of the run folder `dir`, atomically. A failure (a full
/// disk) is retried every 10 s for `checkpoint.retry_s`, so that freeing space saves the
/// model; a stop request gives up at once. `Ok(None)` when the policy cannot save at all.
pub(crate) async fn save(ctx: &RunContext, dir: &Path) -> Result<Option<PathBuf>, EngineError> {
    let target = dir.join(NAME);
    let started = Instant::now();
    let budget = Duration::from_secs_f64(ctx.config.checkpoint.retry_s);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let error: BoxError = match attempt(ctx, &target).await? {
            Attempt::Saved => return Ok(Some(PathBuf::from(NAME))),
            Attempt::Unsupported => {
                tracing::warn!(target: "areal::engine", "the policy cannot save checkpoints");
                return Ok(None);
            }
            Attempt::Failed(error) => error,
        };
        let left = budget.saturating_sub(started.elapsed());
        if left.is_zero() || ctx.interrupt.is_requested() {
            return Err(EngineError::Checkpoint {
                path: target,
                attempts,
                seconds: started.elapsed().as_secs_f64(),
                source: error,
            });
        }
        tracing::warn!(
            target: "areal::engine",
            "cannot save the checkpoint to {}: {}; trying again in {} s for up to {:.0} s more (checkpoint.retry_s): free some space, or stop the run",
            target.display(),
            crate::error::chain(error.as_ref()),
            RETRY_EVERY.as_secs(),
            left.as_secs_f64()
        );
        tokio::select! {
            () = tokio::time::sleep(RETRY_EVERY.min(left)) => {}
            () = ctx.interrupt.requested() => {}
        }
    }
}

enum Attempt {
    Saved,
    Unsupported,
    Failed(BoxError),
}

async fn attempt(ctx: &RunContext, target: &Path) -> Result<Attempt, EngineError> {
    let staged = match StagedDir::new(target) {
        Ok(staged) => staged,
        Err(e) => return Ok(Attempt::Failed(Box::new(e))),
    };
    match ctx.worker.save(staged.path().to_owned()).await? {
        Ok(()) => {}
        Err(e) if e.is_unsupported() => return Ok(Attempt::Unsupported),
        Err(e) => return Ok(Attempt::Failed(Box::new(e))),
    }
    Ok(match staged.commit() {
        Ok(()) => Attempt::Saved,
        Err(e) => Attempt::Failed(Box::new(e)),
    })
}
