//! The reward sandbox: untrusted Python, run by a WASI CPython inside wasmtime.
//!
//! - One [`Sandbox`] holds one wasmtime `Engine` and the interpreter's module, compiled once
//!   and cached as a precompiled file keyed by wasmtime's version, the engine's settings and the
//!   interpreter's sha256. Build it once per process and share it (it is `Send + Sync`).
//! - Every [`Sandbox::run`] gets a fresh `Store`: stdin from memory, stdout and stderr captured
//!   up to a byte cap, memory capped by a resource limiter, CPU time (the guest thread's) and
//!   wall time bounded by a watchdog thread that revokes access to the guest's memory when
//!   its time is up (no checks compiled into the interpreter: they cost it ~20 % of its
//!   speed), a tokio timeout around the async call for a guest that sleeps in a host call,
//!   and optionally a fuel budget.
//! - The guest sees no network, only the environment variables the caller passes (never the
//!   host's), and no host files except the interpreter's standard library, mounted read-only.
//! - With [`Settings::preinit`], Python source runs once in the interpreter's reactor build
//!   and the instance is snapshotted (wasmtime-wizer): every run then starts from an
//!   initialised interpreter, in about a millisecond.
//! - [`Session`] keeps one pre-initialised interpreter between calls (an agent's `python`
//!   tool: what a call defines is there for the next), each call under limits of its own.
//! - [`Pool`] runs many sandboxes on parallel threads.
//! - [`ComponentHost`] runs reward plugins compiled to WebAssembly components
//!   (`areal:reward`, `sdk/guest/wit`) in fresh instances under the same limits.
//!
//! DESIGN.md §5 has the facts this was built on; `docs/sandbox.md` the threat model.

mod blocking;
mod capture;
mod component;
mod determinism;
mod guest;
mod meter;
mod module_cache;
mod pool;
mod preinit;
mod run;
mod sandbox;
mod session;
mod sleep;
mod store;
mod tool;
mod watchdog;

pub use component::{
    CallOutcome, CallReport, ComponentHost, Grants, GuestVerdict, MAX_REPLY_BYTES, Sample, Scored,
    component_cache_dir, module_cache_dir,
};
pub use guest::{INTERPRETER_ENV, Interpreter, InterpreterError};
pub use meter::{MemoryBudget, SESSION_MEMORY_ENV};
pub use pool::Pool;
pub use run::{
    Limits, MAX_CONCURRENT_RUNS, MAX_GUEST_RESOURCES, Mode, Outcome, Run, RunReport, SandboxError,
    Settings, wasmtime_version,
};
pub use sandbox::Sandbox;
pub use session::{CellReport, PYTHON_CELLS, Session};
pub use tool::{
    ToolCallOutcome, ToolCallReport, ToolHost, ToolInstance, describe as describe_stop,
};
