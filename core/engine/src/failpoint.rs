//! Kill points for tests of resuming: `AREAL_FAILPOINT=NAME[:N]` kills the process with
//! SIGKILL (as `kill -9` does: no clean-up, no flush) the `N`-th time (by default the first)
//! the run reaches the point `NAME`:
//!
//! - `rollout`: a sample's part was recorded (during generation);
//! - `train`: a training step (warm-up or RL) was computed but not yet handed back;
//! - `checkpoint`: a resume checkpoint's files are written, not yet put in place.
//!
//! `AREAL_STALL=NAME:MS` instead makes the run wait `MS` milliseconds (blocking its thread, as
//! a descheduled thread on a busy machine waits) each time it reaches `NAME` (for `rollout`,
//! after the part and before the turn's end is recorded): a test's way to make the slow
//! moments of a loaded machine happen every time.
//!
//! Without the variables a point costs one atomic load.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

struct Armed {
    name: String,
    at: u64,
    hits: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var("AREAL_FAILPOINT").ok()?;
            let (name, at) = match spec.split_once(':') {
                Some((name, n)) => (name, n.parse().ok()?),
                None => (spec.as_str(), 1),
            };
            Some(Armed {
                name: name.to_owned(),
                at,
                hits: AtomicU64::new(0),
            })
        })
        .as_ref()
}

struct Stall {
    name: String,
    wait: std::time::Duration,
}

fn stall_armed() -> Option<&'static Stall> {
    static STALL: OnceLock<Option<Stall>> = OnceLock::new();
    STALL
        .get_or_init(|| {
            let spec = std::env::var("AREAL_STALL").ok()?;
            let (name, ms) = spec.split_once(':')?;
            Some(Stall {
                name: name.to_owned(),
                wait: std::time::Duration::from_millis(ms.parse().ok()?),
            })
        })
        .as_ref()
}

/// The run is about to reach the point `name`: wait there if `AREAL_STALL` names it.
pub(crate) fn stall(name: &str) {
    if let Some(stall) = stall_armed().filter(|s| s.name == name) {
        std::thread::sleep(stall.wait);
    }
}

/// The run reached the point `name`.
pub(crate) fn hit(name: &str) {
    let Some(armed) = armed() else { return };
    if armed.name == name && armed.hits.fetch_add(1, Ordering::SeqCst) + 1 == armed.at {
        tracing::warn!(target: "areal::engine", failpoint = name, "AREAL_FAILPOINT: killing the process");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}
