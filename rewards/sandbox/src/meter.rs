//! The limits every guest runs under, and the meters behind them: memory by a resource
//! limiter, time by the guest's own CPU time plus its sleeps, and the epoch ticker that checks
//! reward components' time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
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
    /// Whether what stopped the guest was the budget it is charged to, not its own cap.
    pub(crate) over_budget: bool,
    /// The run's watchdog, told the memory's size (the interpreter's runs).
    watch: Option<(Watch, usize)>,
    /// The budget the guest's memory is charged to (sessions and tool instances), with what
    /// it holds of it and the last growth charged (given back if the growth then fails).
    budget: Option<(MemoryBudget, usize, usize)>,
}

impl MemoryCap {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            peak: 0,
            exceeded: false,
            over_budget: false,
            watch: None,
            budget: None,
        }
    }

    pub(crate) fn watched(max: usize, watch: Watch) -> Self {
        let mut cap = Self::new(max);
        cap.watch = Some((watch, 0));
        cap
    }

    /// Charge every byte of linear memory the guest takes from now on (instantiation's
    /// included) to `budget`, until the store drops.
    pub(crate) fn charge_to(&mut self, budget: &MemoryBudget) {
        self.budget = Some((budget.clone(), 0, 0));
    }

    /// The budget, in words, when it is what stopped the guest.
    pub(crate) fn budget_that_stopped(&self) -> Option<String> {
        let (budget, _, _) = self.budget.as_ref().filter(|_| self.over_budget)?;
        Some(budget.describe())
    }
}

impl Drop for MemoryCap {
    fn drop(&mut self) {
        if let Some((budget, held, _)) = &self.budget {
            budget.release(*held);
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
        if let Some((budget, held, last)) = &mut self.budget {
            // per memory: a component's modules have one each, and instantiation grows each
            // from nothing
            let more = desired.saturating_sub(current);
            if !budget.try_charge(more) {
                self.exceeded = true;
                self.over_budget = true;
                return Err(wasmtime::Error::msg("memory budget"));
            }
            *held += more;
            *last = more;
        }
        self.peak = self.peak.max(desired);
        if let Some((watch, before)) = &mut self.watch {
            *before = current;
            watch.set_memory_len(desired);
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        if let Some((budget, held, last)) = &mut self.budget {
            budget.release(*last);
            *held -= *last;
            *last = 0;
        }
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

/// The linear memory that guests kept alive between calls may hold together: every
/// [`crate::Session`] and tool instance of a process is charged to one budget, so that their
/// sum stays bounded however many are open (each one's own cap bounds only itself). A guest
/// that would take more than the budget leaves is stopped as by its own memory limit, and
/// what stopped it says so, naming the budget and its setting. Memory goes back to the budget
/// when the session or instance drops.
#[derive(Clone)]
pub struct MemoryBudget(Arc<BudgetInner>);

struct BudgetInner {
    limit: usize,
    held: AtomicUsize,
    /// Where the limit came from, for what a stopped guest reads.
    origin: String,
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("limit", &self.limit())
            .field("held", &self.held())
            .finish()
    }
}

/// The variable that sets the process's budget of session memory, in MiB.
pub const SESSION_MEMORY_ENV: &str = "AREAL_SESSION_MEMORY_MB";

impl MemoryBudget {
    /// A budget of `limit` bytes, `origin` saying where the limit was set (for the errors).
    pub fn new(limit: usize, origin: impl Into<String>) -> Self {
        Self(Arc::new(BudgetInner {
            limit,
            held: AtomicUsize::new(0),
            origin: origin.into(),
        }))
    }

    /// The process's budget, which sessions and tool instances are charged to: half of the
    /// machine's physical memory, or [`SESSION_MEMORY_ENV`] MiB. A value that is not a whole
    /// number of MiB from 64 on is an error naming the variable.
    pub fn process() -> Result<&'static MemoryBudget, String> {
        static PROCESS: OnceLock<Result<MemoryBudget, String>> = OnceLock::new();
        PROCESS
            .get_or_init(|| match std::env::var(SESSION_MEMORY_ENV) {
                Ok(value) => match value.trim().parse::<usize>() {
                    Ok(mb) if (64..=(1 << 30)).contains(&mb) => {
                        Ok(Self::new(mb << 20, format!("{SESSION_MEMORY_ENV}={mb}")))
                    }
                    _ => Err(format!(
                        "{SESSION_MEMORY_ENV} must be a number of MiB from 64 on, found {value:?}"
                    )),
                },
                Err(_) => {
                    let total = physical_memory().unwrap_or(8 << 30);
                    Ok(Self::new(
                        total / 2,
                        format!("half of physical memory; {SESSION_MEMORY_ENV} sets it"),
                    ))
                }
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> usize {
        self.0.limit
    }

    /// What the guests charged to it hold now, in bytes.
    pub fn held(&self) -> usize {
        self.0.held.load(Ordering::SeqCst)
    }

    /// The budget in words, for what a guest it stopped reads.
    pub fn describe(&self) -> String {
        format!(
            "the {} MiB that this process's Python sessions and tool instances may hold \
             together ({}; {} MiB held)",
            self.limit() >> 20,
            self.0.origin,
            self.held() >> 20
        )
    }

    fn try_charge(&self, bytes: usize) -> bool {
        self.0
            .held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(bytes).filter(|&h| h <= self.0.limit)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.0.held.fetch_sub(bytes, Ordering::SeqCst);
    }
}

/// Physical memory of the machine (`MemTotal`), in bytes.
fn physical_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
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
