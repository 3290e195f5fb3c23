//! `[reward] kind = "python"`: a reward function in a Python file, run by the sandbox's WASI
//! CPython (the standard library, numpy, sympy and mpmath: no other packages).
//!
//! ```toml
//! [reward]
//! kind = "python"
//! path = "my_reward.py"
//! function = "compute_score"   # the default
//! signature = "verl"           # the default; or "areal"
//! options = { strict = true }  # keyword arguments of every call
//! ```
//!
//! The file is imported once, when the run starts, and the interpreter is snapshotted with
//! it imported; every sample runs in a fresh instance of that snapshot (~2 ms of start-up).
//! The function returns a number or a dict with a number `score`: its other keys are kept as
//! details, and `verdict` (optional) names the verdict; without it, a score of 1 or more is
//! `accepted`, 0 or less `wrong_answer`, and anything between `partial`. An exception costs the
//! sample, with its traceback in the error.

use std::sync::Arc;

use areal_sandbox::{Mode, Outcome, Run, Sandbox, SandboxError, Settings};
use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, VerifyContext,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::{
    Options, PluginProvenance, metadata_of, reward, seed_of, sha256_hex, stderr_note, stopped,
    verdict_named, verdict_of,
};

/// The name the kind is registered under.
pub const NAME: &str = "python";

const HARNESS: &str = include_str!("harness.py");
const MARK: &[u8] = b"\x1eareal-reward\x1e";

/// A Python reward file, imported in a snapshotted interpreter.
#[derive(Debug)]
pub struct PythonReward {
    sandbox: Sandbox,
    options: Options,
    provenance: PluginProvenance,
}

/// What the harness says back.
#[derive(Deserialize)]
struct Reply {
    score: Option<f64>,
    #[serde(default)]
    details: Map<String, Value>,
    verdict: Option<String>,
    error: Option<String>,
}

impl PythonReward {
    /// Import `options.path` in the sandbox's interpreter and snapshot it.
    pub fn load(options: Options) -> Result<Self, PluginError> {
        let file = options.path.display().to_string();
        let source = std::fs::read_to_string(&options.path).map_err(|e| {
            PluginError::config("reward.path", format!("{file} cannot be read as text: {e}"))
        })?;
        let function = options.function.as_deref().unwrap_or("compute_score");
        let signature = options.signature.as_deref().unwrap_or("verl");
        let module = options
            .path
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .unwrap_or("reward");
        let literal = |s: &str| serde_json::to_string(s).expect("a string is JSON");
        let preinit = format!(
            "SOURCE = {}\nFILE = {}\nMODULE = {}\nFUNCTION = {}\nSIGNATURE = {}\n{HARNESS}",
            literal(&source),
            literal(&file),
            literal(module),
            literal(function),
            literal(signature)
        );
        let import_cpu = std::time::Duration::from_secs_f64(options.import_s.unwrap_or(30.0));
        let mut import_limits = options.limits(NAME);
        import_limits.cpu = import_cpu;
        import_limits.wall = import_cpu * 4 + std::time::Duration::from_secs(10);
        let sandbox = Sandbox::new(&Settings {
            mode: options.mode,
            preinit: Some(preinit),
            preinit_limits: Some(import_limits),
            ..Settings::default()
        })
        .map_err(|e| {
            let text = match e {
                SandboxError::Preinit(why) => why,
                other => other.to_string(),
            };
            let text = text.trim();
            PluginError::failed(NAME, format!("{file}: importing it failed: {text}"))
        })?;
        let provenance = PluginProvenance {
            file,
            sha256: sha256_hex(source.as_bytes()),
            dirs: Vec::new(),
            version: format!(
                "areal-reward-plugin {}; {function} ({signature}); guest sha256 {}; wasmtime {}",
                env!("CARGO_PKG_VERSION"),
                sandbox.guest_sha256(),
                areal_sandbox::wasmtime_version()
            ),
            limits: options.limits_json(NAME),
        };
        Ok(Self {
            sandbox,
            options,
            provenance,
        })
    }

    /// The sha256 of the file's source.
    pub fn sha256(&self) -> &str {
        &self.provenance.sha256
    }
}

impl RewardVerifier for PythonReward {
    fn name(&self) -> &str {
        NAME
    }

    fn verify(&self, input: &RewardInput, ctx: &VerifyContext) -> Result<Reward, PluginError> {
        let file = &self.provenance.file;
        let fail = |m: String| PluginError::failed(NAME, format!("{file}: {m}"));
        let (metadata, data_source) = metadata_of(input);
        let job = json!({
            "data_source": data_source,
            "prompt": input.prompt,
            "completion": input.completion,
            "completion_ids": input.completion_ids,
            "reference": input.reference,
            "metadata": metadata,
            "options": self.options.options,
            "env": self.options.env,
            "nonce": nonce(),
        });
        let limits = self
            .options
            .limits_within(NAME, ctx)
            .ok_or_else(|| fail("the deadline passed before the plugin ran".into()))?;
        let run = Run {
            args: Vec::new(),
            // the harness sets os.environ from the job (the snapshot's was read at its start)
            env: Vec::new(),
            stdin: job.to_string().into_bytes(),
            limits: limits.clone(),
            seed: seed_of(input),
        };
        let report = self
            .sandbox
            .run_blocking(&run)
            .map_err(|e| fail(e.to_string()))?;
        match &report.outcome {
            Outcome::Exited(0) => {}
            other => {
                let why = match other {
                    Outcome::Exited(_) | Outcome::Trapped(_) => {
                        format!(
                            "the interpreter {}",
                            stopped(other, &limits, self.options.mode)
                        )
                    }
                    _ => stopped(other, &limits, self.options.mode),
                };
                return Err(fail(format!("{why}{}", stderr_note(&report.stderr))));
            }
        }
        let mark = [
            MARK,
            job["nonce"].as_str().unwrap_or_default().as_bytes(),
            b"\x1e",
        ]
        .concat();
        let replies: Vec<usize> = report
            .stdout
            .windows(mark.len())
            .enumerate()
            .filter_map(|(i, w)| (w == mark).then_some(i))
            .collect();
        let at = match replies[..] {
            [at] => at,
            [] => {
                return Err(fail(format!(
                    "the harness said nothing back{}",
                    stderr_note(&report.stderr)
                )));
            }
            _ => {
                return Err(fail(format!(
                    "the run wrote {} replies with this run's nonce, where the harness writes one",
                    replies.len()
                )));
            }
        };
        let reply: Reply = serde_json::from_slice(&report.stdout[at + mark.len()..])
            .map_err(|e| fail(format!("the harness's reply is not JSON: {e}")))?;
        if let Some(error) = reply.error {
            return Err(fail(error.trim_end().to_owned()));
        }
        let score = reply
            .score
            .ok_or_else(|| fail("the harness's reply has no score".into()))?;
        let verdict = match &reply.verdict {
            Some(name) => verdict_named(name).map_err(&fail)?,
            None => verdict_of(score),
        };
        let fuel = (self.options.mode == Mode::Deterministic)
            .then_some(report.fuel)
            .flatten();
        reward(score, verdict, reply.details, &self.provenance, fuel).map_err(fail)
    }

    fn cache_identity(&self) -> Option<String> {
        Some(self.provenance.cache_identity(&self.options))
    }
}

/// A run's nonce: 128 bits the guest cannot predict (the process's random hash keys, drawn
/// from the OS, over a counter), marking the harness's one reply.
fn nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let half = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_u64(salt);
        h.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

pub(crate) fn build(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    let options = Options::parse(config, NAME)?;
    Ok(Arc::new(PythonReward::load(options)?))
}
