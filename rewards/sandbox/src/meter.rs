//! The limits every guest runs under, and the meters behind them: memory by a resource
//! limiter, time by the guest's own CPU time plus its sleeps, and the epoch ticker that checks
//! reward components' time.

use std::sync::Weak;
use std::time::Duration;

use wasmtime::{Engine, ResourceLimiter, Store};

use crate::watchdog::Watch;

/// How often the epoch advances (reward components): the granularity of their CPU limits and
/// of yielding to tokio. The interpreter has no epochs: `watchdog.rs`.
const EPOCH_TICK: Duration = Duration::from_millis(5);

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

    pub(crate) fn watched(max: usize, watch: Watch) -> Self {
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
