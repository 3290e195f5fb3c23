//! The interpreter's host: one wasmtime engine, the interpreter's compiled (or snapshotted)
//! module, and runs in fresh stores.

use std::time::Instant;

use sha2::{Digest, Sha256};
use wasmtime::{Config, Engine, InstancePre, Store};

use crate::blocking::block_on;
use crate::capture::{Capture, Feed};
use crate::guest::{Interpreter, hex, read_guest};
use crate::module_cache::load_or_compile;
use crate::preinit::preinitialize;
use crate::run::{
    Limits, MAX_CONCURRENT_RUNS, Mode, Outcome, Run, RunReport, SandboxError, Settings, classify,
};
use crate::sleep::guest_linker;
use crate::store::{Guest, GuestIo, guest_state, watch_memory, watched};
use crate::watchdog::Watch;

/// Wasm stack for the guest's native frames (deep recursion through C needs a lot). It must
/// stay below the async fiber stack.
const MAX_WASM_STACK: usize = 48 << 20;
const ASYNC_STACK: usize = 64 << 20;

/// The wasmtime host of the interpreter. Build once per process; runs are independent.
pub struct Sandbox {
    engine: Engine,
    pre: InstancePre<Guest>,
    interpreter: Interpreter,
    mode: Mode,
    /// The export a run calls: `_start` (python.wasm) or `areal_run` (the snapshot).
    pub(crate) entry: &'static str,
    /// What runs: the module's cache key (binary, pre-initialisation source, mode).
    module: String,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("interpreter", &self.interpreter)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// A sandbox for the interpreter [`Interpreter::locate`] finds.
    pub fn new(settings: &Settings) -> Result<Self, SandboxError> {
        Self::with_interpreter(Interpreter::locate()?, settings)
    }

    /// A sandbox for `interpreter`: compiles it (and pre-initialises it), or loads the result
    /// from the module cache.
    pub fn with_interpreter(
        interpreter: Interpreter,
        settings: &Settings,
    ) -> Result<Self, SandboxError> {
        let mut config = Config::new();
        // No epoch checks: the watchdog stops guests by revoking access to their memory,
        // which needs that no host code touch that memory while the guest runs: interpreters
        // with bulk-memory instructions are refused (`read_guest`); threads are not built
        // into this wasmtime at all (`watchdog.rs`).
        config
            .epoch_interruption(false)
            .consume_fuel(settings.mode == Mode::Deterministic)
            // a trap or an exit (`proc_exit` is an error through the guest's frames) would
            // walk the interpreter's stack and map every frame back to its function for a
            // backtrace nobody reads (~2 % of grading)
            .wasm_backtrace_max_frames(None)
            .max_wasm_stack(MAX_WASM_STACK)
            .async_stack_size(ASYNC_STACK)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            .parallel_compilation(true);
        // Instances come from a pool of pre-reserved slots that are reset and reused, instead
        // of a fresh 4 GiB reservation mapped and unmapped per run (+20 % tests/s on one
        // thread). Memory is mapped copy-on-write from the compiled image (the snapshot).
        let slots = settings.instances.unwrap_or(MAX_CONCURRENT_RUNS).max(1);
        let mut pool = wasmtime::PoolingAllocationConfig::new();
        pool.total_core_instances(slots)
            .total_memories(slots)
            .total_tables(slots)
            .total_stacks(slots)
            .max_memory_size(1 << 32);
        config.allocation_strategy(pool);
        let engine = Engine::new(&config)?;
        let cache_dir = settings
            .cache_dir
            .clone()
            .unwrap_or_else(crate::component::module_cache_dir);
        let linker = guest_linker(&engine)?;
        let (module, entry, key) = match &settings.preinit {
            None => {
                let key = format!("python-{}", &interpreter.sha256()[..16]);
                let wasm = || Ok(read_guest(&interpreter.wasm())?);
                (
                    load_or_compile(&engine, &key, &cache_dir, wasm)?,
                    "_start",
                    key,
                )
            }
            Some(source) => {
                let key = format!(
                    "snapshot-{}-{}-{}",
                    &interpreter.reactor_sha256()[..16],
                    &hex(&Sha256::digest(source.as_bytes()))[..16],
                    settings.mode.as_str()
                );
                let limits = settings.preinit_limits.as_ref();
                let snapshot = || {
                    preinitialize(
                        &engine,
                        &linker,
                        &interpreter,
                        settings.mode,
                        source,
                        limits,
                    )
                };
                let module = load_or_compile(&engine, &key, &cache_dir, snapshot)?;
                (module, "areal_run", key)
            }
        };
        let pre = linker.instantiate_pre(&module)?;
        Ok(Self {
            engine,
            pre,
            interpreter,
            mode: settings.mode,
            entry,
            module: key,
        })
    }

    /// The interpreter this sandbox runs.
    pub fn interpreter(&self) -> &Interpreter {
        &self.interpreter
    }

    /// The metering mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The sha256 of the binary that runs: `python.wasm`, or `areal-guest.wasm` when
    /// pre-initialised.
    pub fn guest_sha256(&self) -> &str {
        if self.entry == "_start" {
            self.interpreter.sha256()
        } else {
            self.interpreter.reactor_sha256()
        }
    }

    /// What the sandbox runs, as its module cache names it: `python-<sha>`, or
    /// `snapshot-<reactor sha>-<pre-initialisation source sha>-<mode>` (16 hex digits each).
    pub fn module(&self) -> &str {
        &self.module
    }

    /// A store for one guest of this sandbox: its WASI context from `io`, the memory cap of
    /// `limits`, their fuel in deterministic mode, and `watch` on its time.
    pub(crate) fn store(
        &self,
        io: GuestIo<'_>,
        limits: &Limits,
        watch: &Watch,
    ) -> Result<Store<Guest>, SandboxError> {
        let guest = guest_state(
            &self.interpreter,
            self.mode,
            io,
            limits.memory_bytes,
            watch.clone(),
        )?;
        let mut store = Store::new(&self.engine, guest);
        watched(
            &mut store,
            (self.mode == Mode::Deterministic).then_some(limits.fuel),
        )?;
        Ok(store)
    }

    /// An instance of the sandbox's module in `store`, its memory shown to the watchdog.
    pub(crate) async fn instantiate(
        &self,
        store: &mut Store<Guest>,
    ) -> wasmtime::Result<wasmtime::Instance> {
        let instance = self.pre.instantiate_async(&mut *store).await?;
        watch_memory(store, &instance);
        Ok(instance)
    }

    /// Run one guest to completion on the current thread, on a tokio runtime of the thread's
    /// own. Not for use inside an async context: `.await` [`Sandbox::run`] there.
    pub fn run_blocking(&self, run: &Run) -> Result<RunReport, SandboxError> {
        block_on(self.run(run))
    }

    /// Run one guest in a fresh store. Errors are the host's; whatever the guest does is an
    /// [`Outcome`].
    pub async fn run(&self, run: &Run) -> Result<RunReport, SandboxError> {
        let started = Instant::now();
        let limits = &run.limits;
        let stdout = Capture::new(limits.stdout_bytes, true);
        let stderr = Capture::new(limits.stderr_bytes, false);
        let watch = Watch::new(
            (self.mode == Mode::Fast).then_some(limits.cpu),
            Some(limits.wall),
        );
        let io = GuestIo {
            stdin: Feed::new(run.stdin.clone()),
            stdout: stdout.clone(),
            stderr: stderr.clone(),
            args: &run.args,
            env: &run.env,
            seed: run.seed,
        };
        let mut store = self.store(io, limits, &watch)?;
        let deterministic = self.mode == Mode::Deterministic;
        // Dropped before the store: the memory is accessible again before it is pooled.
        let _restore = watch.restorer();

        let call = async {
            let instance = self.instantiate(&mut store).await?;
            let startup = started.elapsed();
            let start = instance.get_typed_func::<(), ()>(&mut store, self.entry)?;
            let result = start.call_async(&mut store, ()).await;
            Ok::<_, wasmtime::Error>((startup, result))
        };
        let timed = tokio::time::timeout(limits.wall, call).await;
        let (outcome, startup) = match timed {
            Err(_elapsed) => (Outcome::TimeLimit, None),
            Ok(Err(_)) if store.data().memory.exceeded => (Outcome::MemoryLimit, None),
            Ok(Err(e)) => return Err(SandboxError::Wasmtime(e)),
            Ok(Ok((startup, result))) => {
                let outcome = match result {
                    Ok(()) => Outcome::Exited(0),
                    Err(_) if watch.stopped().is_some() => Outcome::TimeLimit,
                    Err(e) => classify(&e, store.data().memory.exceeded),
                };
                (outcome, Some(startup))
            }
        };
        let (stdout, stdout_overflowed) = stdout.take();
        let outcome = match outcome {
            Outcome::Exited(_) | Outcome::Trapped(_) if stdout_overflowed => Outcome::OutputLimit,
            other => other,
        };
        let fuel = if deterministic {
            store.get_fuel().ok().map(|left| limits.fuel - left)
        } else {
            None
        };
        Ok(RunReport {
            outcome,
            stdout,
            stderr: stderr.take().0,
            wall: started.elapsed(),
            startup: startup.unwrap_or_default(),
            fuel,
            peak_memory: store.data().memory.peak,
        })
    }
}
