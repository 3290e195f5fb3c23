//! Pre-initialisation: Python source run once in the reactor interpreter, and the initialised
//! instance snapshotted (wasmtime-wizer) as the module every run starts from.

use std::time::{Duration, Instant};

use wasmtime::{Engine, Linker, Module, Store};

use crate::capture::{Capture, Feed};
use crate::guest::{Interpreter, read_guest};
use crate::run::{Limits, Mode, Outcome, SandboxError, classify};
use crate::store::{Guest, GuestIo, guest_state, watch_memory, watched};
use crate::watchdog::{Stop, Watch};

/// Run `source` in the reactor interpreter and snapshot the initialised instance as a new
/// module (wasmtime-wizer's instrument + snapshot, with our own WASI for the initialisation).
pub(crate) fn preinitialize(
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
            stdin: Feed::new(source.as_bytes().to_vec()),
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
    // why the source failed, when it did (a typed error rather than a wasmtime one)
    let mut source_failed: Option<String> = None;
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
            let message = format!("{why}\n{}", String::from_utf8_lossy(&err));
            source_failed = Some(message.clone());
            return Err(wasmtime::Error::msg(message));
        }
        let mut state = Snapshotted {
            store: &mut store,
            instance,
        };
        wizer.snapshot(&cx, &mut state).await
    });
    let snapshot = match (snapshot, source_failed) {
        (Err(_), Some(why)) => return Err(SandboxError::Preinit(why)),
        (snapshot, _) => snapshot?,
    };
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
