//! A session: one pre-initialised interpreter kept alive between calls, so that what one call
//! defines is there for the next (an agent's `python` tool within one episode), and nothing
//! is shared with any other session.
//!
//! Each call feeds the guest's stdin anew and runs `areal_main()` again in the same instance,
//! under limits of its own (CPU time, wall time, fuel), with the memory cap over the whole
//! session. A call the watchdog or the memory cap stops, or that traps, ends the session: the
//! interpreter may have been stopped anywhere, so its state is not trusted again. Output past
//! the cap is cut, and the session goes on.

use std::time::{Duration, Instant};

use wasmtime::{Store, TypedFunc};

use crate::capture::{Capture, Feed};
use crate::meter::MemoryBudget;
use crate::run::{Limits, Mode, Outcome, SandboxError, classify};
use crate::sandbox::Sandbox;
use crate::store::{Guest, GuestIo};
use crate::watchdog::{Restorer, Watch};

/// Python source to pre-initialise a sandbox with for sessions of Python cells: each call's
/// stdin is a cell, run in the session's one namespace; what it prints, then the value of its
/// last line when that is an expression (as a notebook shows it), then the traceback of an
/// exception it raised (its own frames only), come out on stdout. A cell that raised ends
/// with `Exited(2)`, one that did not with `Exited(0)` (`exit()` included). Each cell starts
/// with `sys.stdin`/`stdout`/`stderr` open on descriptors 0–2 whatever the cells before did to
/// them; one that closed a descriptor itself (`os.close`) aborts the interpreter, which ends
/// the session as a trap does. A session's first call reseeds `random` and numpy's global
/// generator, when the pre-initialisation imported them, from the session's random source.
pub const PYTHON_CELLS: &str = r#"
import ast as _ast, os as _os, sys as _sys, traceback as _traceback

_areal_namespace = {"__name__": "__main__", "__builtins__": __builtins__}

class _AreaLCellRaised(Exception):
    pass

# the cell's traceback is on stdout already: the interpreter's own report of the exception
# that tells the host the cell raised (exit status 2) would be noise
_sys.excepthook = lambda *_: None
# line by line, so that what a cell printed before a limit stopped it reaches the host
_sys.stdout.reconfigure(line_buffering=True)
_areal_streams = [_sys.stdin, _sys.stdout, _sys.stderr]

def _areal_stream(fd):
    # a cell may close or replace sys.stdin/stdout/stderr (`exit()` closes stdin before it
    # raises SystemExit): every cell starts with the three open, on the same descriptors
    stream = _areal_streams[fd]
    if stream.closed:
        # stdout line by line, as at the start
        stream = open(fd, "r" if fd == 0 else "w", buffering=1 if fd == 1 else -1,
                      encoding="utf-8", errors="backslashreplace", closefd=False)
        _areal_streams[fd] = stream
    return stream

def _areal_read_cell():
    chunks = []
    while True:
        chunk = _os.read(0, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)

def _areal_descriptors():
    # a cell that closed the descriptors themselves (os.close) leaves an interpreter the host
    # cannot talk to: it ends the session, as a crash does
    try:
        for fd in range(3):
            _os.fstat(fd)
    except BaseException as error:
        _areal_abort(error)

def _areal_abort(error):
    try:
        _os.write(2, f"the cell driver cannot go on: {error!r}\n".encode())
    except BaseException:
        pass
    _os.abort()

_areal_fresh = [True]

def _areal_reseed():
    # the snapshot froze the state of every generator imported while it was taken (by a tool's
    # file, say): a session's first call draws them a seed of its own (the session's random
    # source: its seed in deterministic mode, the system's otherwise)
    random = _sys.modules.get("random")
    if random is not None:
        random.seed(int.from_bytes(_os.urandom(16), "little"))
    numpy = _sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(_os.urandom(4), "little"))

def areal_main():
    if _areal_fresh[0]:
        _areal_fresh[0] = False
        _areal_reseed()
    _areal_descriptors()
    try:
        _sys.stdin, _sys.stdout, _sys.stderr = (_areal_stream(fd) for fd in range(3))
        _sys.__stdin__, _sys.__stdout__, _sys.__stderr__ = _sys.stdin, _sys.stdout, _sys.stderr
        source = _areal_read_cell()
        out = _sys.stdout
    except BaseException as error:
        _areal_abort(error)
    try:
        tree = _ast.parse(source, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], _ast.Expr):
            last = _ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), _areal_namespace)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), _areal_namespace)
            if value is not None:
                print(repr(value), file=_areal_stream(1))
    except SystemExit:
        pass
    except BaseException as error:
        _areal_descriptors()
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
            tb = tb.tb_next
        # the report goes where the cell began writing, whatever it did to sys.stdout since
        _areal_flush(out)
        out = _areal_stream(1)
        _traceback.print_exception(type(error), error, tb, file=out)
        _areal_flush(out)
        raise _AreaLCellRaised() from None
    _areal_descriptors()
    _areal_flush(out)
    _areal_flush(_sys.stdout)

def _areal_flush(stream):
    try:
        stream.flush()
    except BaseException:
        pass
"#;

/// What one call of a session gave (for [`PYTHON_CELLS`], one cell).
#[derive(Clone, Debug)]
pub struct CellReport {
    /// How the call ended: `Exited(0)` when `areal_main()` returned, `Exited(2)` when it
    /// raised (for [`PYTHON_CELLS`], the cell raised); a limit or a trap ends the session.
    pub outcome: Outcome,
    /// What the call printed (at most the cap).
    pub stdout: Vec<u8>,
    /// Whether it printed more than the cap (the rest is dropped).
    pub truncated: bool,
    /// What it wrote to stderr (at most its cap).
    pub stderr: Vec<u8>,
    /// Wall time of the call.
    pub wall: Duration,
    /// Fuel spent by the call (deterministic mode).
    pub fuel: Option<u64>,
    /// Peak linear memory of the session so far, in bytes.
    pub peak_memory: usize,
    /// When the outcome is [`Outcome::MemoryLimit`] because the session would have taken more
    /// than its [`MemoryBudget`] left (not more than its own cap): the budget, in words.
    pub over_budget: Option<String>,
}

/// A live interpreter and what it was given. See the module's docs.
pub struct Session {
    // first: access to the guest's memory is given back before the store drops
    _restore: Restorer,
    store: Store<Guest>,
    entry: TypedFunc<(), ()>,
    stdin: Feed,
    stdout: Capture,
    stderr: Capture,
    watch: Watch,
    mode: Mode,
    limits: Limits,
    ended: Option<Outcome>,
    calls: u64,
    started: Instant,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("calls", &self.calls)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session in `sandbox` (which must be pre-initialised: [`crate::Settings::preinit`],
    /// e.g. with [`PYTHON_CELLS`]) whose every call gets `limits` (its memory cap is the
    /// session's); `seed` seeds the guest's random source in deterministic mode. Its memory
    /// is charged to the process's [`MemoryBudget`].
    pub async fn start(
        sandbox: &Sandbox,
        limits: &Limits,
        seed: u64,
    ) -> Result<Self, SandboxError> {
        let budget = MemoryBudget::process().map_err(wasmtime::Error::msg)?;
        Self::start_within(sandbox, limits, seed, budget).await
    }

    /// [`Session::start`] with its memory charged to `budget`: refused, naming the budget,
    /// when what the interpreter starts with does not fit in what the budget has left.
    pub async fn start_within(
        sandbox: &Sandbox,
        limits: &Limits,
        seed: u64,
        budget: &MemoryBudget,
    ) -> Result<Self, SandboxError> {
        if sandbox.entry != "areal_run" {
            return Err(SandboxError::Wasmtime(wasmtime::Error::msg(
                "a session needs a pre-initialised sandbox (Settings::preinit)",
            )));
        }
        let stdin = Feed::default();
        let stdout = Capture::new(limits.stdout_bytes, false);
        let stderr = Capture::new(limits.stderr_bytes, false);
        let watch = Watch::new(None, None);
        let io = GuestIo {
            stdin: stdin.clone(),
            stdout: stdout.clone(),
            stderr: stderr.clone(),
            args: &[],
            env: &[],
            seed,
        };
        let mut store = sandbox.store(io, limits, &watch)?;
        store.data_mut().memory.charge_to(budget);
        let restore = watch.restorer();
        let instance = match sandbox.instantiate(&mut store).await {
            Ok(instance) => instance,
            Err(_) if store.data().memory.over_budget => {
                return Err(SandboxError::Wasmtime(wasmtime::Error::msg(format!(
                    "no memory left for another session: the interpreter starts with more \
                     than is left of {}",
                    budget.describe()
                ))));
            }
            Err(_) if store.data().memory.exceeded => {
                return Err(SandboxError::Wasmtime(wasmtime::Error::msg(format!(
                    "a memory limit of {} MiB is less than the pre-initialised interpreter \
                     starts with: raise it",
                    limits.memory_bytes >> 20
                ))));
            }
            Err(e) => return Err(e.into()),
        };
        let entry = instance.get_typed_func::<(), ()>(&mut store, sandbox.entry)?;
        Ok(Self {
            _restore: restore,
            store,
            entry,
            stdin,
            stdout,
            stderr,
            watch,
            mode: sandbox.mode(),
            limits: limits.clone(),
            ended: None,
            calls: 0,
            started: Instant::now(),
        })
    }

    /// Run `areal_main()` again with `stdin` as its input. Errors are the host's; whatever
    /// the guest does is the report's [`Outcome`]. A session that has ended answers every
    /// later call with the outcome that ended it, running nothing.
    pub async fn call(&mut self, stdin: &[u8]) -> Result<CellReport, SandboxError> {
        let started = Instant::now();
        if let Some(ended) = &self.ended {
            return Ok(CellReport {
                outcome: ended.clone(),
                stdout: Vec::new(),
                truncated: false,
                stderr: Vec::new(),
                wall: Duration::ZERO,
                fuel: None,
                peak_memory: self.store.data().memory.peak,
                over_budget: self.over_budget(),
            });
        }
        self.calls += 1;
        let limits = &self.limits;
        let deterministic = self.mode == Mode::Deterministic;
        if deterministic {
            self.store.set_fuel(limits.fuel)?;
        }
        self.stdin.feed(stdin.to_vec());
        self.watch
            .rearm((!deterministic).then_some(limits.cpu), Some(limits.wall));
        let call = self.entry.call_async(&mut self.store, ());
        let timed = tokio::time::timeout(limits.wall, call).await;
        // the restorer gives access back only when the session drops: a stopped guest's
        // memory stays revoked until then, and the session is over
        let outcome = match timed {
            Err(_elapsed) => Outcome::TimeLimit,
            Ok(Ok(())) => Outcome::Exited(0),
            Ok(Err(_)) if self.watch.stopped().is_some() => Outcome::TimeLimit,
            Ok(Err(e)) => classify(&e, self.store.data().memory.exceeded),
        };
        if !matches!(outcome, Outcome::Exited(_)) {
            self.ended = Some(outcome.clone());
        }
        let fuel = if deterministic {
            self.store.get_fuel().ok().map(|left| limits.fuel - left)
        } else {
            None
        };
        let (stdout, truncated) = self.stdout.take();
        Ok(CellReport {
            outcome,
            stdout,
            truncated,
            stderr: self.stderr.take().0,
            wall: started.elapsed(),
            fuel,
            peak_memory: self.store.data().memory.peak,
            over_budget: self.over_budget(),
        })
    }

    fn over_budget(&self) -> Option<String> {
        let memory = &self.store.data().memory;
        memory
            .budget_that_stopped()
            .filter(|_| self.ended == Some(Outcome::MemoryLimit))
    }

    /// Whether the session still takes calls (no call of it was stopped or trapped).
    pub fn is_alive(&self) -> bool {
        self.ended.is_none()
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// How long the session has lived.
    pub fn age(&self) -> Duration {
        self.started.elapsed()
    }
}
