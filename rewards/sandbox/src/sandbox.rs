//! One wasmtime engine, the interpreter's compiled module, and runs in fresh stores.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wasmtime::{Config, Engine, InstancePre, Linker, Module, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::capture::Capture;
use crate::guest::{Interpreter, InterpreterError, hex};
use crate::watchdog::{Stop, Watch};

/// The guest path of the read-only standard library (the interpreter's compiled-in prefix).
const GUEST_STDLIB: &str = "/usr/local/lib/python3.11";
/// How often the epoch advances (reward components): the granularity of their CPU limits and
/// of yielding to tokio. The interpreter has no epochs: `watchdog.rs`.
const EPOCH_TICK: Duration = Duration::from_millis(5);
/// Wasm stack for the guest's native frames (deep recursion through C needs a lot). It must
/// stay below the async fiber stack.
const MAX_WASM_STACK: usize = 48 << 20;
const ASYNC_STACK: usize = 64 << 20;
/// Runs that may be in flight at once in one sandbox (slots of the instance pool).
pub const MAX_CONCURRENT_RUNS: u32 = 64;
/// Open resources one guest may hold at once: files and directories (each one a host file
/// descriptor), streams, pollables. Importing needs a few at a time; past the cap the guest
/// traps (`runtime_error`), so that no guest can exhaust the process's descriptors and fail
/// the guests beside it: `N` guests at once hold at most `64 N` descriptors.
pub const MAX_GUEST_RESOURCES: usize = 64;

/// The wasmtime version this crate runs (part of every cache key and provenance).
pub fn wasmtime_version() -> &'static str {
    "48.0.8"
}

/// How the engine meters guests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// CPU time, checked by a watchdog thread (free for the guest); verdicts near a limit may
    /// vary between runs.
    #[default]
    Fast,
    /// A fuel budget instead of CPU time, a fixed clock and random source: the same program,
    /// input and budget give the same outcome and the same fuel, bit for bit. Fuel metering
    /// costs ~18–40 % speed.
    Deterministic,
}

impl Mode {
    /// The mode as configs and provenance write it (`"fast"`, `"deterministic"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Fast => "fast",
            Mode::Deterministic => "deterministic",
        }
    }
}

/// What a sandbox is built from: each distinct value compiles (and caches) its own module.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Metering mode.
    pub mode: Mode,
    /// Where compiled modules are cached (default `<interpreter folder>/compiled`).
    pub cache_dir: Option<PathBuf>,
    /// Pre-initialise: Python source that runs once, when the sandbox is built, in the
    /// reactor build of the interpreter (`areal-guest.wasm`); the instance is then
    /// snapshotted (wasmtime-wizer) and every run starts from that snapshot by calling the
    /// `areal_main()` the source defined, instead of `python` with [`Run::args`]. The source's
    /// imports are then paid once, not per run. The source sees `PYTHONHASHSEED=0` and, in
    /// deterministic mode, the fixed clock and random source; what it computes is shared by
    /// every run (reseed what should differ).
    pub preinit: Option<String>,
    /// Limits of the pre-initialisation (CPU time, wall time, memory), for source that is not
    /// the project's own: past them building the sandbox fails, naming the limit. `None`:
    /// unbounded.
    pub preinit_limits: Option<Limits>,
}

/// Limits of one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Time the guest itself spends: the CPU time of the thread running it plus the time it
    /// sleeps (not the time it waits for a core, so a verdict does not depend on how busy the
    /// machine is), enforced by a watchdog thread (`watchdog.rs`; reward components: epoch
    /// interruption) and in the guest's sleeps. In deterministic mode the fuel budget
    /// replaces it.
    pub cpu: Duration,
    /// Wall time, enforced by the watchdog and a timeout around the whole run: the last
    /// resort, for a guest stuck where no other limit reaches (and for sleeping guests in
    /// deterministic mode).
    pub wall: Duration,
    /// Linear memory, in bytes.
    pub memory_bytes: usize,
    /// Captured stdout, in bytes; more is an output-limit outcome.
    pub stdout_bytes: usize,
    /// Captured stderr, in bytes; more is cut off silently.
    pub stderr_bytes: usize,
    /// Fuel budget (deterministic mode only; ignored otherwise).
    pub fuel: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            cpu: Duration::from_secs(10),
            wall: Duration::from_secs(20),
            memory_bytes: 512 << 20,
            stdout_bytes: 16 << 20,
            stderr_bytes: 64 << 10,
            fuel: 20_000_000_000,
        }
    }
}

/// One guest run: `python` with `args` (or, pre-initialised, `areal_main()`), the given
/// environment and stdin.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// Arguments after `argv[0]` (e.g. `["-S", "-c", "print(1)"]`); ignored by a
    /// pre-initialised sandbox, whose interpreter was started at snapshot time.
    pub args: Vec<String>,
    /// The guest's whole environment (the host's never reaches it).
    pub env: Vec<(String, String)>,
    /// Bytes on the guest's stdin.
    pub stdin: Vec<u8>,
    /// Limits.
    pub limits: Limits,
    /// Seed of the guest's random source in deterministic mode.
    pub seed: u64,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum Outcome {
    /// The guest exited with this status (0 when `_start` returned).
    Exited(i32),
    /// CPU time, fuel or wall time ran out.
    TimeLimit,
    /// The guest asked for more memory than allowed.
    MemoryLimit,
    /// The guest printed more than allowed.
    OutputLimit,
    /// The guest trapped (stack overflow, unreachable...): the trap's description.
    Trapped(String),
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// How it ended.
    pub outcome: Outcome,
    /// Captured stdout (at most the cap).
    pub stdout: Vec<u8>,
    /// Captured stderr (at most the cap).
    pub stderr: Vec<u8>,
    /// Wall time of the whole run, instantiation included.
    pub wall: Duration,
    /// Wall time of instantiation (store, WASI context, instance; from a snapshot, the
    /// interpreter is already initialised).
    pub startup: Duration,
    /// Fuel spent (deterministic mode).
    pub fuel: Option<u64>,
    /// Peak linear memory, in bytes.
    pub peak_memory: usize,
}

/// Why the sandbox could not run a guest at all (never the guest's own fault).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The interpreter is missing or damaged.
    #[error(transparent)]
    Interpreter(#[from] InterpreterError),
    /// wasmtime failed (configuration, compilation, instantiation).
    #[error("wasmtime: {0:#}")]
    Wasmtime(wasmtime::Error),
    /// A reward component could not be loaded: it is missing, not a component, or does not
    /// implement `areal:reward`.
    #[error("reward component {}: {message}", path.display())]
    Component {
        /// The component's file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The module cache could not be used.
    #[error("module cache {}", path.display())]
    Cache {
        /// The cache file or folder.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
}

impl From<wasmtime::Error> for SandboxError {
    fn from(e: wasmtime::Error) -> Self {
        SandboxError::Wasmtime(e)
    }
}

struct Guest {
    wasi: WasiP1Ctx,
    clock: GuestClock,
    mode: Mode,
    memory: MemoryCap,
    watch: Watch,
}

/// A run's time limit, counted in time the guest itself spends: the CPU time of the thread
/// running it plus the time it sleeps. Time spent waiting for a core while other work runs
/// counts for neither, so a verdict does not depend on how busy the machine is.
pub(crate) struct TimeBudget {
    /// The limit; `None` in deterministic mode, where fuel bounds the CPU and the wall limit
    /// a sleeping guest.
    limit: Option<Duration>,
    meter: CpuMeter,
    slept: Duration,
}

impl TimeBudget {
    pub(crate) fn new(limit: Option<Duration>) -> Self {
        Self {
            limit,
            meter: CpuMeter::default(),
            slept: Duration::ZERO,
        }
    }

    /// What is left of the limit (`None`: no limit).
    pub(crate) fn left(&mut self) -> Option<Duration> {
        let used = self.meter.used() + self.slept;
        self.limit.map(|limit| limit.saturating_sub(used))
    }
}

pub(crate) struct MemoryCap {
    pub(crate) max: usize,
    pub(crate) peak: usize,
    pub(crate) exceeded: bool,
    /// The run's watchdog, told the memory's size (the interpreter's runs).
    watch: Option<(Watch, usize)>,
}

impl MemoryCap {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            peak: 0,
            exceeded: false,
            watch: None,
        }
    }

    fn watched(max: usize, watch: Watch) -> Self {
        Self {
            watch: Some((watch, 0)),
            ..Self::new(max)
        }
    }
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max {
            self.exceeded = true;
            return Err(wasmtime::Error::msg("memory limit"));
        }
        self.peak = self.peak.max(desired);
        if let Some((watch, before)) = &mut self.watch {
            *before = current;
            watch.set_memory_len(desired);
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        if let Some((watch, before)) = &self.watch {
            watch.set_memory_len(*before);
        }
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// A store's guest state with the two limits every guest runs under.
pub(crate) trait Metered: Send + 'static {
    fn memory(&mut self) -> &mut MemoryCap;
    fn time(&mut self) -> &mut TimeBudget;
}

/// Put a reward component's store under its limits: memory by its cap, `fuel` when given
/// (deterministic mode), and at every epoch tick a yield to tokio (so the wall-time timeout
/// can fire), or an interrupt once the time budget (the guest's own CPU time plus its sleeps,
/// see `TimeBudget`) is spent. In deterministic mode fuel is the only CPU bound.
pub(crate) fn meter<T: Metered>(store: &mut Store<T>, fuel: Option<u64>) -> wasmtime::Result<()> {
    store.limiter(|g| g.memory());
    if let Some(fuel) = fuel {
        store.set_fuel(fuel)?;
    }
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut ctx| {
        if ctx
            .data_mut()
            .time()
            .left()
            .is_some_and(|left| left.is_zero())
        {
            return Ok(wasmtime::UpdateDeadline::Interrupt);
        }
        Ok(wasmtime::UpdateDeadline::Yield(1))
    });
    Ok(())
}

/// Run `future` to completion on the current thread, on a tokio runtime of the thread's own
/// (the blocking entry points of the sandbox; not for use inside an async context).
pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("building a current-thread tokio runtime");
    }
    RUNTIME.with(|rt| rt.block_on(future))
}

/// The wasmtime host of the interpreter. Build once per process; runs are independent.
pub struct Sandbox {
    engine: Engine,
    pre: InstancePre<Guest>,
    interpreter: Interpreter,
    mode: Mode,
    /// The export a run calls: `_start` (python.wasm) or `areal_run` (the snapshot).
    entry: &'static str,
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
            .max_wasm_stack(MAX_WASM_STACK)
            .async_stack_size(ASYNC_STACK)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            .parallel_compilation(true);
        // Instances come from a pool of pre-reserved slots that are reset and reused, instead
        // of a fresh 4 GiB reservation mapped and unmapped per run (+20 % tests/s on one
        // thread). Memory is mapped copy-on-write from the compiled image (the snapshot).
        let mut pool = wasmtime::PoolingAllocationConfig::new();
        pool.total_core_instances(MAX_CONCURRENT_RUNS)
            .total_memories(MAX_CONCURRENT_RUNS)
            .total_tables(MAX_CONCURRENT_RUNS)
            .total_stacks(MAX_CONCURRENT_RUNS)
            .max_memory_size(1 << 32);
        config.allocation_strategy(pool);
        let engine = Engine::new(&config)?;
        let cache_dir = settings
            .cache_dir
            .clone()
            .unwrap_or_else(|| interpreter.wasm().with_file_name("compiled"));
        let linker = guest_linker(&engine)?;
        let (module, entry, key) = match &settings.preinit {
            None => {
                let key = format!("python-{}", &interpreter.sha256()[..16]);
                let wasm = || read_guest(&interpreter.wasm());
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
        let guest = guest_state(
            &self.interpreter,
            self.mode,
            GuestIo {
                stdin: run.stdin.clone(),
                stdout: stdout.clone(),
                stderr: stderr.clone(),
                args: &run.args,
                env: &run.env,
                seed: run.seed,
            },
            limits.memory_bytes,
            watch.clone(),
        )?;
        let mut store = Store::new(&self.engine, guest);
        let deterministic = self.mode == Mode::Deterministic;
        watched(&mut store, deterministic.then_some(limits.fuel))?;
        // Dropped before the store: the memory is accessible again before it is pooled.
        let _restore = watch.restorer();

        let call = async {
            let instance = self.pre.instantiate_async(&mut store).await?;
            watch_memory(&mut store, &instance);
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

struct GuestIo<'a> {
    stdin: Vec<u8>,
    stdout: Capture,
    stderr: Capture,
    args: &'a [String],
    env: &'a [(String, String)],
    seed: u64,
}

/// A fresh guest: WASI context (stdio, args, environment, the read-only stdlib mount, clocks
/// and random source of the mode), memory cap, and the watch of its time.
fn guest_state(
    interpreter: &Interpreter,
    mode: Mode,
    io: GuestIo<'_>,
    memory_bytes: usize,
    watch: Watch,
) -> Result<Guest, SandboxError> {
    let clock = GuestClock::new(mode);
    let mut wasi = WasiCtxBuilder::new();
    // The stdlib's reads are small and local: do them on this thread instead of tokio's
    // blocking pool (start-up makes hundreds of them).
    wasi.allow_blocking_current_thread(true);
    wasi.stdin(MemoryInputPipe::new(io.stdin))
        .stdout(io.stdout)
        .stderr(io.stderr)
        .arg("python")
        .args(io.args)
        .envs(io.env)
        .preopened_dir(interpreter.stdlib(), GUEST_STDLIB, FsPerms::ReadOnly)?;
    wasi.wall_clock(clock).monotonic_clock(clock);
    if mode == Mode::Deterministic {
        wasi.secure_random(SeededRandom::new(io.seed))
            .insecure_random(SeededRandom::new(io.seed ^ 0x9e37_79b9_7f4a_7c15))
            .insecure_random_seed(u128::from(io.seed));
    }
    let mut wasi = wasi.build_p1();
    wasmtime_wasi::WasiView::ctx(&mut wasi)
        .table
        .set_max_capacity(MAX_GUEST_RESOURCES);
    Ok(Guest {
        wasi,
        clock,
        mode,
        memory: MemoryCap::watched(memory_bytes, watch.clone()),
        watch,
    })
}

/// Put an interpreter's store under its limits: memory by its cap, `fuel` when given
/// (deterministic mode), time by the watchdog (through the call hook).
fn watched(store: &mut Store<Guest>, fuel: Option<u64>) -> wasmtime::Result<()> {
    store.limiter(|g| &mut g.memory);
    if let Some(fuel) = fuel {
        store.set_fuel(fuel)?;
    }
    let watch = store.data().watch.clone();
    store.call_hook(move |_, hook| watch.hook(hook));
    Ok(())
}

/// Tell the run's watchdog where the instance's memory is.
fn watch_memory(store: &mut Store<Guest>, instance: &wasmtime::Instance) {
    if let Some(memory) = instance.get_memory(&mut *store, "memory") {
        let base = memory.data_ptr(&*store);
        store.data().watch.set_memory_base(base);
    }
}

/// Run `source` in the reactor interpreter and snapshot the initialised instance as a new
/// module (wasmtime-wizer's instrument + snapshot, with our own WASI for the initialisation).
fn preinitialize(
    engine: &Engine,
    linker: &Linker<Guest>,
    interpreter: &Interpreter,
    mode: Mode,
    source: &str,
    limits: Option<&Limits>,
) -> Result<Vec<u8>, SandboxError> {
    let started = Instant::now();
    tracing::info!("pre-initialising {}", interpreter.reactor().display());
    let wasm = read_guest(&interpreter.reactor())?;
    let mut wizer = wasmtime_wizer::Wizer::new();
    wizer.init_func("wizer.initialize");
    let (cx, instrumented) = wizer.instrument(&wasm)?;
    let module = Module::new(engine, &instrumented)?;
    let stderr = Capture::new(64 << 10, false);
    let watch = Watch::new(limits.map(|l| l.cpu), limits.map(|l| l.wall));
    let guest = guest_state(
        interpreter,
        mode,
        GuestIo {
            stdin: source.as_bytes().to_vec(),
            stdout: Capture::new(64 << 10, false),
            stderr: stderr.clone(),
            args: &[],
            env: &[("PYTHONHASHSEED".into(), "0".into())],
            seed: 0,
        },
        limits.map_or(4 << 30, |l| l.memory_bytes),
        watch.clone(),
    )?;
    let mut store = Store::new(engine, guest);
    watched(
        &mut store,
        (mode == Mode::Deterministic).then_some(u64::MAX),
    )?;
    let _restore = watch.restorer();
    let wall = limits.map_or(Duration::MAX, |l| l.wall);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| SandboxError::Wasmtime(wasmtime::Error::msg(e.to_string())))?;
    let snapshot = rt.block_on(async {
        let instance = linker.instantiate_async(&mut store, &module).await?;
        watch_memory(&mut store, &instance);
        if let Ok(init) = instance.get_typed_func::<(), ()>(&mut store, "_initialize") {
            init.call_async(&mut store, ()).await?;
        }
        let init = instance.get_typed_func::<(), ()>(&mut store, "wizer.initialize")?;
        let ran = tokio::time::timeout(wall, init.call_async(&mut store, ())).await;
        // A run the watchdog stopped failed, even if it ended as it was stopped: its memory
        // may be inaccessible, and the snapshot below reads it.
        let failed = match (ran, watch.stopped()) {
            (Ok(Ok(())), None) => None,
            (Err(_), _) | (_, Some(Stop::Wall)) => {
                Some(format!("wall-time limit of {:.1} s", wall.as_secs_f64()))
            }
            (_, Some(Stop::Cpu)) => Some(format!(
                "CPU-time limit of {:.1} s",
                limits.map_or(0.0, |l| l.cpu.as_secs_f64())
            )),
            (Ok(Err(e)), None) => Some(match classify(&e, store.data().memory.exceeded) {
                Outcome::MemoryLimit => {
                    format!("memory limit of {} MiB", store.data().memory.max >> 20)
                }
                Outcome::TimeLimit => format!(
                    "CPU-time limit of {:.1} s",
                    limits.map_or(0.0, |l| l.cpu.as_secs_f64())
                ),
                // The source raised: the interpreter aborts, and its traceback says why.
                Outcome::Trapped(_) if !stderr.is_empty() => "it raised an exception".into(),
                _ => format!("{e:#}"),
            }),
        };
        if let Some(why) = failed {
            let (err, _) = stderr.take();
            return Err(wasmtime::Error::msg(format!(
                "the pre-initialisation source failed: {why}\n{}",
                String::from_utf8_lossy(&err)
            )));
        }
        let mut state = Snapshotted {
            store: &mut store,
            instance,
        };
        wizer.snapshot(&cx, &mut state).await
    })?;
    tracing::info!(
        "pre-initialised in {:.1} s ({} MB)",
        started.elapsed().as_secs_f64(),
        snapshot.len() >> 20
    );
    Ok(snapshot)
}

/// The instance wasmtime-wizer reads its snapshot from.
struct Snapshotted<'a> {
    store: &'a mut Store<Guest>,
    instance: wasmtime::Instance,
}

impl wasmtime_wizer::InstanceState for Snapshotted<'_> {
    async fn global_get(
        &mut self,
        name: &str,
        _type_hint: wasmtime_wizer::ValType,
    ) -> wasmtime_wizer::SnapshotVal {
        use wasmtime::Val;
        use wasmtime_wizer::SnapshotVal as S;
        let global = self
            .instance
            .get_global(&mut *self.store, name)
            .expect("wizer asks for the globals it exported");
        match global.get(&mut *self.store) {
            Val::I32(x) => S::I32(x),
            Val::I64(x) => S::I64(x),
            Val::F32(x) => S::F32(x),
            Val::F64(x) => S::F64(x),
            Val::V128(x) => S::V128(x.as_u128()),
            other => panic!("a global of unsupported type: {other:?}"),
        }
    }

    async fn memory_contents(&mut self, name: &str, contents: impl FnOnce(&[u8]) + Send) {
        let memory = self
            .instance
            .get_memory(&mut *self.store, name)
            .expect("wizer asks for the memories it exported");
        contents(memory.data(&*self.store))
    }
}

/// An interpreter binary, refused if it uses bulk-memory instructions: wasmtime runs them as
/// host code that touches the guest's memory, and the watchdog stops a guest by revoking
/// access to that memory (`watchdog.rs`). (What does not parse is left to wasmtime to report.)
fn read_guest(path: &Path) -> Result<Vec<u8>, SandboxError> {
    use wasmtime::wasmparser::{Operator, Parser, Payload};
    let wasm = read(path)?;
    let refuse = |instruction| {
        Err(SandboxError::Interpreter(InterpreterError::BulkMemory {
            path: path.to_path_buf(),
            instruction,
        }))
    };
    for payload in Parser::new(0).parse_all(&wasm) {
        let Ok(Payload::CodeSectionEntry(body)) = payload else {
            continue;
        };
        let Ok(mut ops) = body.get_operators_reader() else {
            continue;
        };
        while !ops.eof() {
            match ops.read() {
                Ok(Operator::MemoryCopy { .. }) => return refuse("memory.copy"),
                Ok(Operator::MemoryFill { .. }) => return refuse("memory.fill"),
                Ok(Operator::MemoryInit { .. }) => return refuse("memory.init"),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    Ok(wasm)
}

fn read(path: &Path) -> Result<Vec<u8>, SandboxError> {
    std::fs::read(path).map_err(|e| {
        SandboxError::Interpreter(InterpreterError::Io {
            path: path.to_path_buf(),
            source: e,
        })
    })
}

pub(crate) fn classify(e: &wasmtime::Error, memory_exceeded: bool) -> Outcome {
    if let Some(exit) = e.downcast_ref::<I32Exit>() {
        return Outcome::Exited(exit.0);
    }
    if memory_exceeded {
        return Outcome::MemoryLimit;
    }
    if let Some(wasmtime::component::ResourceTableError::Full) = e.downcast_ref() {
        return Outcome::Trapped(format!(
            "too many open files or streams (at most {MAX_GUEST_RESOURCES} per run)"
        ));
    }
    if let Some(trap) = e.downcast_ref::<Trap>() {
        return match trap {
            Trap::Interrupt | Trap::OutOfFuel => Outcome::TimeLimit,
            other => Outcome::Trapped(other.to_string()),
        };
    }
    Outcome::Trapped(format!("{e:#}"))
}

/// WASI preview 1, with a `poll_oneoff` of our own.
///
/// File access runs on the calling thread (`allow_blocking_current_thread`: start-up makes
/// hundreds of small reads, 5× faster than a hop to tokio's blocking pool each). With that
/// setting wasmtime-wasi answers a poll on a single relative timer — `select()` with a
/// timeout, `nanosleep` — with `std::thread::sleep`, which no timeout can interrupt. Our
/// `poll_oneoff` sleeps on tokio instead, so the wall-time limit stops a sleeping guest. It
/// serves what sleeping needs — one clock subscription, relative or absolute, on the guest's
/// own clocks — and answers every other poll (waiting on file descriptors) with `ENOTSUP`:
/// graded programs read stdin and write stdout, they do not multiplex.
fn guest_linker(engine: &Engine) -> wasmtime::Result<Linker<Guest>> {
    const ENOTSUP: i32 = 58;
    let mut linker: Linker<Guest> = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, |g: &mut Guest| &mut g.wasi)?;
    linker.allow_shadowing(true);
    linker.func_wrap_async(
        "wasi_snapshot_preview1",
        "poll_oneoff",
        |mut caller: wasmtime::Caller<'_, Guest>,
         (subs, events, nsubs, nevents): (i32, i32, i32, i32)| {
            Box::new(async move {
                let Some(timer) = single_timer(&mut caller, subs, nsubs)? else {
                    return Ok(ENOTSUP);
                };
                charge_sleep(&mut caller, timer.sleep).await?;
                // event: userdata u64, error u16 = 0, type u8 = clock (0), then zeros.
                let mut event = [0u8; 32];
                event[..8].copy_from_slice(&timer.userdata);
                let memory = guest_memory(&mut caller)?;
                memory.write(&mut caller, events as u32 as usize, &event)?;
                memory.write(&mut caller, nevents as u32 as usize, &1u32.to_le_bytes())?;
                Ok(0i32)
            })
        },
    )?;
    Ok(linker)
}

/// Fuel a sleep costs in deterministic mode, per second asked for: about what the interpreter
/// burns in a second of CPU time here (a test's default budget of 4 × 10¹⁰ is its 24 s).
pub(crate) const SLEEP_FUEL_PER_S: u64 = 1_000_000_000;
/// The least a sleep costs in deterministic mode, in fuel (a millisecond's worth): a loop of
/// `time.sleep(0)` runs out of fuel as a busy loop does.
pub(crate) const MIN_SLEEP_FUEL: u64 = SLEEP_FUEL_PER_S / 1000;

/// The fuel a sleep of `d` costs in deterministic mode.
pub(crate) fn sleep_fuel(d: Duration) -> u64 {
    let asked = d.as_nanos().saturating_mul(u128::from(SLEEP_FUEL_PER_S)) / 1_000_000_000;
    u64::try_from(asked).unwrap_or(u64::MAX).max(MIN_SLEEP_FUEL)
}

/// A guest's sleep, spent from its limits. Fast mode: it sleeps (on tokio, so the wall-time
/// limit can stop it) and is charged the time it took, at least what it asked for (every
/// sleep lasts a while, a zero one too: charged only what it asked, a loop of them would
/// run on past its limit); one past what is left sleeps out the rest and ends the run
/// (`time_limit`). Deterministic mode: the guest's clocks never move, so it does not sleep at
/// all; it is charged fuel for what it asked ([`sleep_fuel`]), so the same program spends
/// the same fuel and gets the same verdict every time. Either way the time counts against a
/// time limit the run has (the pre-initialisation's).
async fn charge_sleep(
    caller: &mut wasmtime::Caller<'_, Guest>,
    asked: Duration,
) -> wasmtime::Result<()> {
    let left = caller.data().watch.left();
    let charged = if caller.data().mode == Mode::Deterministic {
        let cost = sleep_fuel(asked);
        let fuel = caller.get_fuel()?;
        if cost > fuel {
            caller.set_fuel(0)?;
            return Err(Trap::OutOfFuel.into());
        }
        caller.set_fuel(fuel - cost)?;
        asked
    } else {
        let sleep = left.map_or(asked, |left| asked.min(left));
        let started = Instant::now();
        tokio::time::sleep(sleep).await;
        started.elapsed().max(sleep)
    };
    caller.data().watch.slept(charged);
    if left.is_some_and(|left| charged >= left) {
        return Err(Trap::Interrupt.into());
    }
    Ok(())
}

struct Timer {
    userdata: [u8; 8],
    sleep: Duration,
}

/// A poll on exactly one clock subscription (WASI p1 layout: 48-byte subscription, tag at 8,
/// clock id at 16, timeout at 24, flags at 40; flag 1 = absolute time).
fn single_timer(
    caller: &mut wasmtime::Caller<'_, Guest>,
    subs: i32,
    nsubs: i32,
) -> wasmtime::Result<Option<Timer>> {
    if nsubs != 1 {
        return Ok(None);
    }
    let memory = guest_memory(caller)?;
    let mut sub = [0u8; 48];
    memory.read(&*caller, subs as u32 as usize, &mut sub)?;
    if sub[8] != 0 {
        return Ok(None);
    }
    let clock_id = u32::from_le_bytes(sub[16..20].try_into().expect("4 bytes"));
    let timeout = u64::from_le_bytes(sub[24..32].try_into().expect("8 bytes"));
    let absolute = u16::from_le_bytes([sub[40], sub[41]]) & 1 != 0;
    let sleep = if absolute {
        let clock = caller.data().clock;
        let now = match clock_id {
            0 => u64::try_from(clock.wall().as_nanos()).unwrap_or(u64::MAX),
            _ => clock.monotonic_ns(),
        };
        timeout.saturating_sub(now)
    } else {
        timeout
    };
    Ok(Some(Timer {
        userdata: sub[..8].try_into().expect("8 bytes"),
        sleep: Duration::from_nanos(sleep),
    }))
}

fn guest_memory(caller: &mut wasmtime::Caller<'_, Guest>) -> wasmtime::Result<wasmtime::Memory> {
    caller
        .get_export("memory")
        .and_then(|e| e.into_memory())
        .ok_or_else(|| wasmtime::Error::msg("the guest exports no memory"))
}

/// Load the compiled module `key` from the cache, or produce its wasm, compile it and store
/// it. The file name holds the key (which names the interpreter's sha256 and whatever else
/// shapes the module), wasmtime's version and a hash of every engine setting that changes the
/// machine code; the file's own sha256 is checked before it is loaded.
pub(crate) fn load_or_compile<A: Artifact>(
    engine: &Engine,
    key: &str,
    cache_dir: &Path,
    wasm: impl FnOnce() -> Result<Vec<u8>, SandboxError>,
) -> Result<A, SandboxError> {
    let mut settings = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut settings);
    let key = format!(
        "{key}-wasmtime{}-{:016x}",
        wasmtime_version(),
        settings.finish()
    );
    let file = cache_dir.join(format!("{key}.cwasm"));
    let sum = cache_dir.join(format!("{key}.sha256"));
    let cache_err = |path: &Path, source: std::io::Error| SandboxError::Cache {
        path: path.to_path_buf(),
        source,
    };
    if let (Ok(bytes), Ok(expected)) = (std::fs::read(&file), std::fs::read_to_string(&sum))
        && hex(&Sha256::digest(&bytes)) == expected.trim()
    {
        drop(bytes);
        // SAFETY: the file was written by `precompile_module` of an engine with these exact
        // settings (the key says so) and its sha256 matches the one written beside it, so it
        // is the artefact wasmtime produced, not arbitrary bytes.
        #[allow(unsafe_code)]
        let module = unsafe { A::deserialize_file(engine, &file) };
        match module {
            Ok(m) => return Ok(m),
            Err(e) => tracing::warn!("{}: {e:#}; recompiling", file.display()),
        }
    }
    let wasm = wasm()?;
    let started = Instant::now();
    tracing::info!("compiling {key} (once; cached in {})", cache_dir.display());
    let compiled = A::precompile(engine, &wasm)?;
    std::fs::create_dir_all(cache_dir).map_err(|e| cache_err(cache_dir, e))?;
    let tmp = tempfile::NamedTempFile::new_in(cache_dir).map_err(|e| cache_err(cache_dir, e))?;
    std::fs::write(tmp.path(), &compiled).map_err(|e| cache_err(tmp.path(), e))?;
    tmp.persist(&file).map_err(|e| cache_err(&file, e.error))?;
    std::fs::write(&sum, hex(&Sha256::digest(&compiled))).map_err(|e| cache_err(&sum, e))?;
    tracing::info!("compiled in {:.1} s", started.elapsed().as_secs_f64());
    // SAFETY: as above; we wrote this file from `precompile_module` a moment ago.
    #[allow(unsafe_code)]
    let module = unsafe { A::deserialize_file(engine, &file) }?;
    Ok(module)
}

/// What [`load_or_compile`] caches: a core module or a component.
pub(crate) trait Artifact: Sized {
    fn precompile(engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Vec<u8>>;
    /// # Safety
    /// `path` must hold what [`Artifact::precompile`] wrote for an engine of these settings.
    #[allow(unsafe_code)]
    unsafe fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Self>;
}

impl Artifact for Module {
    fn precompile(engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Vec<u8>> {
        engine.precompile_module(wasm)
    }
    #[allow(unsafe_code)]
    unsafe fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Self> {
        // SAFETY: the caller's promise.
        unsafe { Module::deserialize_file(engine, path) }
    }
}

impl Artifact for wasmtime::component::Component {
    fn precompile(engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Vec<u8>> {
        engine.precompile_component(wasm)
    }
    #[allow(unsafe_code)]
    unsafe fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Self> {
        // SAFETY: the caller's promise.
        unsafe { wasmtime::component::Component::deserialize_file(engine, path) }
    }
}

/// Advances the engine's epoch every tick while the sandbox lives.
pub(crate) fn spawn_epoch_ticker(engine: Engine, alive: Weak<()>) {
    std::thread::Builder::new()
        .name("areal-sandbox-epoch".into())
        .spawn(move || {
            while alive.strong_count() > 0 {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        })
        .expect("spawning the epoch thread");
}

/// CPU time a guest has used: the CPU time of the thread running it, summed over the epoch
/// ticks at which it was seen running. Unlike wall time it does not grow while other work
/// has the cores, so a verdict does not depend on how busy the machine is. A guest that moves
/// to another thread (a multi-threaded runtime) is re-based there; at most one tick is lost.
#[derive(Default)]
struct CpuMeter {
    last: Option<(std::thread::ThreadId, Duration)>,
    used: Duration,
}

impl CpuMeter {
    fn used(&mut self) -> Duration {
        let now = thread_cpu_time();
        let thread = std::thread::current().id();
        if let Some((last_thread, last)) = self.last
            && last_thread == thread
        {
            self.used += now.saturating_sub(last);
        }
        self.last = Some((thread, now));
        self.used
    }
}

/// The calling thread's CPU time.
#[cfg(unix)]
fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Without a thread CPU clock, wall time since the first call stands in for it.
#[cfg(not(unix))]
fn thread_cpu_time() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// The guest's clocks. Fast mode: real time, monotonic from the run's start. Deterministic
/// mode: a clock that never moves (2024-01-01T00:00:00Z, monotonic 0).
#[derive(Clone, Copy)]
pub(crate) struct GuestClock {
    start: Option<Instant>,
}

impl GuestClock {
    pub(crate) fn new(mode: Mode) -> Self {
        Self {
            start: (mode == Mode::Fast).then(Instant::now),
        }
    }

    fn monotonic_ns(&self) -> u64 {
        self.start.map_or(0, |t| {
            u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
        })
    }

    fn wall(&self) -> Duration {
        match self.start {
            Some(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
            None => Duration::from_secs(1_704_067_200),
        }
    }
}

impl wasmtime_wasi::HostWallClock for GuestClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        self.wall()
    }
}

impl wasmtime_wasi::HostMonotonicClock for GuestClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        self.monotonic_ns()
    }
}

/// splitmix64: a seeded random source for deterministic mode.
pub(crate) struct SeededRandom(u64);

impl SeededRandom {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }
}

impl rand::TryRng for SeededRandom {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Ok(z ^ (z >> 31))
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dest.chunks_mut(8) {
            let v = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(module (memory 1) (func ...))` with the given body's instructions.
    fn module(code: &[u8]) -> Vec<u8> {
        let mut body = vec![0x00]; // no locals
        body.extend_from_slice(code);
        body.push(0x0b);
        let mut section = vec![0x01, u8::try_from(body.len()).unwrap()];
        section.extend(body);
        let mut wasm = b"\0asm\x01\0\0\0".to_vec();
        wasm.extend([0x01, 0x04, 0x01, 0x60, 0x00, 0x00]); // type () -> ()
        wasm.extend([0x03, 0x02, 0x01, 0x00]); // one function of that type
        wasm.extend([0x05, 0x03, 0x01, 0x00, 0x01]); // memory 1
        wasm.extend([0x0a, u8::try_from(section.len()).unwrap()]);
        wasm.extend(section);
        wasm
    }

    #[test]
    fn interpreters_with_bulk_memory_instructions_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("guest.wasm");
        // i32.const 0 ×3; memory.fill 0
        std::fs::write(
            &path,
            module(&[0x41, 0, 0x41, 0, 0x41, 0, 0xfc, 0x0b, 0x00]),
        )
        .unwrap();
        let err = read_guest(&path).unwrap_err().to_string();
        assert!(
            err.contains("memory.fill") && err.contains("make python-wasi"),
            "{err}"
        );
        // i32.const 0; i32.load; drop
        std::fs::write(&path, module(&[0x41, 0, 0x28, 0x02, 0x00, 0x1a])).unwrap();
        assert!(read_guest(&path).is_ok());
    }
}
