//! Reward worker processes: `reward_service.workers = N` runs the run's reward in N
//! `areal serve reward` child processes on loopback, each with one verifier thread and an
//! address space of its own (its own wasmtime engine and interpreter snapshot, so that
//! sandboxes on different cores never share page tables), and verifies through them with the
//! `remote` reward: each sample to the worker with the fewest in flight, a sample whose worker
//! dies sent once more to another.
//!
//! The engine starts them for every entry point (`areal_core::run`, `areal eval`, `areal
//! serve reward`): the program is `reward_service.worker_command`, by default this one. A
//! worker that dies is started again at its address; the `remote` client's health checks put
//! it back to work. Workers read a pipe from this process as their standard input and stop
//! when it closes, however this process ends; every call carries a token made for the run,
//! which the workers get in their environment and the client from a file only this user
//! reads.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use areal_sdk::{
    AsyncVerifier, BuildContext, FaultStats, PluginConfig, PluginError, Reward, RewardInput,
    RewardPlugin, RewardVerifier, VerifyContext,
};

use crate::config::Config;
use crate::error::EngineError;
use crate::processes::{ProcessError, ServerProcesses};

/// Calls to keep in flight per worker: one graded while the other's answer travels back (as
/// the reward service does with `reward_service.workers`).
pub const CALLS_PER_WORKER: usize = 2;
/// How long a worker may take to listen (building a sandbox compiles its module once).
const START_TIMEOUT: Duration = Duration::from_secs(300);
/// How often dead workers are looked for.
const WATCH_EVERY: Duration = Duration::from_millis(200);
/// Restarts of one run's workers, all together, before a dying worker stays dead.
const MAX_RESTARTS: usize = 64;
/// The reward plugin the workers are called through (`areal-serve`'s).
const REMOTE: &str = "remote";

/// What verifies through started workers, and the workers.
pub type Started = (Arc<dyn RewardVerifier>, RewardWorkers);

/// Started worker processes; dropped, they are stopped.
pub struct RewardWorkers {
    processes: Arc<Mutex<ServerProcesses>>,
    /// Dropped to stop the watcher at once (it waits on the other end between its looks).
    stop: Option<Sender<()>>,
    watcher: Option<JoinHandle<()>>,
    // last: the served config, token and logs of a run without a folder
    _scratch: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for RewardWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardWorkers").finish_non_exhaustive()
    }
}

impl Drop for RewardWorkers {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
        self.processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop();
    }
}

/// What verifies through the workers: the `remote` client, under the name and cache
/// identity of the reward the workers run (built in this process too, which checked its
/// config), so that the run's reward cache works as it does in process. A sample the client
/// cannot send (a LiveCodeBench record of more than 64 MiB, which `max_tests_mb` admits) is
/// verified by that same reward in this process: workers and in-process verification give
/// the same reward for every sample.
struct WorkerVerifier {
    remote: Arc<dyn RewardVerifier>,
    local: Arc<dyn RewardVerifier>,
}

impl RewardVerifier for WorkerVerifier {
    fn name(&self) -> &str {
        self.local.name()
    }

    fn verify(&self, input: &RewardInput, ctx: &VerifyContext) -> Result<Reward, PluginError> {
        match self.remote.verify(input, ctx) {
            Err(e) if e.is_unsupported() => self.local.verify(input, ctx),
            verified => verified,
        }
    }

    fn cache_identity(&self) -> Option<String> {
        self.local.cache_identity()
    }

    fn faults(&self) -> FaultStats {
        self.remote.faults()
    }

    fn as_async(&self) -> Option<&dyn AsyncVerifier> {
        self.remote.as_async().map(|_| self as &dyn AsyncVerifier)
    }
}

/// The workers are awaited; a sample too big for them is verified in process on a blocking
/// thread of the runtime.
#[areal_sdk::async_trait]
impl AsyncVerifier for WorkerVerifier {
    async fn verify(
        &self,
        input: &RewardInput,
        ctx: &VerifyContext,
    ) -> Result<Reward, PluginError> {
        let remote = self.remote.as_async().expect("checked by as_async");
        match remote.verify(input, ctx).await {
            Err(e) if e.is_unsupported() => {
                let (local, input, ctx) = (self.local.clone(), input.clone(), ctx.clone());
                match tokio::task::spawn_blocking(move || local.verify(&input, &ctx)).await {
                    Ok(verified) => verified,
                    // the service's catch judges it as any verifier's panic
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(e) => Err(PluginError::failed(
                        self.local.name(),
                        format!("verifying in process: {e}"),
                    )),
                }
            }
            verified => verified,
        }
    }
}

/// `config`'s reward in `config.reward_service.workers` worker processes, when it asks for
/// any: the verifier to use instead of `local` (the same reward, built in this process), and
/// the workers, which live as long as what is returned. Their served config, token and logs
/// go to `dir` (a run's `reward-workers/`), or to a scratch folder.
pub fn start(
    config: &Config,
    local: &Arc<dyn RewardVerifier>,
    dir: Option<&Path>,
) -> Result<Option<Started>, EngineError> {
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
                .map_err(|e| EngineError::io(std::env::temp_dir(), e))?;
            let path = scratch.path().to_owned();
            (Some(scratch), path)
        }
    };
    std::fs::create_dir_all(&dir).map_err(|e| EngineError::io(&dir, e))?;
    let mut served = config.clone();
    served.reward_service.workers = 0;
    served.reward_service.threads = 1;
    let served_path = dir.join("config.toml");
    crate::atomic::write(&served_path, served.to_toml().as_bytes())
        .map_err(|e| EngineError::io(&served_path, e))?;
    let token = fresh_token();
    let token_file = dir.join("token");
    write_private(&token_file, &token).map_err(|e| EngineError::io(&token_file, e))?;
    let (program, before) = program(config)?;
    let args = ["--config".into(), served_path.clone().into_os_string()];
    let mut processes = ServerProcesses::default().with_token(token);
    let not_started = |source: ProcessError| EngineError::Workers {
        message: format!(
            "reward_service.workers = {count}: the workers ({} serve reward) did not start; \
             they are `areal serve reward` processes: run from the `areal` binary (or one \
             built on areal_cli::main_with), or set reward_service.worker_command",
            program.display()
        ),
        source,
    };
    for _ in 0..count {
        processes
            .start_command(&program, &before, "reward", &args, &dir)
            .map_err(not_started)?;
    }
    let urls: Vec<String> = processes
        .wait_listening(START_TIMEOUT)
        .map_err(not_started)?
        .into_iter()
        .map(|(_, url)| url)
        .collect();
    // the `remote` reward's defaults, on these endpoints
    let section = PluginConfig::new("reward_service.workers", REMOTE)
        .with("endpoints", serde_json::json!(urls))
        .with("token_file", token_file.to_string_lossy().into_owned());
    let remote =
        RewardPlugin::build_from(&section, &BuildContext::new(config.seed, 1)).map_err(|e| {
            let message = format!(
                "reward_service.workers = {count}: the workers are called through the `{REMOTE}` \
                 reward of areal-serve, which cannot be built here (link areal-serve, or set \
                 reward_service.workers = 0): {e}"
            );
            EngineError::Setup { message }
        })?;
    tracing::info!(target: "areal::workers", workers = count, folder = %dir.display(), "reward workers listening");
    let processes = Arc::new(Mutex::new(processes));
    let (stop, stopping) = std::sync::mpsc::channel();
    let watcher = {
        let processes = processes.clone();
        std::thread::Builder::new()
            .name("areal-reward-workers".into())
            .spawn(move || watch(&processes, &stopping))
            .map_err(|e| EngineError::Workers {
                message: "cannot watch the reward workers".into(),
                source: ProcessError::Thread(e),
            })?
    };
    let verifier = WorkerVerifier {
        remote,
        local: Arc::clone(local),
    };
    Ok(Some((
        Arc::new(verifier),
        RewardWorkers {
            processes,
            stop: Some(stop),
            watcher: Some(watcher),
            _scratch: scratch,
        },
    )))
}

/// The program that runs a worker and its first arguments: `reward_service.worker_command`,
/// or this program.
fn program(config: &Config) -> Result<(PathBuf, Vec<std::ffi::OsString>), EngineError> {
    match config.reward_service.worker_command.split_first() {
        Some((program, before)) => Ok((
            PathBuf::from(program),
            before.iter().map(Into::into).collect(),
        )),
        None => {
            let this = std::env::current_exe().map_err(|e| EngineError::Setup {
                message: format!(
                    "reward_service.workers: cannot find this program to start the workers with \
                     ({e}); set reward_service.worker_command"
                ),
            })?;
            Ok((this, Vec::new()))
        }
    }
}

/// Start again every worker that dies, until `stopping` is closed (or out of restarts).
fn watch(processes: &Mutex<ServerProcesses>, stopping: &Receiver<()>) {
    let mut restarts = 0usize;
    while let Err(RecvTimeoutError::Timeout) = stopping.recv_timeout(WATCH_EVERY) {
        if restarts >= MAX_RESTARTS {
            continue;
        }
        let mut processes = processes.lock().unwrap_or_else(|p| p.into_inner());
        for (index, result) in processes.restart_exited(START_TIMEOUT) {
            restarts += 1;
            match result {
                Ok(()) => {
                    tracing::info!(target: "areal::workers", index, restarts, "reward worker started again")
                }
                Err(e) => {
                    tracing::error!(target: "areal::workers", index, "reward worker could not be started again: {}", crate::chain(&e))
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

/// Write `text` to `path`, readable by this user only.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(text.as_bytes())
}

/// With `reward_service.workers`, start the worker processes and verify through them instead
/// of with `verifier` (which stays the name and cache identity); the workers live as long as
/// what is returned.
pub fn in_workers(
    config: &Config,
    verifier: &mut Arc<dyn RewardVerifier>,
    dir: Option<&Path>,
) -> Result<Option<RewardWorkers>, EngineError> {
    Ok(start(config, verifier, dir)?.map(|(through, workers)| {
        *verifier = through;
        workers
    }))
}
