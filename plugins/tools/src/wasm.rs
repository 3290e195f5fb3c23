//! `[[tools]] kind = "wasm"`: a tool compiled to a WebAssembly component (the world `tool` of
//! `sdk/guest/wit/tool.wit`; in Rust, `areal_reward_guest::tool`), loaded when the run starts.
//!
//! ```toml
//! [[tools]]
//! kind = "wasm"
//! path = ".cache/components/tally.wasm"
//! options = { start = 0 }    # the component's `describe` and `open` get them as JSON
//! timeout_s = 1.0            # CPU time of one call
//! memory_mb = 64             # linear memory of one episode's instance
//! output_bytes = 4096        # the answer is cut past this; printing more stops the call
//! ```
//!
//! The component describes itself (its name, description and parameters) when the run
//! starts, so options it refuses stop the run there. Each episode gets an instance of its own
//! at its first call, kept for its later calls; a call stopped by a limit or a trap costs the
//! instance (the model reads why) and the next call opens a new one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use areal_sandbox::{
    Grants, Limits, Mode, ToolCallOutcome, ToolHost, ToolInstance, component_cache_dir,
    describe_stop,
};
use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Tool, ToolOutput, ToolSchema, ToolSession,
    register_tool,
};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::python::{call_limits, check_call_limits};

/// The registered name.
pub const WASM: &str = "wasm";

/// The `[[tools]]` options of `wasm`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WasmToolOptions {
    /// The component (`.wasm`). Required.
    pub path: PathBuf,
    /// Options given to the component's `describe` and `open`, as a JSON object.
    pub options: Map<String, Value>,
    /// CPU time of one call, in seconds (in deterministic mode a fuel budget replaces it).
    pub timeout_s: f64,
    /// Linear memory of one episode's instance, in MiB.
    pub memory_mb: usize,
    /// What one answer may hold before the rest is cut, in bytes (and what a call may print).
    pub output_bytes: usize,
    /// `fast` (CPU time) or `deterministic` (fuel, fixed clock, seeded random source).
    pub mode: Mode,
    /// Fuel of one call in deterministic mode.
    pub fuel: u64,
}

impl Default for WasmToolOptions {
    fn default() -> Self {
        Self {
            path: PathBuf::new(),
            options: Map::new(),
            timeout_s: 5.0,
            memory_mb: 256,
            output_bytes: 4096,
            mode: Mode::Fast,
            fuel: 10_000_000_000,
        }
    }
}

impl WasmToolOptions {
    fn check(&self, config: &PluginConfig) -> Result<(), PluginError> {
        if self.path.as_os_str().is_empty() {
            return Err(config.invalid("path", "the component's file is required"));
        }
        check_call_limits(
            config,
            self.timeout_s,
            self.memory_mb,
            1..=4096,
            self.output_bytes,
        )
    }

    fn limits(&self) -> Limits {
        call_limits(self.timeout_s, self.memory_mb, self.output_bytes, self.fuel)
    }
}

/// A tool component (see the module's documentation).
#[derive(Debug)]
pub struct WasmTool {
    host: Arc<ToolHost>,
    schema: ToolSchema,
    options: WasmToolOptions,
    options_json: Arc<str>,
}

impl WasmTool {
    /// Load the component `options.path` names and ask it to describe itself. Not inside an
    /// async context (loading blocks).
    pub fn load(options: WasmToolOptions) -> Result<Self, PluginError> {
        let file = options.path.display().to_string();
        let failed = |m: String| PluginError::failed(WASM, format!("{file}: {m}"));
        let host = ToolHost::load(
            &options.path,
            options.mode,
            &component_cache_dir(),
            Grants::default(),
        )
        .map_err(|e| failed(e.to_string()))?;
        let options_json: Arc<str> = Value::Object(options.options.clone()).to_string().into();
        let described = host
            .describe_blocking(&options_json, &options.limits())
            .map_err(|e| failed(e.to_string()))?
            .map_err(|refusal| {
                PluginError::config("options", format!("{file} refused its options: {refusal}"))
            })?;
        let schema: ToolSchema = serde_json::from_str(&described).map_err(|e| {
            failed(format!(
                "describe answered {described:?}, not {{\"name\", \"description\", \"parameters\"}}: {e}"
            ))
        })?;
        if schema.name.is_empty() || !schema.parameters.is_object() {
            return Err(failed(format!(
                "describe must name the tool and give its parameters as a JSON Schema object; \
                 it answered {described:?}"
            )));
        }
        Ok(Self {
            host: Arc::new(host),
            schema,
            options,
            options_json,
        })
    }

    /// The component's sha256.
    pub fn sha256(&self) -> &str {
        self.host.sha256()
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.options.path
    }
}

#[areal_sdk::async_trait]
impl Tool for WasmTool {
    fn name(&self) -> &str {
        WASM
    }

    fn schema(&self) -> ToolSchema {
        self.schema.clone()
    }

    async fn open(&self, seed: u64) -> Result<Box<dyn ToolSession>, PluginError> {
        Ok(Box::new(WasmSession {
            host: self.host.clone(),
            options: self.options.clone(),
            options_json: self.options_json.clone(),
            name: self.schema.name.clone(),
            seed,
            restarts: 0,
            instance: None,
        }))
    }
}

/// One episode's instance, opened at its first call and again after a call that cost it.
struct WasmSession {
    host: Arc<ToolHost>,
    options: WasmToolOptions,
    options_json: Arc<str>,
    name: String,
    seed: u64,
    restarts: u64,
    instance: Option<ToolInstance>,
}

/// `text` cut to at most `max` bytes, on a character boundary, saying so.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(&format!("\n[answer cut at {max} bytes]"));
    }
    text
}

#[areal_sdk::async_trait]
impl ToolSession for WasmSession {
    async fn call(&mut self, arguments: &Map<String, Value>) -> Result<ToolOutput, PluginError> {
        let limits = self.options.limits();
        let instance = match &mut self.instance {
            Some(instance) => instance,
            None => {
                // each new instance draws from a stream of its own
                let seed = self.seed ^ self.restarts.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                self.restarts += 1;
                let opened = self
                    .host
                    .open(&self.options_json, seed, &limits)
                    .await
                    .map_err(|e| PluginError::failed(&*self.name, e.to_string()))?;
                match opened {
                    Ok(instance) => self.instance.insert(instance),
                    Err(refusal) => {
                        return Ok(ToolOutput::error(format!(
                            "{}: could not start: {refusal}",
                            self.name
                        )));
                    }
                }
            }
        };
        let arguments = Value::Object(arguments.clone()).to_string();
        let report = instance.call(&arguments, &limits).await;
        let max = self.options.output_bytes;
        Ok(match report.outcome {
            ToolCallOutcome::Answered(text) => ToolOutput::ok(cut(text, max)),
            ToolCallOutcome::Refused(text) => ToolOutput::error(cut(text, max)),
            ToolCallOutcome::Stopped(outcome) => {
                self.instance = None;
                let why = match report.over_budget {
                    Some(budget) => {
                        format!("it would have taken more memory than is left of {budget}")
                    }
                    None => describe_stop(&outcome),
                };
                ToolOutput::error(format!(
                    "[{}: stopped: {why}; the next call starts a new instance: what it kept is gone]",
                    self.name,
                ))
            }
        })
    }
}

fn build(config: &PluginConfig, _: &BuildContext) -> Result<Arc<dyn Tool>, PluginError> {
    let options: WasmToolOptions = config.parse()?;
    options.check(config)?;
    WasmTool::load(options)
        .map(|tool| Arc::new(tool) as Arc<dyn Tool>)
        .map_err(|e| match e {
            PluginError::Config { message, .. } => config.invalid("options", message),
            other => other,
        })
}

register_tool!(
    WASM,
    "a tool compiled to a WebAssembly component (world `tool` of sdk/guest/wit), one instance per episode",
    build
);
