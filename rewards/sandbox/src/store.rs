//! A guest interpreter's store: its WASI context (stdio, arguments, environment, the read-only
//! standard library, the clocks and random source of the mode), its memory cap and the watch of
//! its time.

use wasmtime::Store;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use crate::capture::{Capture, Feed};
use crate::determinism::{GuestClock, SeededRandom};
use crate::guest::Interpreter;
use crate::meter::MemoryCap;
use crate::run::{MAX_GUEST_RESOURCES, Mode, SandboxError};
use crate::watchdog::Watch;

/// The guest path of the read-only standard library (the interpreter's compiled-in prefix).
const GUEST_STDLIB: &str = "/usr/local/lib/python3.11";
/// A guest interpreter's store state: its WASI context, clocks, mode, memory cap and the
/// watch of its time.
pub(crate) struct Guest {
    pub(crate) wasi: WasiP1Ctx,
    pub(crate) clock: GuestClock,
    pub(crate) mode: Mode,
    pub(crate) memory: MemoryCap,
    pub(crate) watch: Watch,
}

/// What a fresh guest is given: its stdio, arguments, environment and random seed.
pub(crate) struct GuestIo<'a> {
    pub(crate) stdin: Feed,
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
    wasi.stdin(io.stdin)
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
