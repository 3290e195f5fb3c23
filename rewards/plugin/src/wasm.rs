//! `[reward] kind = "wasm"`: a reward compiled to a WebAssembly component.
//!
//! ```toml
//! [reward]
//! kind = "wasm"
//! path = ".cache/components/chain-sum.wasm"
//! options = { wrong = 0.0 }   # the component's `configure` gets them as JSON
//! cpu_s = 2.0                 # and the other limits of `Options`
//! ```
//!
//! The component is compiled once and cached (`~/.cache/areal-rs/components`, keyed by its
//! sha256, wasmtime's version and the engine's settings); `configure` runs once at load, so
//! options it refuses stop the run at start. Every sample then runs in a fresh instance.

use std::path::PathBuf;
use std::sync::Arc;

use areal_sandbox::{CallOutcome, ComponentHost, Grants, GuestVerdict, MAX_REPLY_BYTES, Sample};
use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, Verdict,
    VerifyContext,
};
use serde_json::{Map, Value};

use crate::{Options, PluginProvenance, metadata_of, reward, seed_of, stderr_note, stopped};

/// The name the kind is registered under.
pub const NAME: &str = "wasm";

/// A reward component.
#[derive(Debug)]
pub struct WasmReward {
    host: ComponentHost,
    options_json: String,
    options: Options,
    provenance: PluginProvenance,
}

/// Where compiled components are cached: `$AREAL_COMPONENT_CACHE`, else
/// `~/.cache/areal-rs/components`, else the temporary folder's `areal-rs-components`.
pub fn cache_dir() -> PathBuf {
    areal_sandbox::component_cache_dir()
}

impl WasmReward {
    /// Load the component `options.path` names and check its options with `configure`.
    pub fn load(options: Options) -> Result<Self, PluginError> {
        let file = options.path.display().to_string();
        let mut grants = Grants {
            env: options
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            dirs: Vec::new(),
        };
        for d in &options.dirs {
            let (host, guest) = d.split_once(':').ok_or_else(|| {
                PluginError::config(
                    "reward.dirs",
                    format!("{d:?} is not \"host_path:guest_path\""),
                )
            })?;
            grants.dirs.push((PathBuf::from(host), guest.to_owned()));
        }
        let grants_dirs = grants.dirs.clone();
        let host = ComponentHost::load(&options.path, options.mode, &cache_dir(), grants)
            .map_err(|e| PluginError::failed(NAME, e.to_string()))?;
        let limits = options.limits(NAME);
        let options_json = Value::Object(options.options.clone()).to_string();
        let check = host
            .call_blocking(&options_json, None, &limits, 0)
            .map_err(|e| PluginError::failed(NAME, format!("{file}: {e}")))?;
        match check.outcome {
            CallOutcome::Configured => {}
            CallOutcome::Refused(m) => {
                return Err(PluginError::config(
                    "reward.options",
                    format!("{file} refused its options: {}", clip(&m)),
                ));
            }
            CallOutcome::Stopped(o) => {
                return Err(PluginError::failed(
                    NAME,
                    format!(
                        "{file}: configure {}{}",
                        stopped(&o, &limits, options.mode),
                        stderr_note(&check.stderr)
                    ),
                ));
            }
            CallOutcome::Scored(_) => {
                return Err(PluginError::failed(
                    NAME,
                    format!("{file}: scored without a sample"),
                ));
            }
        }
        let dirs = crate::dirs_identity(&grants_dirs)
            .map_err(|e| PluginError::config("reward.dirs", e))?;
        let provenance = PluginProvenance {
            file,
            sha256: host.sha256().to_owned(),
            dirs,
            version: format!(
                "areal-reward-plugin {}; {}",
                env!("CARGO_PKG_VERSION"),
                host.version()
            ),
            limits: options.limits_json(NAME),
        };
        Ok(Self {
            host,
            options_json,
            options,
            provenance,
        })
    }

    /// The component's sha256.
    pub fn sha256(&self) -> &str {
        self.host.sha256()
    }
}

fn clip(message: &str) -> &str {
    let mut end = message.len().min(4000);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

impl RewardVerifier for WasmReward {
    fn name(&self) -> &str {
        NAME
    }

    fn verify(&self, input: &RewardInput, ctx: &VerifyContext) -> Result<Reward, PluginError> {
        let file = &self.provenance.file;
        let fail = |m: String| PluginError::failed(NAME, format!("{file}: {m}"));
        let limits = self
            .options
            .limits_within(NAME, ctx)
            .ok_or_else(|| fail("the deadline passed before the plugin ran".into()))?;
        let (metadata, _) = metadata_of(input);
        let sample = Sample {
            prompt: input.prompt.clone(),
            completion: input.completion.clone(),
            reference: input.reference.to_string(),
            metadata: Value::Object(metadata).to_string(),
        };
        let report = self
            .host
            .call_blocking(&self.options_json, Some(&sample), &limits, seed_of(input))
            .map_err(|e| fail(e.to_string()))?;
        let scored = match report.outcome {
            CallOutcome::Scored(s) => s,
            CallOutcome::Configured => return Err(fail("did not score the sample".into())),
            CallOutcome::Refused(m) => return Err(fail(clip(&m).to_owned())),
            CallOutcome::Stopped(o) => {
                return Err(fail(format!(
                    "{}{}",
                    stopped(&o, &limits, self.options.mode),
                    stderr_note(&report.stderr)
                )));
            }
        };
        let details = match &scored.details {
            None => Map::new(),
            Some(d) if d.len() > MAX_REPLY_BYTES => {
                return Err(fail(format!(
                    "returned {} bytes of details, past the limit of {MAX_REPLY_BYTES}",
                    d.len()
                )));
            }
            Some(d) => match serde_json::from_str(d) {
                Ok(Value::Object(m)) => m,
                _ => return Err(fail("returned details that are not a JSON object".into())),
            },
        };
        reward(
            scored.reward,
            verdict(scored.verdict),
            details,
            &self.provenance,
            report.fuel,
        )
        .map_err(fail)
    }

    fn cache_identity(&self) -> Option<String> {
        Some(self.provenance.cache_identity(&self.options))
    }
}

fn verdict(v: GuestVerdict) -> Verdict {
    match v {
        GuestVerdict::Accepted => Verdict::Accepted,
        GuestVerdict::Partial => Verdict::Partial,
        GuestVerdict::WrongAnswer => Verdict::WrongAnswer,
        GuestVerdict::NoAnswer => Verdict::NoAnswer,
        GuestVerdict::NoCode => Verdict::NoCode,
        GuestVerdict::RuntimeError => Verdict::RuntimeError,
        GuestVerdict::TimeLimit => Verdict::TimeLimit,
        GuestVerdict::MemoryLimit => Verdict::MemoryLimit,
        GuestVerdict::OutputLimit => Verdict::OutputLimit,
    }
}

pub(crate) fn build(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    let options = Options::parse(config, NAME)?;
    Ok(Arc::new(WasmReward::load(options)?))
}
