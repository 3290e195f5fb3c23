//! The interpreter's host: one wasmtime engine, the interpreter's compiled (or snapshotted)
//! module, and runs in fresh stores.

use std::path::Path;
use std::time::Instant;

use sha2::{Digest, Sha256};
use wasmtime::{Config, Engine, InstancePre, Store};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use crate::blocking::block_on;
use crate::capture::Capture;
use crate::determinism::{GuestClock, SeededRandom};
use crate::guest::{Interpreter, InterpreterError, hex};
use crate::meter::MemoryCap;
use crate::module_cache::load_or_compile;
use crate::preinit::preinitialize;
use crate::run::{
    MAX_CONCURRENT_RUNS, MAX_GUEST_RESOURCES, Mode, Outcome, Run, RunReport, SandboxError,
    Settings, classify,
};
use crate::sleep::guest_linker;
use crate::watchdog::Watch;

/// The guest path of the read-only standard library (the interpreter's compiled-in prefix).
const GUEST_STDLIB: &str = "/usr/local/lib/python3.11";
/// Wasm stack for the guest's native frames (deep recursion through C needs a lot). It must
/// stay below the async fiber stack.
const MAX_WASM_STACK: usize = 48 << 20;
const ASYNC_STACK: usize = 64 << 20;

/// A guest interpreter's store state: its WASI context, clocks, mode, memory cap and the
/// watch of its time.
pub(crate) struct Guest {
    pub(crate) wasi: WasiP1Ctx,
    pub(crate) clock: GuestClock,
    pub(crate) mode: Mode,
    pub(crate) memory: MemoryCap,
    pub(crate) watch: Watch,
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

/// What a fresh guest is given: its stdio, arguments, environment and random seed.
pub(crate) struct GuestIo<'a> {
    pub(crate) stdin: Vec<u8>,
    pub(crate) stdout: Capture,
    pub(crate) stderr: Capture,
    pub(crate) args: &'a [String],
    pub(crate) env: &'a [(String, String)],
    pub(crate) seed: u64,
}

/// A fresh guest: WASI context (stdio, args, environment, the read-only stdlib mount, clocks
/// and random source of the mode), memory cap, and the watch of its time.
pub(crate) fn guest_state(
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
pub(crate) fn watched(store: &mut Store<Guest>, fuel: Option<u64>) -> wasmtime::Result<()> {
    store.limiter(|g| &mut g.memory);
    if let Some(fuel) = fuel {
        store.set_fuel(fuel)?;
    }
    let watch = store.data().watch.clone();
    store.call_hook(move |_, hook| watch.hook(hook));
    Ok(())
}

/// Tell the run's watchdog where the instance's memory is.
pub(crate) fn watch_memory(store: &mut Store<Guest>, instance: &wasmtime::Instance) {
    if let Some(memory) = instance.get_memory(&mut *store, "memory") {
        let base = memory.data_ptr(&*store);
        store.data().watch.set_memory_base(base);
    }
}

/// An interpreter binary, refused if it uses bulk-memory instructions: wasmtime runs them as
/// host code that touches the guest's memory, and the watchdog stops a guest by revoking
/// access to that memory (`watchdog.rs`). (What does not parse is left to wasmtime to report.)
pub(crate) fn read_guest(path: &Path) -> Result<Vec<u8>, SandboxError> {
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
