//! `[[tools]] kind = "python-function"`: a tool written as a Python function in a file, loaded
//! when the run starts and run in the wasm sandbox (the standard library, numpy, sympy and mpmath).
//!
//! ```toml
//! [[tools]]
//! kind = "python-function"
//! path = "tools/lookup.py"
//! function = "lookup"                   # the default: the file's stem
//! description = "Look a word up in the glossary."
//! parameters = { type = "object", properties = { word = { type = "string" } }, required = ["word"] }
//! ```
//!
//! The model calls it by `function`'s name with an object of arguments, which the function
//! gets as keyword arguments; what it prints, then what it returns (a string as it is,
//! anything else as its `repr`; `None`: nothing) is the answer. An exception's traceback is
//! an error answer. The file is imported once, when the run starts, and the interpreter
//! snapshotted with it; each episode gets its own interpreter from that snapshot, so module
//! state the function keeps lasts for the episode's calls and no longer. The `python` tool's
//! limits apply per call (`timeout_s`, `memory_mb`, `output_bytes`, `mode`, `fuel`).

use std::path::PathBuf;
use std::sync::Arc;

use areal_sandbox::{PYTHON_CELLS, Sandbox, SandboxError, Settings};
use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Tool, ToolSchema, ToolSession, register_tool,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::MAX_SESSIONS;
use crate::python::{Cell, PythonSession, PythonToolOptions};

/// The name the kind is registered under.
pub const PYTHON_FUNCTION: &str = "python-function";

/// Python appended to the cells' pre-initialisation: imports the user's file as a module and
/// puts `_areal_call(arguments_json)` in the cells' namespace.
const CALLER: &str = r#"
import json as _areal_json, types as _areal_types

_areal_module = _areal_types.ModuleType(MODULE)
_areal_module.__file__ = FILE
_sys.modules[MODULE] = _areal_module
try:
    exec(compile(SOURCE, FILE, "exec"), _areal_module.__dict__)
    _areal_function = getattr(_areal_module, FUNCTION, None)
    if not callable(_areal_function):
        raise LookupError("%s defines no function %r (set `function` in [[tools]])" % (FILE, FUNCTION))
except BaseException:
    # the cells' excepthook is silent: say why the import failed before failing it
    _traceback.print_exc(file=_sys.stderr)
    _sys.stderr.flush()
    raise
del SOURCE

def _areal_call(arguments):
    result = _areal_function(**_areal_json.loads(arguments))
    if result is not None:
        print(result if isinstance(result, str) else repr(result))

_areal_namespace["_areal_call"] = _areal_call
"#;

/// Options of a `python-function` tool.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonFunctionOptions {
    /// The Python file, relative to the working directory.
    pub path: PathBuf,
    /// The function, and the name the model calls it by. By default the file's stem.
    pub function: Option<String>,
    /// What the model is told it does.
    pub description: String,
    /// JSON Schema of its arguments (an object). By default an object of no properties.
    #[serde(default = "no_parameters")]
    pub parameters: Value,
    /// CPU time of one call, in seconds (in deterministic mode a fuel budget replaces it).
    #[serde(default = "defaults::timeout_s")]
    pub timeout_s: f64,
    /// Linear memory of one episode's interpreter, in MiB.
    #[serde(default = "defaults::memory_mb")]
    pub memory_mb: usize,
    /// What one call may print before the rest is cut, in bytes.
    #[serde(default = "defaults::output_bytes")]
    pub output_bytes: usize,
    /// `fast` or `deterministic`.
    #[serde(default)]
    pub mode: areal_sandbox::Mode,
    /// Fuel of one call in deterministic mode.
    #[serde(default = "defaults::fuel")]
    pub fuel: u64,
}

fn no_parameters() -> Value {
    json!({"type": "object", "properties": {}})
}

mod defaults {
    use super::PythonToolOptions;

    pub(super) fn timeout_s() -> f64 {
        PythonToolOptions::default().timeout_s
    }
    pub(super) fn memory_mb() -> usize {
        PythonToolOptions::default().memory_mb
    }
    pub(super) fn output_bytes() -> usize {
        PythonToolOptions::default().output_bytes
    }
    pub(super) fn fuel() -> u64 {
        PythonToolOptions::default().fuel
    }
}

/// A Python function as a tool (see the module's documentation).
pub struct PythonFunction {
    name: Arc<str>,
    description: String,
    parameters: Value,
    limits: PythonToolOptions,
    sandbox: Arc<Sandbox>,
}

impl std::fmt::Debug for PythonFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonFunction")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[areal_sdk::async_trait]
impl Tool for PythonFunction {
    fn name(&self) -> &str {
        PYTHON_FUNCTION
    }

    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: self.name.to_string(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
        }
    }

    async fn open(&self, seed: u64) -> Result<Box<dyn ToolSession>, PluginError> {
        Ok(Box::new(PythonSession {
            sandbox: self.sandbox.clone(),
            limits: self.limits.limits(),
            options: self.limits.clone(),
            seed,
            session: None,
            restarts: 0,
            cell: Cell::Function,
            name: self.name.clone(),
        }))
    }
}

fn build(config: &PluginConfig, _: &BuildContext) -> Result<Arc<dyn Tool>, PluginError> {
    let o: PythonFunctionOptions = config.parse()?;
    let limits = PythonToolOptions {
        timeout_s: o.timeout_s,
        memory_mb: o.memory_mb,
        output_bytes: o.output_bytes,
        mode: o.mode,
        fuel: o.fuel,
    };
    limits.check(config)?;
    let file = o.path.display().to_string();
    let source = std::fs::read_to_string(&o.path)
        .map_err(|e| config.invalid("path", format!("{file} cannot be read as text: {e}")))?;
    let stem = o
        .path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let function = o.function.clone().unwrap_or_else(|| stem.to_owned());
    if function.is_empty()
        || !function
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(config.invalid(
            "function",
            format!("a Python function's name (letters, digits, _), found {function:?}"),
        ));
    }
    if o.parameters.get("type") != Some(&json!("object")) {
        return Err(config.invalid(
            "parameters",
            format!(
                "a JSON Schema of an object (type = \"object\"), found {}",
                o.parameters
            ),
        ));
    }
    let literal = |s: &str| serde_json::to_string(s).expect("a string is JSON");
    let module = if stem.is_empty() { "tool" } else { stem };
    let preinit = format!(
        "{PYTHON_CELLS}\nSOURCE = {}\nFILE = {}\nMODULE = {}\nFUNCTION = {}\n{CALLER}",
        literal(&source),
        literal(&file),
        literal(module),
        literal(&function),
    );
    let mut import_limits = limits.limits();
    import_limits.cpu = std::time::Duration::from_secs(30);
    import_limits.wall = std::time::Duration::from_secs(130);
    let sandbox = Sandbox::new(&Settings {
        mode: o.mode,
        preinit: Some(preinit),
        preinit_limits: Some(import_limits),
        instances: Some(MAX_SESSIONS),
        ..Settings::default()
    })
    .map_err(|e| {
        let text = match e {
            SandboxError::Preinit(why) => why,
            other => other.to_string(),
        };
        let text = text.trim();
        config.invalid("path", format!("{file}: importing it failed: {text}"))
    })?;
    Ok(Arc::new(PythonFunction {
        name: function.into(),
        description: o.description,
        parameters: o.parameters,
        limits,
        sandbox: Arc::new(sandbox),
    }))
}

register_tool!(
    PYTHON_FUNCTION,
    "a Python function from a file, loaded at run time, run in the wasm sandbox",
    build
);
