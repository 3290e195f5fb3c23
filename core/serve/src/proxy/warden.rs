//! Agent programs contained as a tree: each runs under a launcher of its own that is a child
//! subreaper (`PR_SET_CHILD_SUBREAPER`), so that every process it ever starts stays below the
//! launcher, whatever it does to leave (`setsid`, a double fork, a process group of its own),
//! for as long as the launcher lives. One thread, the warden, watches every launcher's tree: the
//! processes in it and their resident memory in all, bounded; a tree past a bound is killed,
//! and what it passed is what its episode fails with. When an episode ends, its tree is killed
//! to the last process before the launcher is.
//!
//! Linux only (`/proc`), and no privilege: a cgroup would need one, a subreaper does not. The
//! bounds are checked every [`TICK`]: a tree may pass one for that long before it is killed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How often the warden looks at the trees.
pub(crate) const TICK: Duration = Duration::from_millis(20);

/// What a tree may hold at once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// Processes below the launcher (the program and all it started), at most.
    pub(crate) processes: usize,
    /// Their resident memory together, in bytes, at most (`None`: no bound).
    pub(crate) memory_bytes: Option<u64>,
}

/// One program's tree under watch. Dropping it kills the tree, then reaps the launcher: until
/// then the launcher's process id is its own (a zombie holds it), so that no signal meant for
/// the tree ever reaches a process that took the id after it.
pub(crate) struct Tree {
    inner: Arc<Watched>,
    launcher: std::process::Child,
}

struct Watched {
    /// The launcher's process id.
    root: u32,
    bounds: Bounds,
    /// Held while the tree is looked at or killed: what it passed, once the warden killed it
    /// for that; whether the launcher is reaped (its id no longer the tree's).
    status: Mutex<Status>,
}

#[derive(Default)]
struct Status {
    breach: Option<String>,
    reaped: bool,
}

impl Tree {
    /// Watch the tree below `launcher` within `bounds`.
    pub(crate) fn watch(launcher: std::process::Child, bounds: Bounds) -> Self {
        let inner = Arc::new(Watched {
            root: launcher.id(),
            bounds,
            status: Mutex::new(Status::default()),
        });
        warden()
            .watched
            .lock()
            .expect("warden lock poisoned")
            .push(Arc::downgrade(&inner));
        Self { inner, launcher }
    }

    /// Why the warden killed the tree, if it did.
    pub(crate) fn breach(&self) -> Option<String> {
        self.inner.status().breach.clone()
    }

    /// What tells why the warden killed the tree, for whoever waits for its end.
    pub(crate) fn breaches(&self) -> Breaches {
        Breaches(self.inner.clone())
    }

    /// Kill every process below the launcher, then the launcher.
    pub(crate) fn kill(&self) {
        let status = self.inner.status();
        if !status.reaped {
            kill_tree(self.inner.root);
        }
    }
}

impl Watched {
    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let mut status = self.inner.status();
        kill_tree(self.inner.root);
        let _ = self.launcher.wait();
        status.reaped = true;
    }
}

/// Why the warden killed a tree, if it did ([`Tree::breaches`]).
pub(crate) struct Breaches(Arc<Watched>);

impl Breaches {
    pub(crate) fn get(&self) -> Option<String> {
        self.0.status().breach.clone()
    }
}

struct Warden {
    watched: Mutex<Vec<Weak<Watched>>>,
}

fn warden() -> &'static Warden {
    static WARDEN: OnceLock<Warden> = OnceLock::new();
    WARDEN.get_or_init(|| {
        std::thread::Builder::new()
            .name("areal-agent-warden".into())
            .spawn(watch_all)
            .expect("the agent warden's thread");
        Warden {
            watched: Mutex::new(Vec::new()),
        }
    })
}

fn watch_all() {
    loop {
        std::thread::sleep(TICK);
        let trees: Vec<Arc<Watched>> = {
            let mut watched = warden().watched.lock().expect("warden lock poisoned");
            watched.retain(|w| w.strong_count() > 0);
            watched.iter().filter_map(Weak::upgrade).collect()
        };
        for tree in trees {
            let mut status = tree.status();
            if status.breach.is_some() || status.reaped {
                continue;
            }
            let below = descendants(tree.root, false);
            let count = below.len();
            let memory: u64 = below.iter().map(|p| p.rss_bytes).sum();
            let over_memory = tree.bounds.memory_bytes.filter(|&max| memory > max);
            let breach = if count > tree.bounds.processes {
                Some(format!(
                    "ran more than {} processes at once (max_processes)",
                    tree.bounds.processes
                ))
            } else {
                over_memory.map(|max| {
                    format!(
                        "held {} MiB with the processes it started, more than memory_mb = {} \
                         in all",
                        memory >> 20,
                        max >> 20
                    )
                })
            };
            if let Some(why) = breach {
                tracing::warn!(
                    target: "areal::proxy",
                    processes = count,
                    memory_mib = memory >> 20,
                    "an agent program {why}: killing it with every process it started"
                );
                status.breach = Some(why);
                kill_tree(tree.root);
            }
        }
    }
}

/// A live process of a tree.
#[derive(Clone, Copy, Debug)]
struct Proc {
    pid: u32,
    rss_bytes: u64,
}

/// What `/proc/PID/stat` says of a process: its parent, whether it is still running (not a
/// zombie), its resident memory.
fn stat(pid: u32) -> Option<(u32, bool, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the command's name is in parentheses and may hold anything: read after the last one
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields from the state: state ppid pgrp session tty tpgid flags minflt cminflt majflt
    // cmajflt utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss
    let alive = !matches!(fields.first()?.chars().next()?, 'Z' | 'X');
    let ppid = fields.get(1)?.parse().ok()?;
    let pages: u64 = fields.get(21)?.parse().ok()?;
    Some((ppid, alive, pages * page_size()))
}

fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| {
        #[expect(unsafe_code, reason = "sysconf(3) for the page size")]
        // SAFETY: sysconf takes a constant and returns a number
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
    })
}

/// The children of `pid` (of all its threads), as `/proc` lists them.
fn children(pid: u32) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let task = task.ok()?;
        let text = std::fs::read_to_string(task.path().join("children")).ok()?;
        out.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    Some(out)
}

/// Every process of the system with its parent (what [`children`] gives where `/proc` has no
/// `children` files).
fn parents() -> HashMap<u32, Vec<u32>> {
    let mut below: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((ppid, _, _)) = stat(pid) {
            below.entry(ppid).or_default().push(pid);
        }
    }
    below
}

/// The live processes below `root`, `root` left out: read from each process's `children`
/// (cheap, but it may miss a child forked while it is read), or, `exact`, from every process's
/// parent.
fn descendants(root: u32, exact: bool) -> Vec<Proc> {
    // (whether this kernel has `children` files, read once: this process has many threads)
    static HAS_CHILDREN_FILES: OnceLock<bool> = OnceLock::new();
    let has_children_files =
        *HAS_CHILDREN_FILES.get_or_init(|| children(std::process::id()).is_some());
    let all = (exact || !has_children_files).then(parents);
    let mut seen = HashSet::from([root]);
    let mut queue = vec![root];
    let mut out = Vec::new();
    while let Some(pid) = queue.pop() {
        let below = match &all {
            Some(all) => all.get(&pid).cloned().unwrap_or_default(),
            None => children(pid).unwrap_or_default(),
        };
        for child in below {
            if !seen.insert(child) {
                continue;
            }
            // (one that has just exited is gone from /proc: nothing below it either)
            if let Some((_, alive, rss)) = stat(child) {
                if alive {
                    out.push(Proc {
                        pid: child,
                        rss_bytes: rss,
                    });
                }
                queue.push(child);
            }
        }
    }
    out
}

/// Kill every live process below `root` until none is left (what is started meanwhile stays
/// below the subreaper, and is found on the next pass), then `root` itself.
fn kill_tree(root: u32) {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let below = descendants(root, true);
        if below.is_empty() {
            break;
        }
        for p in &below {
            signal_kill(p.pid);
        }
        if Instant::now() > give_up {
            tracing::warn!(target: "areal::proxy", left = below.len(), "processes of an agent program could not be killed within 10 s");
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    signal_kill(root);
}

fn signal_kill(pid: u32) {
    if let Ok(pid) = i32::try_from(pid)
        && pid > 1
    {
        #[expect(unsafe_code, reason = "kill(2) with a process id read from /proc")]
        // SAFETY: kill takes plain integers; a process gone already gives ESRCH
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}
