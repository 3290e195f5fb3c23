//! Reward worker processes: `reward_service.workers = N` runs the run's reward in N
//! `areal serve reward` child processes on loopback, each with one verifier thread and an
//! address space of its own (its own wasmtime engine and interpreter snapshot, so that
//! sandboxes on different cores never share page tables), and verifies through them as the
//! `remote` reward does: each sample to the worker with the fewest in flight, a sample whose
//! worker dies sent once more to another.
//!
//! A worker that dies is started again at its address; the `remote` client's health checks
//! put it back to work. Workers read a pipe from this process as their standard input and stop
//! when it closes, however this process ends; every call carries a token made for the run.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use areal_core::Config;
use areal_sdk::{FaultStats, PluginError, Reward, RewardInput, RewardVerifier, VerifyContext};
use areal_serve::{RemoteRewardOptions, RemoteVerifier};

use crate::servers::Servers;

/// Calls to keep in flight per worker: one graded while the other's answer travels back (as
/// the reward service does with `reward_service.workers`).
pub const CALLS_PER_WORKER: usize = 2;
/// How long a worker may take to listen (building a sandbox compiles its module once).
const START_TIMEOUT: Duration = Duration::from_secs(300);
/// How often dead workers are looked for.
const WATCH_EVERY: Duration = Duration::from_millis(200);
/// Restarts of one run's workers, all together, before a dying worker stays dead.
const MAX_RESTARTS: usize = 64;

/// Started worker processes; dropped, they are stopped.
pub struct RewardWorkers {
    servers: Arc<Mutex<Servers>>,
    stopping: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
    // last: the served config and logs of a run without a folder
    _scratch: Option<tempfile::TempDir>,
}

impl Drop for RewardWorkers {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
        self.servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop();
    }
}

/// What verifies through the workers: the `remote` client, under the name and cache
/// identity of the reward the workers run (built in this process too, which checked its
/// config), so that the run's reward cache works as it does in process. A sample too big for
/// a call to a worker (a LiveCodeBench record of more than 64 MiB, which `max_tests_mb`
/// admits) is verified by that same reward in this process: workers and in-process
/// verification give the same reward for every sample.
struct WorkerVerifier {
    remote: RemoteVerifier,
    local: Arc<dyn RewardVerifier>,
}

impl RewardVerifier for WorkerVerifier {
    fn name(&self) -> &str {
        self.local.name()
    }

    fn verify(&self, input: &RewardInput, ctx: &VerifyContext) -> Result<Reward, PluginError> {
        if RemoteVerifier::fits(input) {
            self.remote.verify(input, ctx)
        } else {
            self.local.verify(input, ctx)
        }
    }

    fn cache_identity(&self) -> Option<String> {
        self.local.cache_identity()
    }

    fn faults(&self) -> FaultStats {
        self.remote.faults()
    }
}

/// `config`'s reward in `config.reward_service.workers` worker processes, when it asks for
/// any: the verifier to use instead of `local` (the same reward, built in this process), and
/// the workers. Their served config and logs go to `dir` (a run's `reward-workers/`), or to
/// a scratch folder.
pub(crate) fn start(
    config: &Config,
    local: &Arc<dyn RewardVerifier>,
    dir: Option<&Path>,
) -> anyhow::Result<Option<(Arc<dyn RewardVerifier>, RewardWorkers)>> {
    let count = config.reward_service.workers;
    if count == 0 {
        return Ok(None);
    }
    let (scratch, dir) = match dir {
        Some(dir) => (None, dir.to_owned()),
        None => {
            let scratch = tempfile::Builder::new()
                .prefix("areal-reward-workers-")
                .tempdir()
                .context("cannot make a folder for the reward workers")?;
            let path = scratch.path().to_owned();
            (Some(scratch), path)
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut served = config.clone();
    served.reward_service.workers = 0;
    served.reward_service.threads = 1;
    let served_path = dir.join("config.toml");
    areal_core::atomic::write(&served_path, served.to_toml().as_bytes())
        .with_context(|| format!("cannot write {}", served_path.display()))?;
    let token = fresh_token();
    let exe = std::env::current_exe().context("cannot find the areal binary")?;
    let args = ["--config".into(), served_path.clone().into_os_string()];
    let mut servers = Servers::default().with_token(token.clone());
    for _ in 0..count {
        servers.start(&exe, "reward", &args, &dir)?;
    }
    let urls: Vec<String> = servers
        .wait_listening(START_TIMEOUT)?
        .into_iter()
        .map(|(_, url)| url)
        .collect();
    // the `remote` reward's defaults, on these endpoints
    let options: RemoteRewardOptions =
        serde_json::from_value(serde_json::json!({ "endpoints": urls }))?;
    let remote = RemoteVerifier::new(&options, Some(&token))
        .map_err(|(key, why)| anyhow::anyhow!("reward workers: {key}: {why}"))?;
    tracing::info!(target: "areal::workers", workers = count, folder = %dir.display(), "reward workers listening");
    let servers = Arc::new(Mutex::new(servers));
    let stopping = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (servers, stopping) = (servers.clone(), stopping.clone());
        std::thread::Builder::new()
            .name("areal-reward-workers".into())
            .spawn(move || watch(&servers, &stopping))
            .context("cannot start a thread")?
    };
    let verifier = WorkerVerifier {
        remote,
        local: Arc::clone(local),
    };
    Ok(Some((
        Arc::new(verifier),
        RewardWorkers {
            servers,
            stopping,
            watcher: Some(watcher),
            _scratch: scratch,
        },
    )))
}

/// Start again every worker that dies, until told to stop (or out of restarts).
fn watch(servers: &Mutex<Servers>, stopping: &AtomicBool) {
    let mut restarts = 0usize;
    while !stopping.load(Ordering::SeqCst) {
        std::thread::sleep(WATCH_EVERY);
        if restarts >= MAX_RESTARTS {
            continue;
        }
        let mut servers = servers.lock().unwrap_or_else(|p| p.into_inner());
        if stopping.load(Ordering::SeqCst) {
            break;
        }
        for (index, result) in servers.restart_exited(START_TIMEOUT) {
            restarts += 1;
            match result {
                Ok(()) => {
                    tracing::info!(target: "areal::workers", index, restarts, "reward worker started again")
                }
                Err(e) => {
                    tracing::error!(target: "areal::workers", index, "reward worker could not be started again: {e:#}")
                }
            }
            if restarts >= MAX_RESTARTS {
                tracing::error!(target: "areal::workers", "{MAX_RESTARTS} restarts: dead reward workers now stay dead");
            }
        }
    }
}

/// A token no other process can guess (128 random bits, hex).
fn fresh_token() -> String {
    use rand::RngExt;
    let mut rng = rand::rng();
    (0..4)
        .map(|_| format!("{:08x}", rng.random::<u32>()))
        .collect()
}

/// With `reward_service.workers`, start the worker processes and verify through them instead
/// of with `verifier` (which stays the name and cache identity); the workers live as long as
/// what is returned.
pub(crate) fn in_workers(
    config: &areal_core::Config,
    verifier: &mut Arc<dyn areal_sdk::RewardVerifier>,
    dir: Option<&Path>,
) -> anyhow::Result<Option<RewardWorkers>> {
    Ok(start(config, verifier, dir)?.map(|(through, workers)| {
        *verifier = through;
        workers
    }))
}
