//! The `remote` reward: each sample verified by one of a set of reward servers.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use areal_proto::pb::verifier_client::VerifierClient;
use areal_proto::{MAX_MESSAGE_BYTES, pb};
use areal_sdk::{
    AsyncVerifier, BuildContext, FaultStats, PluginConfig, PluginError, Reward, RewardInput,
    RewardVerifier, VerifyContext,
};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::errors::{OptionError, SampleError, SampleFailure};
use crate::fleet::{
    CallError, ClientRuntime, Connect, Fleet, check_options, connect_all,
    default_connect_timeout_s, default_grace_s, default_probe_interval_s, request,
};
use crate::security::{SendToken, client_token};

/// The name the plugin is registered under (`[reward] kind = "remote"`).
pub const NAME: &str = "remote";

/// `[reward] kind = "remote"`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteRewardOptions {
    /// The reward servers (`areal serve reward`), e.g. `["http://127.0.0.1:50061"]`.
    pub endpoints: Vec<String>,
    /// Seconds to wait for a connection. By default 5.
    #[serde(default = "default_connect_timeout_s")]
    pub connect_timeout_s: f64,
    /// Seconds a call may take beyond the sample's own deadline (queueing on the server, the
    /// network). By default 30.
    #[serde(default = "default_call_margin_s")]
    pub call_margin_s: f64,
    /// Seconds every server may be gone before the run stops. By default 60.
    #[serde(default = "default_grace_s")]
    pub grace_s: f64,
    /// A PEM file of the certificate authority that signed the servers' certificates, for
    /// `https://` endpoints (servers started with `--tls-cert` and `--tls-key`).
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// Seconds between health checks of each server (how soon a dead one is noticed and a
    /// restarted one takes work again). By default 0.5.
    #[serde(default = "default_probe_interval_s")]
    pub probe_interval_s: f64,
    /// A file holding the servers' shared token (what `areal serve reward --token-file`
    /// reads); by default `AREAL_TOKEN`.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

fn default_call_margin_s() -> f64 {
    30.0
}

type Client = VerifierClient<InterceptedService<Channel, SendToken>>;

/// Verifies on reward servers. Samples wait in one queue here; each call takes as many of
/// them as the least-loaded server has room for (two per verifier thread it reports: one
/// graded while the other's answer travels back), so that samples that arrive together
/// travel together, and any number can be in flight. A server that fails while it has
/// samples costs each of them one re-issue to another server, never more, so a sample is
/// verified at most twice and counted once. While no server answers, samples wait for one
/// up to `grace_s`.
///
/// The engine's reward service awaits it ([`RewardVerifier::as_async`]): it holds none of
/// the service's threads. [`RewardVerifier::verify`] waits for the same queue.
pub struct RemoteVerifier {
    fleet: Arc<Fleet<Client>>,
    queue: mpsc::UnboundedSender<Pending>,
    calls: Arc<AtomicU64>,
    // last: its probes, dispatcher and channels stop with it
    _runtime: ClientRuntime,
}

impl std::fmt::Debug for RemoteVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteVerifier")
            .field("endpoints", &self.fleet.report())
            .finish_non_exhaustive()
    }
}

/// The most samples one call carries (a reward server takes up to 4 096).
const MAX_BATCH: usize = 256;
/// Samples a server is given per verifier thread it reports.
const PER_THREAD: usize = 2;

/// What a sample's caller is told: the server's result and who gave it, or why there is
/// none.
type Answer = Result<(pb::VerifyResult, String), SampleError>;

/// A sample waiting for a server.
struct Pending {
    sample: pb::RewardInput,
    /// Its budget once a server starts it.
    budget: Duration,
    /// The servers that failed with it so far.
    failures: Vec<String>,
    answer: oneshot::Sender<Answer>,
}

impl Pending {
    /// Tell the caller it failed for `why`, after the failures so far.
    fn fail(self, why: impl Into<SampleFailure>) {
        let _ = self.answer.send(Err(SampleError {
            sample_id: self.sample.sample_id,
            why: why.into(),
            failures: self.failures,
        }));
    }
}

impl RemoteVerifier {
    /// A verifier on `options.endpoints`, sending `token` with every call; the error names
    /// the option at fault.
    pub fn new(options: &RemoteRewardOptions, token: Option<&str>) -> Result<Self, OptionError> {
        check_options(
            &options.endpoints,
            &[
                ("connect_timeout_s", options.connect_timeout_s),
                ("call_margin_s", options.call_margin_s),
                ("grace_s", options.grace_s),
                ("probe_interval_s", options.probe_interval_s),
            ],
        )?;
        let connect_timeout = Duration::from_secs_f64(options.connect_timeout_s);
        let connect = Connect::new(connect_timeout, options.tls_ca_file.as_deref())?;
        let (runtime, members) = connect_all(
            "areal-remote-reward",
            1,
            &options.endpoints,
            &connect,
            token,
            |guarded| {
                VerifierClient::new(guarded)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES)
            },
        )?;
        let fleet = Arc::new(Fleet::new(
            "reward",
            members,
            Duration::from_secs_f64(options.grace_s),
        ));
        let interval = Duration::from_secs_f64(options.probe_interval_s);
        for index in 0..fleet.members().len() {
            runtime
                .get()
                .spawn(probe(fleet.clone(), index, interval, connect_timeout));
        }
        let (queue, waiting) = mpsc::unbounded_channel();
        let calls = Arc::new(AtomicU64::new(0));
        let dispatcher = Dispatcher {
            fleet: fleet.clone(),
            requeue: queue.downgrade(),
            margin: Duration::from_secs_f64(options.call_margin_s),
            calls: calls.clone(),
        };
        runtime.get().spawn(dispatcher.run(waiting));
        Ok(Self {
            fleet,
            queue,
            calls,
            _runtime: runtime,
        })
    }

    /// Samples sent again to another server after theirs failed.
    pub fn reissued(&self) -> u64 {
        self.fleet.faults().reissued_samples
    }

    /// Servers found dead while taking work.
    pub fn endpoint_failures(&self) -> u64 {
        self.fleet.faults().endpoint_failures
    }

    /// Calls made so far (each carries one sample or more).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Whether `input` fits in one call to a reward server ([`MAX_MESSAGE_BYTES`]).
    pub fn fits(input: &RewardInput) -> bool {
        areal_proto::reward_input_size(input) <= MAX_MESSAGE_BYTES
    }

    /// Queue `input`; the receiver gets its answer. A sample too big for a call is refused as
    /// unsupported (a caller with the reward in process verifies it there).
    fn submit(
        &self,
        input: &RewardInput,
        ctx: &VerifyContext,
    ) -> Result<oneshot::Receiver<Answer>, PluginError> {
        if !Self::fits(input) {
            tracing::warn!(target: "areal::remote", sample_id = input.sample_id, mib = areal_proto::reward_input_size(input) >> 20, "a sample too big for a reward server");
            return Err(PluginError::unsupported(
                NAME,
                "samples over the 64 MiB a reward server accepts",
            ));
        }
        let budget = ctx.remaining().max(Duration::from_millis(1));
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            sample: areal_proto::reward_input(input, budget),
            budget,
            failures: Vec::new(),
            answer,
        };
        self.queue
            .send(pending)
            .map_err(|_| PluginError::failed(NAME, SampleFailure::Stopped.to_string()))?;
        Ok(answered)
    }
}

/// Takes the queued samples to the servers as they have room.
struct Dispatcher {
    fleet: Arc<Fleet<Client>>,
    /// Where a sample whose server failed goes again (weak: the queue ends with the client).
    requeue: mpsc::WeakUnboundedSender<Pending>,
    margin: Duration,
    calls: Arc<AtomicU64>,
}

impl Dispatcher {
    async fn run(self, mut waiting: mpsc::UnboundedReceiver<Pending>) {
        let mut pending: VecDeque<Pending> = VecDeque::new();
        loop {
            if pending.is_empty() {
                match waiting.recv().await {
                    Some(first) => pending.push_back(first),
                    None => return,
                }
            }
            while let Ok(more) = waiting.try_recv() {
                pending.push_back(more);
            }
            // a caller that stopped waiting (its deadline passed) needs no answer
            pending.retain(|p| !p.answer.is_closed());
            if pending.is_empty() {
                continue;
            }
            // the most the server picked has room for: samples that came while waiting for
            // one go in the same call
            match self.fleet.acquire_up_to(MAX_BATCH).await {
                Err(why) => pending.drain(..).for_each(|p| p.fail(why.clone())),
                Ok(lease) => {
                    while let Ok(more) = waiting.try_recv() {
                        pending.push_back(more);
                    }
                    pending.retain(|p| !p.answer.is_closed());
                    let take = lease.weight.min(pending.len());
                    let batch: Vec<Pending> = pending.drain(..take).collect();
                    let client = lease.member.client.clone();
                    let url = lease.member.url.clone();
                    let (index, weight) = lease.detach();
                    self.fleet.release(index, weight - take);
                    if !batch.is_empty() {
                        tokio::spawn(self.call(client, url, (index, take), batch));
                    }
                }
            }
        }
    }

    /// One call of `batch` to the server `url` (`held`: its index and the samples counted on
    /// it, released when the call ends).
    fn call(
        &self,
        mut client: Client,
        url: String,
        (index, weight): (usize, usize),
        batch: Vec<Pending>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let fleet = self.fleet.clone();
        let requeue = self.requeue.clone();
        let margin = self.margin;
        self.calls.fetch_add(1, Ordering::Relaxed);
        async move {
            let budget = batch.iter().map(|p| p.budget).max().unwrap_or_default();
            let message = pb::VerifyBatch {
                header: Some(areal_proto::header()),
                samples: batch.iter().map(|p| p.sample.clone()).collect(),
            };
            let answer = client.verify(request(message, budget + margin)).await;
            fleet.release(index, weight);
            let results = answer
                .map_err(|s| CallError::from_status(&s))
                .and_then(|answer| {
                    let results = answer.into_inner().results;
                    let ids = results.iter().map(|r| r.sample_id);
                    if results.len() != batch.len()
                        || !ids.eq(batch.iter().map(|p| p.sample.sample_id))
                    {
                        return Err(CallError::Refused(format!(
                            "answered {} samples with {} results that are not theirs",
                            batch.len(),
                            results.len()
                        )));
                    }
                    Ok(results)
                });
            match results {
                Ok(results) => {
                    for (pending, result) in batch.into_iter().zip(results) {
                        let _ = pending.answer.send(Ok((result, url.clone())));
                    }
                }
                Err(CallError::Fault(said)) => {
                    tracing::debug!(target: "areal::remote", endpoint = %url, samples = batch.len(), said, "call failed; sending its samples elsewhere");
                    fleet.set_down(index, said.clone());
                    for mut pending in batch {
                        pending.failures.push(format!("{url}: {said}"));
                        if pending.failures.len() > 1 {
                            let why = SampleFailure::NoneAnswered {
                                kind: "reward",
                                tried: std::mem::take(&mut pending.failures),
                            };
                            pending.fail(why);
                            continue;
                        }
                        fleet.count_reissue();
                        match requeue.upgrade() {
                            Some(queue) => {
                                if let Err(mpsc::error::SendError(pending)) = queue.send(pending) {
                                    pending.fail(SampleFailure::Stopped);
                                }
                            }
                            None => pending.fail(SampleFailure::Stopped),
                        }
                    }
                }
                Err(refusal) => {
                    for pending in batch {
                        pending.fail(SampleFailure::Refused {
                            url: url.clone(),
                            refusal: refusal.clone(),
                        });
                    }
                }
            }
        }
    }
}

/// Check member `index` every `interval`: a health call that answers puts it back to work,
/// with room for two samples per verifier thread it reports.
async fn probe(fleet: Arc<Fleet<Client>>, index: usize, interval: Duration, timeout: Duration) {
    loop {
        let mut client = fleet.members()[index].client.clone();
        match client.health(request(areal_proto::ping(), timeout)).await {
            Ok(health) => {
                if !fleet.is_ready(index) {
                    let threads = (health.get_ref().threads as usize).max(1);
                    fleet.set_capacity(index, PER_THREAD * threads);
                    fleet.set_ready(index, None);
                }
            }
            Err(status) => fleet.fail(index, CallError::from_status(&status)),
        }
        tokio::time::sleep(interval).await;
    }
}

impl RewardVerifier for RemoteVerifier {
    fn name(&self) -> &str {
        NAME
    }

    /// Waits on this thread for the answer the client's own runtime gets.
    fn verify(&self, input: &RewardInput, ctx: &VerifyContext) -> Result<Reward, PluginError> {
        let answered = self.submit(input, ctx)?;
        outcome(answered.blocking_recv())
    }

    fn faults(&self) -> FaultStats {
        self.fleet.faults()
    }

    fn as_async(&self) -> Option<&dyn AsyncVerifier> {
        Some(self)
    }
}

#[areal_sdk::async_trait]
impl AsyncVerifier for RemoteVerifier {
    async fn verify(
        &self,
        input: &RewardInput,
        ctx: &VerifyContext,
    ) -> Result<Reward, PluginError> {
        let answered = self.submit(input, ctx)?;
        outcome(answered.await)
    }
}

/// A server's answer for one sample: its reward, or its verifier's failure as an error (the
/// failure verdicts are the engine's to give).
fn outcome(answered: Result<Answer, oneshot::error::RecvError>) -> Result<Reward, PluginError> {
    let (result, url) = answered
        .map_err(|_| PluginError::failed(NAME, SampleFailure::Stopped.to_string()))?
        .map_err(|e| PluginError::caused_by(NAME, "no reward", e))?;
    let url = url.as_str();
    match result.outcome {
        Some(pb::verify_result::Outcome::Reward(r)) => {
            let reward = areal_proto::from_reward(r)
                .map_err(|e| PluginError::caused_by(NAME, format!("{url} sent a bad reward"), e))?;
            if reward.verdict.is_failure() {
                let why = reward
                    .provenance
                    .details
                    .get("error")
                    .and_then(|v| v.as_str())
                    .unwrap_or("no reason given");
                return Err(PluginError::failed(
                    NAME,
                    format!(
                        "{url}: {} failed ({}): {why}",
                        reward.provenance.verifier,
                        reward.verdict.as_str()
                    ),
                ));
            }
            Reward::check_value(reward.value)
                .map_err(|why| PluginError::failed(NAME, format!("{url} sent {why}")))?;
            Ok(reward)
        }
        Some(pb::verify_result::Outcome::Error(message)) => {
            Err(PluginError::failed(NAME, format!("{url}: {message}")))
        }
        None => Err(PluginError::failed(
            NAME,
            format!("{url} sent an empty result"),
        )),
    }
}

pub(crate) fn build(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    let options: RemoteRewardOptions = config.parse()?;
    let token = client_token(config, options.token_file.as_deref())?;
    let verifier = RemoteVerifier::new(&options, token.as_deref())
        .map_err(|e| config.invalid(e.key, e.explained()))?;
    Ok(Arc::new(verifier))
}

areal_sdk::register_reward!(
    NAME,
    "verification on reward servers (`areal serve reward`): `endpoints = [\"http://HOST:PORT\", ...]`",
    build
);
