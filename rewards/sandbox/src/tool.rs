//! Tools compiled to WebAssembly components (`wit/tool.wit` of `sdk/guest`, world `tool`): one
//! instance per episode, kept between its calls, under the sandbox's limits at every call.
//!
//! [`ToolHost::load`] compiles the component (cached as reward components are) and asks it to
//! `describe` itself. [`ToolHost::open`] makes a [`ToolInstance`] for one episode: a store of its
//! own, `open` called with the episode's seed. [`ToolInstance::call`] runs one call with fresh
//! time (or fuel) and wall limits; memory is the instance's, capped for its whole life. A call
//! stopped by a limit leaves the instance unusable: the caller drops it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::{Engine, Store};

use crate::capture::Capture;
use crate::component::{Grants, Linked, State, link, metered_store, not_a_component};
use crate::meter::{MemoryBudget, TimeBudget};
use crate::run::{Limits, Mode, Outcome, SandboxError, classify, wasmtime_version};

#[allow(missing_docs, reason = "generated code")]
mod bindings {
    wasmtime::component::bindgen!({
        world: "tool",
        path: "../../sdk/guest/wit",
        exports: { default: async },
    });
}

/// How a tool's call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolCallOutcome {
    /// The tool answered: the text the model reads.
    Answered(String),
    /// The tool returned an error: the text the model reads.
    Refused(String),
    /// A limit stopped it, or it trapped: the instance is gone.
    Stopped(Outcome),
}

/// A call's result with what it cost.
#[derive(Clone, Debug)]
pub struct ToolCallReport {
    /// How it ended.
    pub outcome: ToolCallOutcome,
    /// What the call printed on stdout (at most the cap; past it the call is stopped), which
    /// the tool's answer does not include.
    pub stdout: Vec<u8>,
    /// What it printed on stderr.
    pub stderr: Vec<u8>,
    /// Wall time of the call.
    pub wall: Duration,
    /// Peak linear memory of the instance so far, in bytes.
    pub peak_memory: usize,
    /// When a memory limit stopped it because the instance would have taken more than the
    /// process's [`MemoryBudget`] left: the budget, in words.
    pub over_budget: Option<String>,
}

/// A tool component, compiled, ready to open an instance per episode.
pub struct ToolHost {
    engine: Engine,
    pre: bindings::ToolPre<State>,
    mode: Mode,
    sha256: String,
    path: PathBuf,
    grants: Grants,
    ticker: Arc<()>,
}

impl std::fmt::Debug for ToolHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolHost")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// One episode's instance of a tool component.
pub struct ToolInstance {
    store: Store<State>,
    tool: bindings::Tool,
    stdout: Capture,
    stderr: Capture,
    mode: Mode,
}

impl ToolHost {
    /// Load the component at `path` (compiled once and cached in `cache_dir`), check that it
    /// implements the world `tool`, and get it ready for instances in `mode` with `grants`.
    pub fn load(
        path: &Path,
        mode: Mode,
        cache_dir: &Path,
        grants: Grants,
    ) -> Result<Self, SandboxError> {
        let linked = link(path, mode, cache_dir, &grants, false)?;
        let pre = bindings::ToolPre::new(linked.pre).map_err(not_a_component(path))?;
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

    /// The component's sha256 (hex).
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// What runs, for provenance: the component's sha256 and wasmtime's version.
    pub fn version(&self) -> String {
        format!(
            "component sha256 {}; wasmtime {}",
            self.sha256,
            wasmtime_version()
        )
    }

    /// A fresh instance with `open(options, seed)` called: `Ok(Err(message))` when the
    /// component refused, `Ok(Ok(instance))` when it is ready. Errors are the host's, or a
    /// limit that stopped `open` (as [`SandboxError::Component`], naming it). Its memory is
    /// charged to the process's [`MemoryBudget`] while it lives.
    pub async fn open(
        &self,
        options: &str,
        seed: u64,
        limits: &Limits,
    ) -> Result<Result<ToolInstance, String>, SandboxError> {
        let _alive = &self.ticker;
        let budget = MemoryBudget::process().map_err(wasmtime::Error::msg)?;
        let (mut store, stdout, stderr) =
            metered_store(&self.engine, &self.grants, self.mode, limits, seed)?;
        store.data_mut().memory.charge_to(budget);
        let opened = async {
            let tool = self.pre.instantiate_async(&mut store).await?;
            let answer = tool.call_open(&mut store, options, seed).await?;
            Ok::<_, wasmtime::Error>((tool, answer))
        };
        let stopped = |outcome: Outcome| SandboxError::Component {
            path: self.path.clone(),
            message: format!("opening a session: {}", describe(&outcome)),
        };
        let (tool, answer) = match tokio::time::timeout(limits.wall, opened).await {
            Err(_elapsed) => return Err(stopped(Outcome::TimeLimit)),
            Ok(Err(_)) if store.data().memory.over_budget => {
                return Err(SandboxError::Component {
                    path: self.path.clone(),
                    message: format!(
                        "opening a session: no memory left for another instance in {}",
                        budget.describe()
                    ),
                });
            }
            Ok(Err(e)) => return Err(stopped(classify(&e, store.data().memory.exceeded))),
            Ok(Ok(opened)) => opened,
        };
        if let Err(message) = answer {
            return Ok(Err(message));
        }
        Ok(Ok(ToolInstance {
            store,
            tool,
            stdout,
            stderr,
            mode: self.mode,
        }))
    }

    /// [`ToolHost::describe`] on the current thread, on a tokio runtime of the thread's own
    /// (not inside an async context).
    pub fn describe_blocking(
        &self,
        options: &str,
        limits: &Limits,
    ) -> Result<Result<String, String>, SandboxError> {
        crate::blocking::block_on(self.describe(options, limits))
    }

    /// `describe(options)` in an instance of its own: the schema's JSON text, or the
    /// component's refusal.
    pub async fn describe(
        &self,
        options: &str,
        limits: &Limits,
    ) -> Result<Result<String, String>, SandboxError> {
        let _alive = &self.ticker;
        let (mut store, _, _) = metered_store(&self.engine, &self.grants, self.mode, limits, 0)?;
        let described = async {
            let tool = self.pre.instantiate_async(&mut store).await?;
            tool.call_describe(&mut store, options).await
        };
        match tokio::time::timeout(limits.wall, described).await {
            Err(_elapsed) => Err(SandboxError::Component {
                path: self.path.clone(),
                message: format!("describe: {}", describe(&Outcome::TimeLimit)),
            }),
            Ok(Err(e)) => Err(SandboxError::Component {
                path: self.path.clone(),
                message: format!(
                    "describe: {}",
                    describe(&classify(&e, store.data().memory.exceeded))
                ),
            }),
            Ok(Ok(answer)) => Ok(answer),
        }
    }
}

impl ToolInstance {
    /// One call with `arguments` (a JSON object's text), with `limits`' time (or fuel) and wall
    /// time afresh. After [`ToolCallOutcome::Stopped`] the instance must not be called again.
    pub async fn call(&mut self, arguments: &str, limits: &Limits) -> ToolCallReport {
        let started = Instant::now();
        let data = self.store.data_mut();
        data.time = TimeBudget::new((self.mode == Mode::Fast).then_some(limits.cpu));
        data.memory.exceeded = false;
        data.memory.over_budget = false;
        let fueled = if self.mode == Mode::Deterministic {
            self.store.set_fuel(limits.fuel).err()
        } else {
            None
        };
        let outcome = match fueled {
            Some(e) => ToolCallOutcome::Stopped(Outcome::Trapped(format!("{e:#}"))),
            None => {
                let call = self.tool.call_call(&mut self.store, arguments);
                match tokio::time::timeout(limits.wall, call).await {
                    Err(_elapsed) => ToolCallOutcome::Stopped(Outcome::TimeLimit),
                    Ok(Ok(Ok(text))) => ToolCallOutcome::Answered(text),
                    Ok(Ok(Err(text))) => ToolCallOutcome::Refused(text),
                    Ok(Err(e)) => {
                        ToolCallOutcome::Stopped(classify(&e, self.store.data().memory.exceeded))
                    }
                }
            }
        };
        let (stdout, overflowed) = self.stdout.take();
        let outcome = match outcome {
            ToolCallOutcome::Stopped(Outcome::Trapped(_)) if overflowed => {
                ToolCallOutcome::Stopped(Outcome::OutputLimit)
            }
            other => other,
        };
        let memory = &self.store.data().memory;
        let over_budget = memory
            .budget_that_stopped()
            .filter(|_| outcome == ToolCallOutcome::Stopped(Outcome::MemoryLimit));
        ToolCallReport {
            outcome,
            stdout,
            stderr: self.stderr.take().0,
            wall: started.elapsed(),
            peak_memory: memory.peak,
            over_budget,
        }
    }
}

/// What stopped a guest, in words.
pub fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::TimeLimit => "it ran past its time limit".into(),
        Outcome::MemoryLimit => "it asked for more memory than its limit".into(),
        Outcome::OutputLimit => "it printed more than its output limit".into(),
        Outcome::Trapped(why) => format!("it trapped: {why}"),
        Outcome::Exited(code) => format!("it exited with status {code} instead of returning"),
    }
}
