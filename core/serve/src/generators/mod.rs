//! One fleet of generator servers, whatever API they speak: areal's own gRPC servers
//! (`kind = "remote"`), SGLang (`"sglang"`) or vLLM (`"vllm"`), each an adapter of a few
//! calls ([`api::ServerApi`]) in a file of its own.
//!
//! The fleet owns the interruption protocol across its servers. Each sample goes to a server
//! that takes work, by the fleet's routing (the least loaded); `pause` holds new samples here
//! and pauses every server; `update_weights` publishes the version once (streamed, or written
//! under `weights_dir` as a checkpoint folder), has every server that takes work load it, and
//! lets work reach a server again only once it holds that version; `resume` resumes them all.
//! A probe per server watches it: one that joins late or comes back is checked (its
//! tokenizer, the version it holds) and caught up before it gets work. A server that fails
//! while it has a sample costs that sample one re-issue to another server; a second failure
//! fails the sample. What a server answers is checked before the run takes it: well-formed,
//! within the trainer's vocabulary, of a weight version this run sent.

mod answers;
pub(crate) mod api;
mod grpc;
mod http;
mod sglang;
mod vllm;
mod watch;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use areal_sdk::{
    BuildContext, Completion, FinishReason, GenerateRequest, Generator, GeneratorStats,
    PluginConfig, PluginError, PolicyVersion, Tokenizer, WeightUpdate,
};
use futures_util::future::join_all;
use serde::Deserialize;

use crate::fleet::{
    CallError, ClientRuntime, Connect, Fleet, OptionError, PauseGate, Routing, check_options,
    default_connect_timeout_s, default_grace_s, default_probe_interval_s,
};
use crate::security::token_from_env;
use crate::weights_folder;
use answers::{Probe, make_probe};
use api::{Published, Sampled, ServerApi, Setup, Timeouts, WireApi};
use watch::{Reported, watch};

/// `[generator]` of a fleet kind (`remote`, `sglang`, `vllm`): the same keys for every kind.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorFleetOptions {
    /// The servers, e.g. `["http://10.0.0.5:30000"]`.
    pub endpoints: Vec<String>,
    /// A folder the trainer writes and every server reads (a shared filesystem), as both sides
    /// see it: each version of the weights is written there once as a checkpoint folder.
    /// Required by `sglang` and `vllm`; for `remote`, weights are streamed without it.
    #[serde(default)]
    pub weights_dir: Option<PathBuf>,
    /// Seconds to wait for a connection. By default 5.
    #[serde(default = "default_connect_timeout_s")]
    pub connect_timeout_s: f64,
    /// Seconds one sample may take on a server before it counts as failed. By default 600.
    #[serde(default = "default_call_timeout_s")]
    pub call_timeout_s: f64,
    /// Seconds a server may take to receive and load new weights. By default 600.
    #[serde(default = "default_call_timeout_s")]
    pub weights_timeout_s: f64,
    /// Seconds no server may take work before the run stops. By default 60.
    #[serde(default = "default_grace_s")]
    pub grace_s: f64,
    /// Seconds between health checks of each server. By default 0.5.
    #[serde(default = "default_probe_interval_s")]
    pub probe_interval_s: f64,
    /// A PEM file of the certificate authority that signed the servers' certificates, for
    /// `https://` endpoints.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// Check each server's tokenizer against the trainer's before it gets work, where its API
    /// can tokenize (`sglang`, `vllm`: `/tokenize`). By default true.
    #[serde(default = "yes")]
    pub check_tokenizer: bool,
    /// Which server a sample's call goes to: `sticky` (every call of a sample, an episode's
    /// turns and an agent session's included, to the server its first went to, for that
    /// server's prefix cache; the default) or `least-loaded` (each call to the server with
    /// the fewest in flight).
    #[serde(default = "sticky")]
    pub routing: Routing,
    /// `sglang`, `vllm`: the LoRA adapters (versions) each server keeps loaded when the policy
    /// trains one; older ones are unloaded (one per step would fill the server's memory). A
    /// request admitted under a version keeps it while it stays loaded. By default 2.
    #[serde(default = "two")]
    pub keep_adapters: usize,
}

fn two() -> usize {
    2
}

fn sticky() -> Routing {
    Routing::Sticky
}

fn default_call_timeout_s() -> f64 {
    600.0
}

fn yes() -> bool {
    true
}

/// Generates on a fleet of servers; see the module documentation.
pub struct GeneratorFleet {
    servers: Arc<Servers>,
    // last: its probes and connections stop with it
    runtime: ClientRuntime,
}

impl std::fmt::Debug for GeneratorFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratorFleet")
            .field("kind", &self.servers.kind)
            .field("endpoints", &self.servers.fleet.report())
            .finish_non_exhaustive()
    }
}

/// The fleet's state, shared with its probes.
struct Servers {
    kind: &'static str,
    api: Box<dyn ServerApi>,
    fleet: Fleet<()>,
    /// The version each server holds, as it last said.
    held: Vec<Mutex<Option<PolicyVersion>>>,
    /// The version servers are brought to.
    current: Mutex<Option<Arc<Published>>>,
    /// Weight updates and catching up of returning servers, one at a time.
    sync: tokio::sync::Mutex<()>,
    /// Closed between `pause` and `resume`: new samples wait here.
    gate: PauseGate,
    /// Pauses so far: an `abort` seen by a call that started before one is an interruption.
    pauses: AtomicU64,
    weights_dir: Option<PathBuf>,
    check_tokenizer: bool,
    /// The trainer's view of the probe text, once `check_tokenizer` has run.
    probe: Mutex<Option<Probe>>,
    /// The trainer's vocabulary (0 until `check_tokenizer` says): no token past it is taken.
    vocab: AtomicUsize,
    timeouts: Timeouts,
    reported: Vec<Mutex<Reported>>,
    tokens: AtomicU64,
    weight_loads: AtomicU64,
    /// Answers that crossed a pause without saying their version, run again.
    dropped: AtomicU64,
    /// The base of the adapters published so far, with its sha256.
    base: Mutex<Option<(Arc<Vec<areal_sdk::NamedTensor>>, String)>>,
}

impl GeneratorFleet {
    /// A fleet of `kind` (`"remote"`, `"sglang"`, `"vllm"`) on `options.endpoints`, sending
    /// `token` with every call; the error names the option at fault.
    pub fn new(
        kind: &str,
        options: &GeneratorFleetOptions,
        token: Option<&str>,
    ) -> Result<Self, OptionError> {
        let Some(wire) = inventory::iter::<WireApi>().find(|w| w.name == kind) else {
            let known: Vec<&str> = inventory::iter::<WireApi>().map(|w| w.name).collect();
            return Err(OptionError::new(
                "kind",
                format!("no server API {kind:?}; known: {}", known.join(", ")),
            ));
        };
        check_options(
            &options.endpoints,
            &[
                ("connect_timeout_s", options.connect_timeout_s),
                ("call_timeout_s", options.call_timeout_s),
                ("weights_timeout_s", options.weights_timeout_s),
                ("grace_s", options.grace_s),
                ("probe_interval_s", options.probe_interval_s),
            ],
        )?;
        let connect_timeout = Duration::from_secs_f64(options.connect_timeout_s);
        let connect = Connect::new(connect_timeout, options.tls_ca_file.as_deref())?;
        for url in &options.endpoints {
            connect.check(url)?;
        }
        let weights_dir = options
            .weights_dir
            .as_ref()
            .map(|dir| {
                let dir = std::path::absolute(dir).map_err(|e| {
                    OptionError::caused("weights_dir", dir.display().to_string(), e)
                })?;
                std::fs::create_dir_all(&dir).map_err(|e| {
                    OptionError::caused(
                        "weights_dir",
                        format!("cannot create {}", dir.display()),
                        e,
                    )
                })?;
                Ok::<_, OptionError>(dir)
            })
            .transpose()?;
        let timeouts = Timeouts {
            call: Duration::from_secs_f64(options.call_timeout_s),
            weights: Duration::from_secs_f64(options.weights_timeout_s),
            // SGLang answers a health check by generating a token: give it a moment
            probe: connect_timeout.max(Duration::from_secs(2)),
        };
        let runtime = ClientRuntime::new(&format!("areal-{}", wire.name), 2)?;
        let api = {
            let _in_runtime = runtime.get().enter();
            (wire.connect)(&Setup {
                options,
                connect: &connect,
                token,
                timeouts,
            })?
        };
        let n = options.endpoints.len();
        let members = options.endpoints.iter().map(|u| (u.clone(), ())).collect();
        let servers = Arc::new(Servers {
            kind: wire.name,
            api,
            fleet: Fleet::new(
                "generator",
                members,
                Duration::from_secs_f64(options.grace_s),
            )
            .with_load_time(timeouts.weights)
            .with_routing(options.routing),
            held: (0..n).map(|_| Mutex::new(None)).collect(),
            current: Mutex::new(None),
            sync: tokio::sync::Mutex::new(()),
            gate: PauseGate::new(),
            pauses: AtomicU64::new(0),
            weights_dir,
            check_tokenizer: options.check_tokenizer,
            probe: Mutex::new(None),
            vocab: AtomicUsize::new(0),
            timeouts,
            reported: (0..n).map(|_| Mutex::new(Reported::default())).collect(),
            tokens: AtomicU64::new(0),
            weight_loads: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            base: Mutex::new(None),
        });
        let interval = Duration::from_secs_f64(options.probe_interval_s);
        for index in 0..n {
            runtime.get().spawn(watch(servers.clone(), index, interval));
        }
        Ok(Self { servers, runtime })
    }

    /// Samples sent again to another server after theirs failed.
    pub fn reissued(&self) -> u64 {
        self.servers.fleet.faults().reissued_samples
    }

    /// Servers found dead while taking work.
    pub fn endpoint_failures(&self) -> u64 {
        self.servers.fleet.faults().endpoint_failures
    }

    /// Answers that crossed a pause without saying which weights sampled them, run again.
    pub fn dropped(&self) -> u64 {
        self.servers.dropped.load(Ordering::Relaxed)
    }

    /// Each endpoint with what it last said.
    pub fn report(&self) -> String {
        self.servers.fleet.report()
    }
}

/// `call` bounded by `timeout` on this side too (a server that stopped answering).
async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, CallError>>,
) -> Result<T, CallError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(CallError::Fault(format!(
                "no answer in {:.0} s",
                timeout.as_secs_f64()
            )))
        })
}

/// The longest `pause` waits for aborted samples to come back.
const DRAIN: Duration = Duration::from_secs(5);
/// How long `pause` waits for the next aborted sample to come back before taking those left
/// for held by the paused servers.
const QUIET: Duration = Duration::from_millis(50);

impl Servers {
    fn count(&self) -> usize {
        self.fleet.members().len()
    }

    fn url(&self, index: usize) -> &str {
        &self.fleet.members()[index].url
    }

    fn held(&self, index: usize) -> Option<PolicyVersion> {
        *self.held[index].lock().expect("held lock")
    }

    fn set_held(&self, index: usize, version: Option<PolicyVersion>) {
        *self.held[index].lock().expect("held lock") = version;
    }

    fn current(&self) -> Option<Arc<Published>> {
        self.current.lock().expect("current lock").clone()
    }

    /// Those that take work now.
    fn ready(&self) -> Vec<usize> {
        (0..self.count())
            .filter(|&i| self.fleet.is_ready(i))
            .collect()
    }

    /// Take server `index` out as `error` says: down (for now) or refusing us (for good).
    fn fail(&self, index: usize, error: CallError) {
        if let CallError::Fault(_) = error {
            // what it holds is known again once it answers
            self.set_held(index, None);
        }
        self.fleet.fail(index, error);
    }

    /// Have server `index` load `published` and check that it then holds that version.
    async fn load(&self, index: usize, published: &Published) -> Result<(), CallError> {
        let version = published.version;
        let held = bounded(self.timeouts.weights, self.api.load(index, published)).await?;
        if held != Some(version) {
            return Err(CallError::Refused(format!(
                "holds weight version {} after being sent version {version}",
                held.map_or("none".into(), |v| v.to_string())
            )));
        }
        self.set_held(index, held);
        self.weight_loads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Publish `update` and have every server that takes work load it.
    async fn update(&self, update: WeightUpdate) -> Result<(), PluginError> {
        let _one_at_a_time = self.sync.lock().await;
        let version = update.version;
        let started = std::time::Instant::now();
        let base_sha256 = match &update.adapter {
            Some(_) => Some(self.base_sha256(&update).await?),
            None => None,
        };
        let (written, update) = match &self.weights_dir {
            Some(dir) => {
                let dir = dir.clone();
                let sha = base_sha256.clone();
                let (written, update) = tokio::task::spawn_blocking(move || {
                    weights_folder::write(&dir, &update, sha.as_deref())
                        .map(|written| (written, update))
                })
                .await
                .map_err(|e| PluginError::failed(self.kind, format!("writing the weights: {e}")))?
                .map_err(|e| {
                    let what = format!("cannot write weights of version {version} to weights_dir");
                    PluginError::caused_by(self.kind, what, e)
                })?;
                (Some(written), update)
            }
            None => (None, update),
        };
        let published = Arc::new(Published {
            version,
            folder: written.as_ref().map(|w| w.folder.clone()),
            base_sha256,
            base: written.and_then(|w| w.base),
        });
        self.api
            .prepare(update, &published)
            .await
            .map_err(|e| PluginError::failed(self.kind, e))?;
        let prepared = started.elapsed();
        *self.current.lock().expect("current lock") = Some(published.clone());
        let targets = self.ready();
        for &i in &targets {
            self.fleet
                .set_busy(i, format!("loading weights of version {version}"));
        }
        let loads = targets.iter().map(|&i| {
            let published = published.clone();
            async move { (i, self.load(i, &published).await) }
        });
        let mut refused = Vec::new();
        for (i, result) in join_all(loads).await {
            match result {
                Ok(()) => self.fleet.set_ready(i, Some(version)),
                Err(fault @ CallError::Fault(_)) => self.fail(i, fault),
                Err(refusal) => {
                    refused.push(format!("{}: {refusal}", self.url(i)));
                    self.fail(i, refusal);
                }
            }
        }
        self.remove_unheld();
        tracing::debug!(target: "areal::remote", kind = self.kind, version, servers = targets.len(), prepare_ms = prepared.as_secs_f64() * 1e3, total_ms = started.elapsed().as_secs_f64() * 1e3, "weights sent");
        if !targets.is_empty() && refused.len() == targets.len() {
            return Err(PluginError::failed(
                self.kind,
                format!(
                    "no server loaded weights of version {version}: {}",
                    refused.join("; ")
                ),
            ));
        }
        Ok(())
    }

    /// The sha256 of the base `update`'s adapter applies to, computed once for the run's
    /// one base (the policy sends the same `Arc` every time).
    async fn base_sha256(&self, update: &WeightUpdate) -> Result<String, PluginError> {
        if let Some((base, sha)) = &*self.base.lock().expect("base lock")
            && Arc::ptr_eq(base, &update.tensors)
        {
            return Ok(sha.clone());
        }
        let base = update.tensors.clone();
        let sha = {
            let base = base.clone();
            tokio::task::spawn_blocking(move || areal_proto::weights_sha256(&base))
                .await
                .map_err(|e| PluginError::failed(self.kind, format!("hashing the base: {e}")))?
        };
        *self.base.lock().expect("base lock") = Some((base, sha.clone()));
        Ok(sha)
    }

    /// Remove the folders of versions neither current nor held by any server.
    fn remove_unheld(&self) {
        let Some(dir) = &self.weights_dir else {
            return;
        };
        let mut keep: Vec<u64> = (0..self.count()).filter_map(|i| self.held(i)).collect();
        keep.extend(self.current().map(|c| c.version));
        match weights_folder::remove_except(dir, &keep) {
            Ok(removed) if !removed.is_empty() => {
                tracing::debug!(target: "areal::remote", ?removed, "old weights removed");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(target: "areal::remote", error = %e, "cannot list old weights")
            }
        }
    }

    /// Pause (or resume) every server that takes work; those that fail are taken out.
    /// Whether any said it cannot.
    async fn broadcast(&self, pause: bool) -> bool {
        let what = if pause { "pause" } else { "resume" };
        let calls = self.ready().into_iter().map(|i| async move {
            let call = async {
                if pause {
                    self.api.pause(i).await
                } else {
                    self.api.resume(i).await
                }
            };
            (i, bounded(self.timeouts.call, call).await)
        });
        let mut unsupported = false;
        for (i, result) in join_all(calls).await {
            match result {
                Ok(()) => {}
                Err(CallError::Unsupported(_)) => unsupported = true,
                Err(CallError::Fault(said) | CallError::Refused(said)) => {
                    tracing::warn!(target: "areal::remote", endpoint = %self.url(i), said, "{what} failed");
                    self.fleet.set_down(i, said);
                }
            }
        }
        unsupported
    }

    /// Wait until the samples the pause aborted have come back. A sample that reached a
    /// server just after its pause is held there, not running, and comes back only after the
    /// resume: the wait ends once no sample has come back for [`QUIET`] (the aborted ones come
    /// back together), and after [`DRAIN`] whatever is left. One that comes back later is
    /// still taken right (see `account`).
    async fn drain(&self) {
        let started = tokio::time::Instant::now();
        let deadline = started + DRAIN.min(self.timeouts.call);
        let in_flight = || -> usize { self.fleet.members().iter().map(|m| m.in_flight()).sum() };
        let mut left = in_flight();
        let mut since = started;
        while left > 0 {
            let now = tokio::time::Instant::now();
            if now >= deadline || now - since >= QUIET {
                tracing::debug!(target: "areal::remote", left, "samples held by paused servers");
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            let now_left = in_flight();
            if now_left < left {
                since = tokio::time::Instant::now();
            }
            left = now_left;
        }
    }

    async fn generate(&self, request: &GenerateRequest) -> Result<Completion, PluginError> {
        let (completion, _) = self
            .fleet
            .call_reissuing_once(
                request.sample_id,
                // while paused for new weights, samples wait here
                || self.gate.opened(),
                |index, ()| self.generate_on(index, request),
            )
            .await
            .map_err(|e| PluginError::caused_by(self.kind, "no completion", e))?;
        self.tokens
            .fetch_add(completion.len() as u64, Ordering::Relaxed);
        Ok(completion)
    }

    /// One call of `request` on server `index`, its answer checked and accounted for.
    async fn generate_on(
        &self,
        index: usize,
        request: &GenerateRequest,
    ) -> Result<Completion, CallError> {
        let pauses_before = self.pauses.load(Ordering::SeqCst);
        let held = self.held(index);
        let sampled = bounded(self.timeouts.call, self.api.generate(index, request, held)).await?;
        let completion = match sampled {
            Sampled::Tagged(completion) => completion,
            Sampled::Untagged(answer) => {
                let paused_since = self.pauses.load(Ordering::SeqCst) != pauses_before;
                match self.versioned(answer, held, paused_since)? {
                    Some(completion) => completion,
                    None => {
                        self.dropped.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(target: "areal::remote", sample_id = request.sample_id, "an answer that crossed a pause is run again");
                        return Ok(Completion::empty(FinishReason::Interrupted));
                    }
                }
            }
        };
        self.account_for(&completion, request)?;
        Ok(completion)
    }
}

#[areal_sdk::async_trait]
impl Generator for GeneratorFleet {
    fn name(&self) -> &str {
        self.servers.kind
    }

    async fn generate(&self, request: GenerateRequest) -> Result<Completion, PluginError> {
        self.servers.generate(&request).await
    }

    async fn update_weights(&self, update: WeightUpdate) -> Result<(), PluginError> {
        self.servers.update(update).await
    }

    /// New samples wait here and every server is paused; with an API whose pause sends
    /// running samples back (`abort`), returns once they are back. A server that cannot
    /// pause leaves the fleet unpaused (the engine then updates while they run).
    async fn pause(&self) -> Result<(), PluginError> {
        let servers = &self.servers;
        servers.gate.close().await;
        servers.pauses.fetch_add(1, Ordering::SeqCst);
        if servers.broadcast(true).await {
            servers.gate.reopen();
            servers.broadcast(false).await;
            return Err(PluginError::unsupported(servers.kind, "pause"));
        }
        if servers.api.pause_returns_samples() {
            servers.drain().await;
        }
        Ok(())
    }

    /// Samples held here go at once; the servers are resumed in the background (a sample
    /// that reaches a server before its resume waits there for it), so that the run does not
    /// wait for the slowest server's answer.
    async fn resume(&self) -> Result<(), PluginError> {
        let servers = self.servers.clone();
        let resume = async move {
            servers.broadcast(false).await;
        };
        self.servers.gate.open(self.runtime.get(), resume).await;
        Ok(())
    }

    /// The trainer's vocabulary is kept (no token past it is taken) and, where the servers'
    /// API can tokenize, the probe text (tokens spread over the vocabulary) must give the same
    /// ids on every server; servers that are not up yet are checked when they come up,
    /// before they get work.
    async fn check_tokenizer(&self, tokenizer: &dyn Tokenizer) -> Result<(), PluginError> {
        let kind = self.servers.kind;
        self.servers
            .vocab
            .store(tokenizer.vocab_size(), Ordering::Relaxed);
        if !self.servers.check_tokenizer {
            return Ok(());
        }
        let probe = make_probe(tokenizer).map_err(|e| PluginError::failed(kind, e))?;
        *self.servers.probe.lock().expect("probe lock") = Some(probe);
        let servers = self.servers.clone();
        let checks = self.runtime.get().spawn(async move {
            let calls = (0..servers.count()).map(|i| {
                let servers = servers.clone();
                async move { (i, servers.check_server_tokenizer(i).await) }
            });
            join_all(calls).await
        });
        let results = checks
            .await
            .map_err(|e| PluginError::failed(kind, format!("checking tokenizers: {e}")))?;
        let mut refused = Vec::new();
        for (i, result) in results {
            match result {
                // not up yet: checked by its probe before it takes work
                Ok(()) | Err(CallError::Fault(_)) => {}
                Err(refusal) => {
                    refused.push(format!("{}: {refusal}", self.servers.url(i)));
                    self.servers.fail(i, refusal);
                }
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(PluginError::failed(
                kind,
                format!(
                    "the servers' tokenizer is not the trainer's: {}",
                    refused.join("; ")
                ),
            ))
        }
    }

    fn stats(&self) -> GeneratorStats {
        self.servers.stats()
    }
}

/// Build the fleet of `config.kind()` (the plugin of every adapter).
pub(crate) fn build(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn Generator>, PluginError> {
    let options: GeneratorFleetOptions = config.parse()?;
    let token = token_from_env();
    let fleet = GeneratorFleet::new(config.kind(), &options, token.as_deref())
        .map_err(|e| config.invalid(e.key, e.explained()))?;
    Ok(Arc::new(fleet))
}
