//! What a run is given and what it gives back: the metering mode, the settings a sandbox is
//! built from, a run's limits, its outcome and report, and the host's errors.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmtime::Trap;
use wasmtime_wasi::I32Exit;

use crate::guest::InterpreterError;

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
    /// Where compiled modules are cached (default [`module_cache_dir`]).
    ///
    /// [`module_cache_dir`]: crate::module_cache_dir
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
    /// Guest instances alive at once (runs, and sessions: a session keeps its instance
    /// between calls); `None`: [`MAX_CONCURRENT_RUNS`]. Each is a slot of address space
    /// reserved up front, not memory.
    pub instances: Option<u32>,
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
    /// The pre-initialisation source failed (it raised, or ran past a limit): why, then what
    /// it wrote on stderr (its traceback).
    #[error("the pre-initialisation source failed: {0}")]
    Preinit(String),
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

/// How a guest's run ended, from the error its call returned: an exit status, a limit (the
/// memory cap, fuel, an interrupt) or a trap.
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
