//! Stopping the interpreter when its time is up, without a check compiled into its code.
//!
//! wasmtime can interrupt a guest at epoch checks, which Cranelift puts at every loop header
//! and function entry. In the interpreter's dispatch loop that is a check per bytecode
//! instruction, and it cost 19 % of the guest's speed here (`docs/benchmarks.md`). The
//! interpreter's engine is compiled without them. Instead one watchdog thread per process
//! looks at every run in flight each tick, and when a run's time is up it revokes access to
//! the run's linear memory (`mprotect(PROT_NONE)`): the guest's next load or store faults,
//! wasmtime turns the fault into a trap (bounds checks are left to guard pages, so every
//! access of the guest's is a trap site), the run ends, and the host gives the access back
//! before the memory returns to the instance pool.
//!
//! This is sound only while no host code touches the guest's memory during the revocation:
//! - the guest calls host functions (WASI) through a call hook that takes the run's lock, and
//!   access is revoked only while the guest is in its own code; a run whose time is up while
//!   it is in a host call is stopped at its next transition instead;
//! - the engine refuses bulk-memory instructions (`memory.copy`, `memory.fill` and
//!   `memory.init` are host code that reads and writes guest memory) and threads;
//!   `memory.grow` changes protections but reads and writes nothing.
//!
//! CPU time is the CPU time of the thread running the guest (`pthread_getcpuclockid`, read by
//! the watchdog), from the guest's entry to its return, host calls included, plus the time
//! it sleeps: time spent waiting for a core does not count, so a verdict does not depend on
//! how busy the machine is.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use wasmtime::{CallHook, Trap};

/// How often the watchdog looks: the granularity of time limits.
const TICK: Duration = Duration::from_millis(5);

/// Why a run was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Its CPU time (plus sleeps) reached the limit.
    Cpu,
    /// Its wall time reached the limit.
    Wall,
}

/// One run under the watchdog, from its store's creation to its end. Clones share the run.
#[derive(Clone)]
pub(crate) struct Watch(Arc<Mutex<Watched>>);

struct Watched {
    cpu_limit: Option<Duration>,
    wall_deadline: Option<Instant>,
    place: Place,
    /// CPU time of the stretches that ended, and the one going on.
    cpu_done: Duration,
    stretch: Option<Stretch>,
    slept: Duration,
    /// The guest's linear memory: its base (once instantiated) and its size.
    base: Option<usize>,
    len: usize,
    stop: Option<Stop>,
    /// Access revoked over this many bytes from `base`.
    revoked: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Not running: before its entry, after its return.
    Outside,
    /// In its own code.
    Guest,
    /// In a host function it called.
    Host,
}

/// A stretch of the guest on one thread: that thread's CPU clock, and its reading at the start.
struct Stretch {
    thread: std::thread::ThreadId,
    clock: ThreadClock,
    start: Duration,
}

impl Stretch {
    fn here() -> Self {
        let clock = ThreadClock::current();
        Self {
            thread: std::thread::current().id(),
            start: clock.read(),
            clock,
        }
    }
}

impl Watched {
    /// Watch from nothing with these limits: no CPU time or sleep counted, a wall deadline
    /// from now, not stopped (the memory it knows of is kept).
    fn arm(&mut self, cpu_limit: Option<Duration>, wall: Option<Duration>) {
        self.cpu_limit = cpu_limit;
        self.wall_deadline = wall.and_then(|w| Instant::now().checked_add(w));
        self.place = Place::Outside;
        self.cpu_done = Duration::ZERO;
        self.stretch = None;
        self.slept = Duration::ZERO;
        self.stop = None;
    }

    fn used(&self) -> Duration {
        let running = self
            .stretch
            .as_ref()
            .map_or(Duration::ZERO, |s| s.clock.read().saturating_sub(s.start));
        self.cpu_done + running + self.slept
    }

    fn end_stretch(&mut self) {
        if let Some(s) = self.stretch.take() {
            self.cpu_done += s.clock.read().saturating_sub(s.start);
        }
    }

    /// On the guest's thread: keep counting there (a guest polled from another thread than
    /// before moves its count with it).
    fn follow_thread(&mut self) {
        let here = std::thread::current().id();
        if self.stretch.as_ref().is_none_or(|s| s.thread != here) {
            self.end_stretch();
            self.stretch = Some(Stretch::here());
        }
    }

    /// The watchdog's look: stop the run if its time is up.
    fn check(&mut self, now: Instant) {
        if self.place == Place::Outside || self.stop.is_some() {
            return;
        }
        let stop = if self.cpu_limit.is_some_and(|limit| self.used() >= limit) {
            Stop::Cpu
        } else if self.wall_deadline.is_some_and(|deadline| now >= deadline) {
            Stop::Wall
        } else {
            return;
        };
        self.stop = Some(stop);
        // In a host call the transition back to the guest stops it.
        if self.place == Place::Guest
            && let Some(base) = self.base
        {
            protect(base, self.len, false);
            self.revoked = Some(self.len);
        }
    }
}

impl Watch {
    /// A run under the watchdog with these limits (`None`: none of that kind).
    pub(crate) fn new(cpu_limit: Option<Duration>, wall: Option<Duration>) -> Self {
        let mut watched = Watched {
            cpu_limit: None,
            wall_deadline: None,
            place: Place::Outside,
            cpu_done: Duration::ZERO,
            stretch: None,
            slept: Duration::ZERO,
            base: None,
            len: 0,
            stop: None,
            revoked: None,
        };
        watched.arm(cpu_limit, wall);
        let watch = Watch(Arc::new(Mutex::new(watched)));
        watchdog().register(&watch.0);
        watch
    }

    /// Watch the next call of a session's guest with these limits, from nothing: its CPU
    /// time and sleeps so far forgotten, a fresh wall deadline (`None`: none of that kind).
    pub(crate) fn rearm(&self, cpu_limit: Option<Duration>, wall: Option<Duration>) {
        self.lock().arm(cpu_limit, wall);
    }

    fn lock(&self) -> MutexGuard<'_, Watched> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store's call hook: where the guest is, and a trap instead of a host call (or of
    /// the return from one) once it was stopped.
    pub(crate) fn hook(&self, hook: CallHook) -> wasmtime::Result<()> {
        let mut w = self.lock();
        match hook {
            CallHook::CallingWasm => {
                w.place = Place::Guest;
                w.follow_thread();
            }
            CallHook::ReturningFromWasm => {
                w.place = Place::Outside;
                w.end_stretch();
            }
            CallHook::CallingHost | CallHook::ReturningFromHost if w.stop.is_some() => {
                return Err(Trap::Interrupt.into());
            }
            CallHook::CallingHost => w.place = Place::Host,
            CallHook::ReturningFromHost => {
                w.place = Place::Guest;
                w.follow_thread();
            }
        }
        Ok(())
    }

    /// The guest's linear memory, once instantiated.
    pub(crate) fn set_memory_base(&self, base: *mut u8) {
        self.lock().base = Some(base.addr());
    }

    /// The guest's linear memory is `len` bytes now (the store's resource limiter says so
    /// before each growth, and again if a growth fails).
    pub(crate) fn set_memory_len(&self, len: usize) {
        self.lock().len = len;
    }

    /// What is left of the CPU-time limit (`None`: no limit).
    pub(crate) fn left(&self) -> Option<Duration> {
        let w = self.lock();
        w.cpu_limit.map(|limit| limit.saturating_sub(w.used()))
    }

    /// The guest slept this long (it counts as its time).
    pub(crate) fn slept(&self, d: Duration) {
        self.lock().slept += d;
    }

    /// Why the run was stopped, if it was.
    pub(crate) fn stopped(&self) -> Option<Stop> {
        self.lock().stop
    }

    /// A guard that gives back access to the guest's memory when it is dropped (declare it
    /// after the store, so that it drops first: the memory must be accessible again before
    /// it returns to the instance pool, and on every path out of a run).
    pub(crate) fn restorer(&self) -> Restorer {
        Restorer(self.clone())
    }
}

/// See [`Watch::restorer`].
pub(crate) struct Restorer(Watch);

impl Drop for Restorer {
    fn drop(&mut self) {
        let mut w = self.0.lock();
        w.place = Place::Outside;
        if let (Some(base), Some(_)) = (w.base, w.revoked.take()) {
            // The memory may have grown since (new pages are accessible already).
            protect(base, w.len, true);
        }
    }
}

/// Revoke (`readwrite = false`) or give back access to `len` bytes of a guest's memory.
fn protect(base: usize, len: usize, readwrite: bool) {
    if len == 0 {
        return;
    }
    let flags = if readwrite {
        rustix::mm::MprotectFlags::READ | rustix::mm::MprotectFlags::WRITE
    } else {
        rustix::mm::MprotectFlags::empty()
    };
    // SAFETY: `base..base + len` is the accessible part of a linear memory that wasmtime
    // mapped and that lives as long as the run's store; the store outlives every call of
    // this (the restorer drops before it). Revoking access only makes the guest's own next
    // access trap (no host code touches the memory meanwhile, see the module's docs), and
    // giving it back restores exactly what wasmtime had mapped.
    #[allow(
        unsafe_code,
        reason = "revoking and restoring access to the guest's memory is an mprotect"
    )]
    let done = unsafe { rustix::mm::mprotect(std::ptr::without_provenance_mut(base), len, flags) };
    if let Err(e) = done {
        // Not being able to stop a guest, or to reuse its memory, is not recoverable.
        panic!("mprotect of a guest's memory ({len} bytes) failed: {e}");
    }
}

/// The process's watchdog: a thread that checks every registered run each tick, and sleeps
/// while none is registered.
struct Watchdog {
    runs: Mutex<Vec<Weak<Mutex<Watched>>>>,
    wake: Condvar,
}

fn watchdog() -> &'static Watchdog {
    static WATCHDOG: OnceLock<&'static Watchdog> = OnceLock::new();
    WATCHDOG.get_or_init(|| {
        let dog: &'static Watchdog = Box::leak(Box::new(Watchdog {
            runs: Mutex::new(Vec::new()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("areal-sandbox-watchdog".into())
            .spawn(move || dog.watch())
            .expect("spawning the sandbox watchdog thread");
        dog
    })
}

impl Watchdog {
    fn register(&self, run: &Arc<Mutex<Watched>>) {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.push(Arc::downgrade(run));
        self.wake.notify_one();
    }

    fn watch(&self) {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            runs.retain(|r| r.strong_count() > 0);
            if runs.is_empty() {
                runs = self.wake.wait(runs).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let live: Vec<_> = runs.iter().filter_map(Weak::upgrade).collect();
            drop(runs);
            std::thread::sleep(TICK);
            let now = Instant::now();
            for run in live {
                run.lock().unwrap_or_else(|p| p.into_inner()).check(now);
            }
            runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The CPU clock of one thread, readable from any thread.
#[derive(Clone, Copy)]
struct ThreadClock {
    #[cfg(target_os = "linux")]
    id: libc::clockid_t,
    #[cfg(not(target_os = "linux"))]
    start: Instant,
}

impl ThreadClock {
    /// The calling thread's.
    #[cfg(target_os = "linux")]
    fn current() -> Self {
        let mut id: libc::clockid_t = 0;
        // SAFETY: `pthread_self()` is the calling thread, alive during the call, and `id`
        // is a valid place for the result.
        #[allow(
            unsafe_code,
            reason = "the CPU clock of the guest's thread comes from libc"
        )]
        let err = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
        assert_eq!(err, 0, "pthread_getcpuclockid failed: {err}");
        Self { id }
    }

    #[cfg(target_os = "linux")]
    fn read(&self) -> Duration {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid timespec to write; a clock whose thread has ended gives an
        // error, read as no time.
        #[allow(unsafe_code, reason = "reading that thread's CPU clock")]
        let err = unsafe { libc::clock_gettime(self.id, &mut t) };
        if err != 0 {
            return Duration::ZERO;
        }
        Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        )
    }

    /// Without per-thread CPU clocks readable from another thread, wall time stands in.
    #[cfg(not(target_os = "linux"))]
    fn current() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn read(&self) -> Duration {
        self.start.elapsed()
    }
}
