//! Reward plugins loaded at run time, no rebuilt `areal` needed, both run in the sandbox:
//!
//! - `[reward] kind = "wasm"`: a WebAssembly component implementing `areal:reward`
//!   (`sdk/guest/wit/reward.wit`; in Rust, the `areal-reward-guest` crate), see [`wasm`];
//! - `[reward] kind = "python"`: a Python file with verl's `compute_score` (or AReaL's
//!   signature), run by the WASI CPython (the standard library, numpy, sympy, mpmath), see
//!   [`python`].
//!
//! Both take the sandbox's limits as keys of `[reward]` ([`Options`]): per sample, CPU time
//! (`cpu_s`, or a fuel budget in `mode = "deterministic"`), wall time, memory and output. A
//! plugin that errs, traps, loops, hoards memory or floods its output costs that one sample
//! (an error naming the plugin's file and what happened); one that cannot be loaded (a bad
//! file, options it refuses, an import that never returns) stops the run at start.

pub mod python;
pub mod wasm;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use areal_sandbox::{Limits, Mode, Outcome};
use areal_sdk::{PluginConfig, PluginError, Reward, RewardInput, Verdict, VerifyContext};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// The keys of `[reward]` for both kinds (each kind refuses the keys of the other).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// The plugin's file (`.wasm` or `.py`), relative to the working directory.
    pub path: PathBuf,
    /// The plugin's own options: a component's `configure` gets them as JSON; a Python
    /// function gets them as keyword arguments (verl's `reward_kwargs`).
    #[serde(default)]
    pub options: Map<String, Value>,
    /// `fast` (CPU-time limits) or `deterministic` (a fuel budget, a fixed clock and a random
    /// source seeded by the sample: the same sample gets the same reward, bit for bit).
    #[serde(default)]
    pub mode: Mode,
    /// CPU time per sample, in seconds: the CPU time of the thread running the plugin, so a
    /// busy machine does not change a verdict. By default 5.
    #[serde(default = "default_cpu_s")]
    pub cpu_s: f64,
    /// Wall time per sample, in seconds, the backstop; 0 (the default) is `4 × cpu_s + 5`.
    #[serde(default)]
    pub wall_s: f64,
    /// Linear memory per sample, in MiB. By default 64 for a component, 256 for Python (the
    /// interpreter alone takes ~90).
    pub memory_mb: Option<usize>,
    /// What a sample's run may print on stdout, in bytes; more is an error. By default 1 MiB.
    #[serde(default = "default_output_bytes")]
    pub output_bytes: usize,
    /// The fuel budget per sample in deterministic mode. By default 10¹⁰.
    #[serde(default = "default_fuel")]
    pub fuel: u64,
    /// Environment variables the plugin sees (none by default).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Component only: host folders mounted read-only, as `"host_path:guest_path"`.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Python only: the function to call. By default `compute_score`.
    pub function: Option<String>,
    /// Python only: `verl` (the default) — `compute_score(data_source, solution_str,
    /// ground_truth, extra_info, **options)` — or `areal` — `fn(prompt, completions,
    /// prompt_ids, completion_ids, **reference_fields, **options)`.
    pub signature: Option<String>,
    /// Python only: CPU seconds the file's import may take, once, when the run starts. By
    /// default 30.
    pub import_s: Option<f64>,
}

fn default_cpu_s() -> f64 {
    5.0
}
fn default_output_bytes() -> usize {
    1 << 20
}
fn default_fuel() -> u64 {
    10_000_000_000
}

/// The most CPU time per sample a plugin may be given, in seconds.
pub const MAX_CPU_S: f64 = 3600.0;

impl Options {
    /// Parse `[reward]` for `kind` and check every value, naming the key.
    pub(crate) fn parse(config: &PluginConfig, kind: &str) -> Result<Self, PluginError> {
        let o: Options = config.parse()?;
        let python = kind == python::NAME;
        let only = |set: bool, key: &str, owner: &str| {
            if set {
                Err(config.invalid(key, format!("is a key of `kind = \"{owner}\"` only")))
            } else {
                Ok(())
            }
        };
        if python {
            only(!o.dirs.is_empty(), "dirs", wasm::NAME)?;
        } else {
            only(o.function.is_some(), "function", python::NAME)?;
            only(o.signature.is_some(), "signature", python::NAME)?;
            only(o.import_s.is_some(), "import_s", python::NAME)?;
        }
        let seconds = |key: &str, v: f64| {
            if v > 0.0 && v <= MAX_CPU_S {
                Ok(())
            } else {
                Err(config.invalid(
                    key,
                    format!("{v:?} is not a number of seconds in (0, {MAX_CPU_S}]"),
                ))
            }
        };
        seconds("cpu_s", o.cpu_s)?;
        if o.wall_s != 0.0 {
            seconds("wall_s", o.wall_s)?;
        }
        if let Some(s) = o.import_s {
            seconds("import_s", s)?;
        }
        let least = if python { 128 } else { 1 };
        if let Some(mb) = o.memory_mb
            && !(least..=4096).contains(&mb)
        {
            return Err(config.invalid(
                "memory_mb",
                format!(
                    "{mb} MiB is outside {least}..=4096 (a wasm32 guest addresses 4 GiB{})",
                    if python {
                        "; the interpreter needs 128"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if !(1024..=1 << 30).contains(&o.output_bytes) {
            return Err(config.invalid(
                "output_bytes",
                format!("{} bytes is outside 1024..=1073741824", o.output_bytes),
            ));
        }
        if o.fuel < 1_000_000 {
            return Err(config.invalid("fuel", format!("{} is below 1000000", o.fuel)));
        }
        if let Some(s) = &o.signature
            && s != "verl"
            && s != "areal"
        {
            return Err(config.invalid(
                "signature",
                format!("{s:?} is neither \"verl\" nor \"areal\""),
            ));
        }
        if !o.path.is_file() {
            let cwd = std::env::current_dir().unwrap_or_default();
            return Err(config.invalid(
                "path",
                format!(
                    "{} is not a file (relative paths start at {})",
                    o.path.display(),
                    cwd.display()
                ),
            ));
        }
        Ok(o)
    }

    /// The sandbox limits of one sample.
    pub fn limits(&self, kind: &str) -> Limits {
        let cpu = Duration::from_secs_f64(self.cpu_s);
        let wall = if self.wall_s > 0.0 {
            Duration::from_secs_f64(self.wall_s)
        } else {
            cpu * 4 + Duration::from_secs(5)
        };
        let memory_mb = self
            .memory_mb
            .unwrap_or(if kind == python::NAME { 256 } else { 64 });
        Limits {
            cpu,
            wall,
            memory_bytes: memory_mb << 20,
            stdout_bytes: self.output_bytes,
            stderr_bytes: 64 << 10,
            fuel: self.fuel,
        }
    }

    /// The limits of a sample that must be done by `ctx`'s deadline (the engine stops waiting
    /// there, so the run stops there too); `None` when the deadline has passed already.
    pub(crate) fn limits_within(&self, kind: &str, ctx: &VerifyContext) -> Option<Limits> {
        if ctx.expired() {
            return None;
        }
        let mut limits = self.limits(kind);
        limits.wall = limits.wall.min(ctx.remaining());
        Some(limits)
    }

    /// The limits as provenance records them.
    fn limits_json(&self, kind: &str) -> Map<String, Value> {
        let l = self.limits(kind);
        let mut m = Map::new();
        m.insert("mode".into(), self.mode.as_str().into());
        m.insert("cpu_s".into(), l.cpu.as_secs_f64().into());
        m.insert("wall_s".into(), l.wall.as_secs_f64().into());
        m.insert("memory_mb".into(), ((l.memory_bytes >> 20) as u64).into());
        m.insert("output_bytes".into(), (l.stdout_bytes as u64).into());
        if self.mode == Mode::Deterministic {
            m.insert("fuel".into(), l.fuel.into());
        }
        m
    }
}

/// What the plugin sees of a sample beside prompt, completion and reference: the caller's
/// metadata with `item_id`, `finish_reason` and `completion_tokens`, and the data source
/// (`metadata.data_source`, else ""). Not the sample's id: the reward cache keys rewards by
/// everything a plugin sees, and a reward must not depend on which sample it was.
pub(crate) fn metadata_of(input: &RewardInput) -> (Map<String, Value>, String) {
    let mut m = input.metadata.clone();
    m.insert("item_id".into(), input.item_id.clone().into());
    m.insert(
        "finish_reason".into(),
        serde_json::to_value(input.finish_reason).unwrap_or(Value::Null),
    );
    m.insert(
        "completion_tokens".into(),
        (input.completion_ids.len() as u64).into(),
    );
    let source = m
        .get("data_source")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    (m, source)
}

/// The seed of a sample's run in deterministic mode: from its content (prompt, completion,
/// reference), so the same sample always draws the same numbers.
pub(crate) fn seed_of(input: &RewardInput) -> u64 {
    let mut h = Sha256::new();
    for part in [
        input.prompt.as_bytes(),
        input.completion.as_bytes(),
        input.reference.to_string().as_bytes(),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    let d = h.finalize();
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
}

/// The sha256 of a file's bytes, in hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Why a run that the sandbox stopped failed, in words.
pub(crate) fn stopped(outcome: &Outcome, limits: &Limits, mode: Mode) -> String {
    match outcome {
        Outcome::TimeLimit if mode == Mode::Deterministic => format!(
            "ran out of its fuel budget of {} (or its wall-time limit of {:.1} s)",
            limits.fuel,
            limits.wall.as_secs_f64()
        ),
        Outcome::TimeLimit => format!(
            "ran past its CPU-time limit of {:.1} s (or its wall-time limit of {:.1} s)",
            limits.cpu.as_secs_f64(),
            limits.wall.as_secs_f64()
        ),
        Outcome::MemoryLimit => format!(
            "used more than its memory limit of {} MiB",
            limits.memory_bytes >> 20
        ),
        Outcome::OutputLimit => format!(
            "printed more than its output limit of {} bytes",
            limits.stdout_bytes
        ),
        Outcome::Trapped(trap) => format!("trapped: {trap}"),
        Outcome::Exited(code) => format!("exited with status {code}"),
    }
}

/// The end of a guest's stderr (its last 2000 bytes) for an error message: `"; its stderr
/// ends: ..."`, or nothing when it wrote none.
pub(crate) fn stderr_note(stderr: &[u8]) -> String {
    let start = stderr.len().saturating_sub(2000);
    let tail = String::from_utf8_lossy(&stderr[start..]).trim().to_owned();
    if tail.is_empty() {
        String::new()
    } else {
        format!("; its stderr ends: {tail}")
    }
}

/// The verdict a plugin named, checked: the engine's own failure verdicts are not for it.
pub(crate) fn verdict_named(name: &str) -> Result<Verdict, String> {
    let v: Verdict = serde_json::from_value(json!(name)).map_err(|_| {
        format!("verdict {name:?} is not one of accepted, partial, wrong_answer, no_answer, no_code, runtime_error, time_limit, memory_limit, output_limit")
    })?;
    if v.is_failure() {
        return Err(format!(
            "verdict {name:?} is the engine's own; return an error instead"
        ));
    }
    Ok(v)
}

/// The verdict of a bare score: accepted at 1 or more, wrong at 0 or less, partial between.
pub(crate) fn verdict_of(score: f64) -> Verdict {
    if score >= 1.0 {
        Verdict::Accepted
    } else if score <= 0.0 {
        Verdict::WrongAnswer
    } else {
        Verdict::Partial
    }
}

/// A reward from a plugin's score, with the plugin's provenance.
pub(crate) fn reward(
    score: f64,
    verdict: Verdict,
    details: Map<String, Value>,
    prov: &PluginProvenance,
    fuel: Option<u64>,
) -> Result<Reward, String> {
    Reward::check_value(score).map_err(|why| format!("returned {why}"))?;
    let mut r = Reward::new(score, verdict).with_version(prov.version.clone());
    r.provenance.limits = prov.limits.clone();
    r.provenance.details = details;
    r.provenance
        .details
        .insert("plugin".into(), prov.file.clone().into());
    r.provenance
        .details
        .insert("plugin_sha256".into(), prov.sha256.clone().into());
    r.provenance.fuel = fuel;
    Ok(r)
}

/// The identity of the host folders a component reads (`host:guest` each): every file and
/// folder under each, by name, size and modification time, hashed — so that a file edited
/// between two runs gives the plugin another cache identity. (Contents are not read: a
/// mounted dataset may be large; any write changes a file's modification time.)
pub(crate) fn dirs_identity(dirs: &[(PathBuf, String)]) -> Result<Vec<String>, String> {
    let mut out = Vec::with_capacity(dirs.len());
    for (host, guest) in dirs {
        let mut h = Sha256::new();
        let mut todo = vec![host.clone()];
        while let Some(dir) = todo.pop() {
            let read = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let mut entries: Vec<_> = read.filter_map(Result::ok).collect();
            entries.sort_by_key(|e| e.file_name());
            for entry in entries {
                let path = entry.path();
                let meta =
                    std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                let modified = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .unwrap_or_default();
                let name = path.strip_prefix(host).unwrap_or(&path).to_string_lossy();
                h.update(format!("{name}\0{}\0{}\0", meta.len(), modified.as_nanos()));
                if meta.is_dir() {
                    todo.push(path);
                }
            }
        }
        let digest = sha256_hex(&h.finalize());
        out.push(format!("{}:{guest}:{}", host.display(), &digest[..16]));
    }
    Ok(out)
}

/// What every reward of a plugin records of it.
#[derive(Clone, Debug)]
pub(crate) struct PluginProvenance {
    pub(crate) file: String,
    pub(crate) sha256: String,
    /// What the plugin reads of the host's files, for its cache identity: each folder it
    /// mounts, with a digest of what it holds when loaded (names, sizes, contents).
    pub(crate) dirs: Vec<String>,
    pub(crate) version: String,
    pub(crate) limits: Map<String, Value>,
}

impl PluginProvenance {
    /// The identity of the plugin's rewards for the reward cache: everything of the plugin
    /// that its function can see or that bounds it — the file's sha256, the version (the
    /// function and signature it calls, the guest and wasmtime), its options, its
    /// environment, the folders it reads, its limits. (The sample's part is the cache's key.)
    pub(crate) fn cache_identity(&self, options: &Options) -> String {
        format!(
            "{}; sha256 {}; options {}; env {}; dirs {}; limits {}",
            self.version,
            self.sha256,
            Value::Object(options.options.clone()),
            serde_json::to_string(&options.env).expect("strings are JSON"),
            serde_json::to_string(&self.dirs).expect("strings are JSON"),
            Value::Object(self.limits.clone())
        )
    }
}

areal_sdk::register_reward!(
    wasm::NAME,
    "a reward plugin compiled to a WebAssembly component (areal:reward), run in the sandbox",
    wasm::build
);
areal_sdk::register_reward!(
    python::NAME,
    "a reward function in a Python file (verl's compute_score), run by the sandbox's WASI CPython",
    python::build
);
