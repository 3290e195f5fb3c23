//! Reward plugins compiled to WebAssembly components (`wit/reward.wit` of `sdk/guest`,
//! package `areal:reward`), run in fresh instances under the sandbox's limits.
//!
//! One [`ComponentHost`] per component and mode: the component is compiled once and cached
//! beside the interpreter's modules (keyed by its sha256, wasmtime's version and the engine's
//! settings). Each [`ComponentHost::call`] instantiates it in a fresh store, calls `configure`
//! with the plugin's options and `score` with the sample, and drops the store: nothing carries
//! over from one sample to the next. The guest gets WASI preview 2 with no arguments, no
//! environment, no files and no network, unless [`Grants`] name environment variables or
//! read-only folders; memory, CPU time (or fuel), wall time and output are capped as for
//! Python guests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, InstancePre, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::blocking::block_on;
use crate::capture::Capture;
use crate::determinism::{GuestClock, SeededRandom};
use crate::guest::hex;
use crate::meter::{MemoryCap, Metered, TimeBudget, meter, spawn_epoch_ticker};
use crate::module_cache::load_or_compile;
use crate::run::{Limits, Mode, Outcome, SandboxError, classify, wasmtime_version};

#[allow(missing_docs, reason = "generated code")]
mod bindings {
    wasmtime::component::bindgen!({
        world: "reward",
        path: "../../sdk/guest/wit",
        exports: { default: async },
    });
}

pub use bindings::areal::reward::types::{Outcome as Scored, Sample, Verdict as GuestVerdict};

/// Where compiled components are cached: `$AREAL_COMPONENT_CACHE`, else
/// `~/.cache/areal-rs/components`, else the temporary folder's `areal-rs-components`.
pub fn component_cache_dir() -> PathBuf {
    user_cache_dir("AREAL_COMPONENT_CACHE", "components")
}

/// Where the interpreter's compiled modules and snapshots are cached: `$AREAL_MODULE_CACHE`,
/// else `~/.cache/areal-rs/modules`, else the temporary folder's `areal-rs-modules`. Never
/// beside the interpreter: it may be installed where its user cannot write (read-only,
/// shared by users), and what is loaded as machine code must come from the user's own
/// folder.
pub fn module_cache_dir() -> PathBuf {
    user_cache_dir("AREAL_MODULE_CACHE", "modules")
}

/// `$variable`, else `~/.cache/areal-rs/<name>`, else the temporary folder's
/// `areal-rs-<name>`.
fn user_cache_dir(variable: &str, name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os(variable).filter(|d| !d.is_empty()) {
        return dir.into();
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Path::new(&home).join(".cache/areal-rs").join(name),
        None => std::env::temp_dir().join(format!("areal-rs-{name}")),
    }
}

/// Instances of components that may be alive at once in one host.
const MAX_CONCURRENT_CALLS: u32 = 64;
/// The most a guest may say back (an error message or the details), in bytes.
pub const MAX_REPLY_BYTES: usize = 1 << 20;

/// What a component may see besides its input: nothing by default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Grants {
    /// Environment variables, name and value.
    pub env: Vec<(String, String)>,
    /// Host folders mounted read-only: (host path, guest path).
    pub dirs: Vec<(PathBuf, String)>,
}

/// How a call ended.
#[derive(Clone, Debug)]
pub enum CallOutcome {
    /// `configure` and `score` returned: the score.
    Scored(Scored),
    /// `configure` returned and there was no sample to score (a check of the options).
    Configured,
    /// The guest returned an error (from `configure` or `score`): its message.
    Refused(String),
    /// The guest was stopped or trapped ([`Outcome::TimeLimit`], [`Outcome::MemoryLimit`],
    /// [`Outcome::OutputLimit`], [`Outcome::Trapped`]).
    Stopped(Outcome),
}

/// A call's result with what it cost.
#[derive(Clone, Debug)]
pub struct CallReport {
    /// How it ended.
    pub outcome: CallOutcome,
    /// What the guest printed on stderr (at most the cap).
    pub stderr: Vec<u8>,
    /// Wall time of the whole call, instantiation included.
    pub wall: Duration,
    /// Fuel spent (deterministic mode).
    pub fuel: Option<u64>,
    /// Peak linear memory, in bytes.
    pub peak_memory: usize,
}

pub(crate) struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) memory: MemoryCap,
    pub(crate) time: TimeBudget,
}

impl State {
    /// A guest's state: WASI with `grants` only (no network), the clocks and randomness of
    /// `mode` (seeded by `seed` in deterministic mode), output to `stdout` and `stderr`, and
    /// `limits`' memory and time.
    pub(crate) fn new(
        grants: &Grants,
        mode: Mode,
        limits: &Limits,
        seed: u64,
        stdout: &Capture,
        stderr: &Capture,
    ) -> Result<Self, SandboxError> {
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(stdout.clone())
            .stderr(stderr.clone())
            .envs(&grants.env)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        for (host, guest) in &grants.dirs {
            wasi.preopened_dir(host, guest, FsPerms::ReadOnly)?;
        }
        let clock = GuestClock::new(mode);
        wasi.wall_clock(clock).monotonic_clock(clock);
        if mode == Mode::Deterministic {
            wasi.secure_random(SeededRandom::new(seed))
                .insecure_random(SeededRandom::new(seed ^ 0x9e37_79b9_7f4a_7c15))
                .insecure_random_seed(u128::from(seed));
        }
        let mut table = ResourceTable::new();
        table.set_max_capacity(crate::MAX_GUEST_RESOURCES);
        Ok(State {
            wasi: wasi.build(),
            table,
            memory: MemoryCap::new(limits.memory_bytes),
            time: TimeBudget::new((mode == Mode::Fast).then_some(limits.cpu)),
        })
    }
}

impl Metered for State {
    fn memory(&mut self) -> &mut MemoryCap {
        &mut self.memory
    }
    fn time(&mut self) -> &mut TimeBudget {
        &mut self.time
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A reward component, compiled, ready to be instantiated per call.
pub struct ComponentHost {
    engine: Engine,
    pre: bindings::RewardPre<State>,
    mode: Mode,
    sha256: String,
    path: PathBuf,
    grants: Grants,
    ticker: Arc<()>,
}

impl std::fmt::Debug for ComponentHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComponentHost")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl ComponentHost {
    /// Load the component at `path` (compiled once and cached in `cache_dir`), check that it
    /// implements `areal:reward`, and get it ready for calls in `mode` with `grants`.
    pub fn load(
        path: &Path,
        mode: Mode,
        cache_dir: &Path,
        grants: Grants,
    ) -> Result<Self, SandboxError> {
        let linked = link(path, mode, cache_dir, &grants, true)?;
        let pre = bindings::RewardPre::new(linked.pre).map_err(not_a_component(path))?;
        let Linked {
            engine,
            sha256,
            ticker,
            ..
        } = linked;
        Ok(Self {
            engine,
            pre,
            mode,
            sha256,
            path: path.to_path_buf(),
            grants,
            ticker,
        })
    }

    /// The component's sha256 (hex), named in every reward's provenance.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metering mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// What runs, for provenance: the component's sha256 and wasmtime's version.
    pub fn version(&self) -> String {
        format!(
            "component sha256 {}; wasmtime {}",
            self.sha256,
            wasmtime_version()
        )
    }

    /// [`ComponentHost::call`] on the current thread, on a tokio runtime of the thread's own.
    pub fn call_blocking(
        &self,
        options: &str,
        sample: Option<&Sample>,
        limits: &Limits,
        seed: u64,
    ) -> Result<CallReport, SandboxError> {
        block_on(self.call(options, sample, limits, seed))
    }

    /// In a fresh instance: `configure(options)`, then `score(sample)` unless `sample` is
    /// `None` (a check of the options). Errors are the host's; whatever the guest does is a
    /// [`CallOutcome`].
    pub async fn call(
        &self,
        options: &str,
        sample: Option<&Sample>,
        limits: &Limits,
        seed: u64,
    ) -> Result<CallReport, SandboxError> {
        let _alive = &self.ticker;
        let started = Instant::now();
        let (mut store, stdout, stderr) =
            metered_store(&self.engine, &self.grants, self.mode, limits, seed)?;
        let call = async {
            let reward = self.pre.instantiate_async(&mut store).await?;
            if let Err(message) = reward.call_configure(&mut store, options).await? {
                return Ok(CallOutcome::Refused(message));
            }
            let Some(sample) = sample else {
                return Ok(CallOutcome::Configured);
            };
            Ok::<_, wasmtime::Error>(match reward.call_score(&mut store, sample).await? {
                Ok(scored) => CallOutcome::Scored(scored),
                Err(message) => CallOutcome::Refused(message),
            })
        };
        let outcome = match tokio::time::timeout(limits.wall, call).await {
            Err(_elapsed) => CallOutcome::Stopped(Outcome::TimeLimit),
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => match classify(&e, store.data().memory.exceeded) {
                Outcome::Exited(_) => CallOutcome::Stopped(Outcome::Trapped(format!(
                    "the component exited instead of returning: {e:#}"
                ))),
                other => CallOutcome::Stopped(other),
            },
        };
        let (_, stdout_overflowed) = stdout.take();
        let outcome = match outcome {
            CallOutcome::Stopped(Outcome::Trapped(_)) if stdout_overflowed => {
                CallOutcome::Stopped(Outcome::OutputLimit)
            }
            other => other,
        };
        let fuel = (self.mode == Mode::Deterministic)
            .then(|| store.get_fuel().ok().map(|left| limits.fuel - left))
            .flatten();
        Ok(CallReport {
            outcome,
            stderr: stderr.take().0,
            wall: started.elapsed(),
            fuel,
            peak_memory: store.data().memory.peak,
        })
    }
}

/// A component compiled and linked against WASI, for a world's bindings to type (`XPre::new`),
/// with the epoch ticker that meters its calls while it lives.
pub(crate) struct Linked {
    pub(crate) engine: Engine,
    pub(crate) pre: InstancePre<State>,
    pub(crate) sha256: String,
    pub(crate) ticker: Arc<()>,
}

/// An error of the component at `path`: what wasmtime said of it.
pub(crate) fn not_a_component(path: &Path) -> impl Fn(wasmtime::Error) -> SandboxError + '_ {
    move |e| SandboxError::Component {
        path: path.to_path_buf(),
        message: format!("{e:#}"),
    }
}

/// The component at `path`, compiled on an engine for `mode` (or read from `cache_dir` where
/// it was compiled before), its folders in `grants` checked, linked against WASI. With
/// `pooled`, up to [`MAX_CONCURRENT_CALLS`] instances from a pool (fast to make, for a fresh
/// instance per call); without, instances allocated as they come (as many as live sessions
/// need).
pub(crate) fn link(
    path: &Path,
    mode: Mode,
    cache_dir: &Path,
    grants: &Grants,
    pooled: bool,
) -> Result<Linked, SandboxError> {
    let bytes = std::fs::read(path).map_err(|source| SandboxError::Component {
        path: path.to_path_buf(),
        message: format!("cannot be read: {source}"),
    })?;
    let sha256 = hex(&Sha256::digest(&bytes));
    for (host, _) in &grants.dirs {
        if !host.is_dir() {
            return Err(SandboxError::Component {
                path: path.to_path_buf(),
                message: format!("the folder granted, {}, is not a folder", host.display()),
            });
        }
    }
    let (engine, component) = compile(path, &bytes, &sha256, mode, cache_dir, pooled)?;
    let mut linker: Linker<State> = Linker::new(&engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    let pre = linker
        .instantiate_pre(&component)
        .map_err(not_a_component(path))?;
    let ticker = Arc::new(());
    spawn_epoch_ticker(engine.clone(), Arc::downgrade(&ticker));
    Ok(Linked {
        engine,
        pre,
        sha256,
        ticker,
    })
}

/// A store for one instance on `engine`: the guest's state (`State::new`) under its meters
/// (memory, and fuel in deterministic mode), with the captures of its stdout and stderr.
pub(crate) fn metered_store(
    engine: &Engine,
    grants: &Grants,
    mode: Mode,
    limits: &Limits,
    seed: u64,
) -> Result<(Store<State>, Capture, Capture), SandboxError> {
    let stdout = Capture::new(limits.stdout_bytes, true);
    let stderr = Capture::new(limits.stderr_bytes, false);
    let state = State::new(grants, mode, limits, seed, &stdout, &stderr)?;
    let mut store = Store::new(engine, state);
    meter(
        &mut store,
        (mode == Mode::Deterministic).then_some(limits.fuel),
    )?;
    Ok((store, stdout, stderr))
}

/// The engine components run on in `mode` (pooled or not, see [`link`]), and the component of
/// `bytes` (at `path`, of `sha256`) compiled on it, or read from `cache_dir`.
fn compile(
    path: &Path,
    bytes: &[u8],
    sha256: &str,
    mode: Mode,
    cache_dir: &Path,
    pooled: bool,
) -> Result<(Engine, Component), SandboxError> {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .consume_fuel(mode == Mode::Deterministic)
        .max_wasm_stack(8 << 20)
        .async_stack_size(16 << 20)
        .cranelift_opt_level(wasmtime::OptLevel::Speed)
        .parallel_compilation(true);
    let mut pool = wasmtime::PoolingAllocationConfig::new();
    pool.total_component_instances(MAX_CONCURRENT_CALLS)
        .total_core_instances(MAX_CONCURRENT_CALLS * 8)
        .total_memories(MAX_CONCURRENT_CALLS * 2)
        .total_tables(MAX_CONCURRENT_CALLS * 4)
        .total_stacks(MAX_CONCURRENT_CALLS)
        .max_memories_per_component(4)
        .max_tables_per_component(8)
        .max_core_instances_per_component(16)
        .max_memory_size(1 << 32);
    if pooled {
        config.allocation_strategy(pool);
    }
    let engine = Engine::new(&config)?;
    let key = format!("component-{}-{}", &sha256[..16], mode.as_str());
    let component: Component = load_or_compile(&engine, &key, cache_dir, || {
        if !is_component(bytes) {
            return Err(SandboxError::Component {
                path: path.to_path_buf(),
                message: "is not a WebAssembly component (a core module? build it for \
                          `wasm32-wasip2`, or wrap it with `wasm-tools component new`)"
                    .into(),
            });
        }
        Ok(bytes.to_vec())
    })
    .map_err(|e| match e {
        SandboxError::Wasmtime(e) => not_a_component(path)(e),
        other => other,
    })?;
    Ok((engine, component))
}

/// Whether `bytes` are a component rather than a core module (the layer field of the
/// preamble: `\0asm`, a version, then layer 1 for components).
fn is_component(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && &bytes[..4] == b"\0asm" && bytes[6..8] == [1, 0]
}
