//! The `python` tool: a session of Python cells (`areal_sandbox::Session`) per episode.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use areal_sandbox::{Limits, Mode, Outcome, PYTHON_CELLS, Sandbox, Session, Settings};
use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Tool, ToolOutput, ToolSchema, ToolSession,
    register_tool,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::PYTHON as NAME;

/// The `[[tools]]` options of `python`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PythonToolOptions {
    /// CPU time of one call, in seconds (in deterministic mode a fuel budget replaces it).
    pub timeout_s: f64,
    /// Linear memory of one episode's interpreter, in MiB.
    pub memory_mb: usize,
    /// What one call may print before the rest is cut, in bytes.
    pub output_bytes: usize,
    /// `fast` (CPU time) or `deterministic` (fuel, fixed clock, seeded random source: a run
    /// repeats bit for bit).
    pub mode: Mode,
    /// Fuel of one call in deterministic mode.
    pub fuel: u64,
}

impl Default for PythonToolOptions {
    fn default() -> Self {
        Self {
            timeout_s: 5.0,
            memory_mb: 256,
            output_bytes: 4096,
            mode: Mode::Fast,
            fuel: 10_000_000_000,
        }
    }
}

/// A tool's limits of one call, checked (`timeout_s`, `output_bytes`) and `memory_mb` within
/// `memory_range`, each error naming its key of `config`.
pub(crate) fn check_call_limits(
    config: &PluginConfig,
    timeout_s: f64,
    memory_mb: usize,
    memory_range: std::ops::RangeInclusive<usize>,
    output_bytes: usize,
) -> Result<(), PluginError> {
    if !(timeout_s.is_finite() && timeout_s > 0.0 && timeout_s <= 600.0) {
        return Err(config.invalid(
            "timeout_s",
            format!("between 0 and 600 seconds, found {timeout_s}"),
        ));
    }
    if !memory_range.contains(&memory_mb) {
        return Err(config.invalid(
            "memory_mb",
            format!(
                "between {} and {}, found {memory_mb}",
                memory_range.start(),
                memory_range.end()
            ),
        ));
    }
    if !(64..=(16 << 20)).contains(&output_bytes) {
        return Err(config.invalid(
            "output_bytes",
            format!("between 64 and 16 MiB, found {output_bytes}"),
        ));
    }
    Ok(())
}

/// The sandbox's limits of one call of a tool.
pub(crate) fn call_limits(
    timeout_s: f64,
    memory_mb: usize,
    output_bytes: usize,
    fuel: u64,
) -> Limits {
    let cpu = Duration::from_secs_f64(timeout_s);
    Limits {
        cpu,
        // the backstop for a call that sleeps or waits: never what stops a busy one
        wall: cpu * 4 + Duration::from_secs(1),
        memory_bytes: memory_mb << 20,
        stdout_bytes: output_bytes,
        stderr_bytes: 4096,
        fuel,
    }
}

impl PythonToolOptions {
    pub(crate) fn check(&self, config: &PluginConfig) -> Result<(), PluginError> {
        // the interpreter's snapshot starts with ~70 MiB of linear memory
        check_call_limits(
            config,
            self.timeout_s,
            self.memory_mb,
            128..=4096,
            self.output_bytes,
        )
    }

    pub(crate) fn limits(&self) -> Limits {
        call_limits(self.timeout_s, self.memory_mb, self.output_bytes, self.fuel)
    }
}

/// The `python` tool. See the crate's docs.
pub struct PythonTool {
    options: PythonToolOptions,
    sandbox: Arc<Sandbox>,
}

impl std::fmt::Debug for PythonTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonTool")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Python sessions alive at once in a process: one per episode in flight that has called the
/// tool (`rollout.max_concurrent × rollout.group_size` at most, plus evaluation's).
pub const MAX_SESSIONS: u32 = 1024;

/// One sandbox per mode for the process: building one snapshots the interpreter (cached on
/// disk after the first time).
fn sandbox(mode: Mode) -> Result<Arc<Sandbox>, String> {
    static FAST: OnceLock<Result<Arc<Sandbox>, String>> = OnceLock::new();
    static DETERMINISTIC: OnceLock<Result<Arc<Sandbox>, String>> = OnceLock::new();
    let cell = match mode {
        Mode::Fast => &FAST,
        Mode::Deterministic => &DETERMINISTIC,
    };
    cell.get_or_init(|| {
        Sandbox::new(&Settings {
            mode,
            preinit: Some(PYTHON_CELLS.into()),
            instances: Some(MAX_SESSIONS),
            ..Settings::default()
        })
        .map(Arc::new)
        .map_err(|e| e.to_string())
    })
    .clone()
}

impl PythonTool {
    /// The tool with `options`, on this process's sandbox of their mode. Build it outside an
    /// async context the first time (building the sandbox blocks).
    pub fn new(options: PythonToolOptions) -> Result<Self, PluginError> {
        let sandbox = sandbox(options.mode).map_err(|e| PluginError::failed(NAME, e))?;
        Ok(Self { options, sandbox })
    }
}

#[areal_sdk::async_trait]
impl Tool for PythonTool {
    fn name(&self) -> &str {
        NAME
    }

    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: NAME.into(),
            description: format!(
                "Run Python 3.11 code. Names you define stay for your next calls. You see what \
                 the code prints and the value of its last line; at most {} bytes, {} s of CPU \
                 per call, {} MB of memory; no files, no network.",
                self.options.output_bytes, self.options.timeout_s, self.options.memory_mb
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The Python code to run."}
                },
                "required": ["code"]
            }),
        }
    }

    async fn open(&self, seed: u64) -> Result<Box<dyn ToolSession>, PluginError> {
        Ok(Box::new(PythonSession {
            sandbox: self.sandbox.clone(),
            limits: self.options.limits(),
            options: self.options.clone(),
            seed,
            session: None,
            restarts: 0,
            cell: Cell::Code,
            name: NAME.into(),
        }))
    }
}

/// What a call runs as a cell.
pub(crate) enum Cell {
    /// The call's `code` argument.
    Code,
    /// `_areal_call(<the arguments as JSON>)`, a function the sandbox's pre-initialisation
    /// defined (`python-function`).
    Function,
}

impl Cell {
    /// The cell for `arguments`, or what is wrong with them (for the model to read).
    fn source(&self, name: &str, arguments: &Map<String, Value>) -> Result<String, ToolOutput> {
        match self {
            Cell::Code => {
                let code = match arguments.get("code") {
                    Some(Value::String(code)) => code,
                    Some(_) => {
                        return Err(ToolOutput::error(format!(
                            "{name}: \"code\" must be a string of Python source"
                        )));
                    }
                    None => {
                        return Err(ToolOutput::error(format!(
                            "{name}: give the code to run as {{\"code\": \"...\"}}"
                        )));
                    }
                };
                if let Some(unknown) = arguments.keys().find(|k| *k != "code") {
                    return Err(ToolOutput::error(format!(
                        "{name}: unknown argument \"{unknown}\" (it takes only \"code\")"
                    )));
                }
                Ok(code.clone())
            }
            Cell::Function => {
                let json = Value::Object(arguments.clone()).to_string();
                let literal = serde_json::to_string(&json).expect("a string is JSON");
                Ok(format!("_areal_call({literal})"))
            }
        }
    }
}

/// One episode's interpreter, started at its first call and again at the call after one that
/// ended it.
pub(crate) struct PythonSession {
    pub(crate) sandbox: Arc<Sandbox>,
    pub(crate) limits: Limits,
    pub(crate) options: PythonToolOptions,
    pub(crate) seed: u64,
    pub(crate) session: Option<Session>,
    pub(crate) restarts: u64,
    pub(crate) cell: Cell,
    /// The tool's name, in what the model reads.
    pub(crate) name: Arc<str>,
}

#[areal_sdk::async_trait]
impl ToolSession for PythonSession {
    async fn call(&mut self, arguments: &Map<String, Value>) -> Result<ToolOutput, PluginError> {
        let name = self.name.clone();
        let code = match self.cell.source(&name, arguments) {
            Ok(code) => code,
            Err(wrong) => return Ok(wrong),
        };
        let session = match &mut self.session {
            Some(session) if session.is_alive() => session,
            _ => {
                // the ended interpreter's memory goes back to the budget before a new one
                // takes its own
                self.session = None;
                // each restart is a new interpreter, with a random stream of its own
                let seed = self.seed ^ self.restarts.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                self.restarts += 1;
                let fresh = Session::start(&self.sandbox, &self.limits, seed)
                    .await
                    .map_err(|e| PluginError::failed(&*name, format!("starting a session: {e}")))?;
                self.session.insert(fresh)
            }
        };
        let report = session
            .call(code.as_bytes())
            .await
            .map_err(|e| PluginError::failed(&*name, format!("running a call: {e}")))?;
        let mut text = String::from_utf8_lossy(&report.stdout).into_owned();
        if report.truncated {
            text.push_str(&format!(
                "\n[output cut at {} bytes]",
                self.options.output_bytes
            ));
        }
        let ended = |why: String| {
            let mut t = text.clone();
            if !t.is_empty() && !t.ends_with('\n') {
                t.push('\n');
            }
            t.push_str(&format!(
                "[{why}; the next call starts a new interpreter: names defined before are gone]"
            ));
            ToolOutput::error(t)
        };
        Ok(match report.outcome {
            Outcome::Exited(0) => ToolOutput::ok(text),
            // the cell raised: its traceback is the answer
            Outcome::Exited(_) => ToolOutput::error(text),
            Outcome::TimeLimit => ended(format!(
                "stopped: the call ran past its limit of {} s",
                self.options.timeout_s
            )),
            Outcome::MemoryLimit => ended(match report.over_budget {
                Some(budget) => {
                    format!("stopped: the call needed more memory than is left of {budget}")
                }
                None => format!(
                    "stopped: the call needed more than {} MB of memory",
                    self.options.memory_mb
                ),
            }),
            Outcome::OutputLimit => ended("stopped: too much output".into()),
            Outcome::Trapped(why) => ended(format!("the interpreter crashed ({why})")),
        })
    }
}

fn build(config: &PluginConfig, _: &BuildContext) -> Result<Arc<dyn Tool>, PluginError> {
    let options: PythonToolOptions = config.parse()?;
    options.check(config)?;
    Ok(Arc::new(PythonTool::new(options)?))
}

register_tool!(
    NAME,
    "Python in the wasm sandbox, one session per episode (names kept between its calls)",
    build
);
