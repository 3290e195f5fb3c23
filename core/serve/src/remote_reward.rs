//! The `remote` reward: each sample verified by one of a set of reward servers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use areal_proto::pb::verifier_client::VerifierClient;
use areal_proto::{MAX_MESSAGE_BYTES, pb};
use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, VerifyContext,
};
use serde::Deserialize;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::security::{SendToken, token_from_env};

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
}

fn default_connect_timeout_s() -> f64 {
    5.0
}

fn default_call_margin_s() -> f64 {
    30.0
}

type Client = VerifierClient<InterceptedService<Channel, SendToken>>;

struct Endpoint {
    url: String,
    client: Client,
    in_flight: AtomicUsize,
}

/// Verifies on reward servers: each sample goes to the server with the fewest samples in
/// flight; a server that cannot be reached (or fails the call) costs one re-issue to the next
/// one, never more, so a sample is verified at most twice and counted once.
pub struct RemoteVerifier {
    runtime: tokio::runtime::Runtime,
    endpoints: Vec<Endpoint>,
    call_margin: Duration,
    reissued: AtomicU64,
    endpoint_failures: AtomicU64,
}

impl std::fmt::Debug for RemoteVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteVerifier")
            .field(
                "endpoints",
                &self.endpoints.iter().map(|e| &e.url).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl RemoteVerifier {
    /// A verifier on `options.endpoints`, sending `token` with every call.
    pub fn new(options: &RemoteRewardOptions, token: Option<&str>) -> Result<Self, String> {
        if options.endpoints.is_empty() {
            return Err("give at least one endpoint, e.g. [\"http://127.0.0.1:50061\"]".into());
        }
        for (key, value) in [
            ("connect_timeout_s", options.connect_timeout_s),
            ("call_margin_s", options.call_margin_s),
        ] {
            if !(value > 0.0 && value <= 86_400.0) {
                return Err(format!(
                    "{key} must be between 0 and 86400 seconds, found {value}"
                ));
            }
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("areal-remote-reward")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the client's runtime: {e}"))?;
        let send_token = SendToken::new(token)?;
        let _in_runtime = runtime.enter();
        let endpoints = options
            .endpoints
            .iter()
            .map(|url| {
                let channel = Channel::from_shared(url.clone())
                    .map_err(|e| format!("endpoint {url:?}: {e}"))?
                    .connect_timeout(Duration::from_secs_f64(options.connect_timeout_s))
                    .connect_lazy();
                let client = VerifierClient::with_interceptor(channel, send_token.clone())
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES);
                Ok(Endpoint {
                    url: url.clone(),
                    client,
                    in_flight: AtomicUsize::new(0),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        drop(_in_runtime);
        Ok(Self {
            runtime,
            endpoints,
            call_margin: Duration::from_secs_f64(options.call_margin_s),
            reissued: AtomicU64::new(0),
            endpoint_failures: AtomicU64::new(0),
        })
    }

    /// Samples sent again to another server after their first failed.
    pub fn reissued(&self) -> u64 {
        self.reissued.load(Ordering::Relaxed)
    }

    /// Calls that failed at the transport or on the server.
    pub fn endpoint_failures(&self) -> u64 {
        self.endpoint_failures.load(Ordering::Relaxed)
    }

    /// The endpoints, least loaded first (ties in configured order).
    fn by_load(&self) -> Vec<&Endpoint> {
        let mut order: Vec<&Endpoint> = self.endpoints.iter().collect();
        order.sort_by_key(|e| e.in_flight.load(Ordering::Relaxed));
        order
    }

    async fn call(
        &self,
        endpoint: &Endpoint,
        sample: pb::RewardInput,
        timeout: Duration,
    ) -> Result<pb::VerifyResult, tonic::Status> {
        endpoint.in_flight.fetch_add(1, Ordering::Relaxed);
        let mut client = endpoint.client.clone();
        let mut request = tonic::Request::new(pb::VerifyBatch {
            header: Some(areal_proto::header()),
            samples: vec![sample],
        });
        request.set_timeout(timeout);
        let result = client.verify(request).await;
        endpoint.in_flight.fetch_sub(1, Ordering::Relaxed);
        let mut results = result?.into_inner().results;
        match (results.pop(), results.is_empty()) {
            (Some(one), true) => Ok(one),
            _ => Err(tonic::Status::internal(
                "the server answered a one-sample batch with another number of results",
            )),
        }
    }
}

impl RewardVerifier for RemoteVerifier {
    fn name(&self) -> &str {
        NAME
    }

    fn verify(&self, input: &RewardInput, ctx: &VerifyContext) -> Result<Reward, PluginError> {
        let deadline = ctx.remaining().max(Duration::from_millis(1));
        let sample = areal_proto::reward_input(input, deadline);
        let timeout = deadline + self.call_margin;
        let order = self.by_load();
        let mut failures = Vec::new();
        // the first choice, and at most one other
        for (attempt, endpoint) in order.iter().take(2).enumerate() {
            if attempt > 0 {
                self.reissued.fetch_add(1, Ordering::Relaxed);
            }
            match self
                .runtime
                .block_on(self.call(endpoint, sample.clone(), timeout))
            {
                Ok(result) => return outcome(result, &endpoint.url),
                Err(status) => {
                    self.endpoint_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(target: "areal::remote", endpoint = %endpoint.url, sample_id = input.sample_id, code = ?status.code(), message = status.message(), "reward call failed");
                    failures.push(format!("{}: {}", endpoint.url, describe(&status)));
                }
            }
        }
        Err(PluginError::failed(
            NAME,
            format!(
                "sample {}: no reward server answered ({})",
                input.sample_id,
                failures.join("; ")
            ),
        ))
    }
}

/// A server's answer for one sample: its reward, or its verifier's failure as an error (the
/// failure verdicts are the engine's to give).
fn outcome(result: pb::VerifyResult, url: &str) -> Result<Reward, PluginError> {
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

fn describe(status: &tonic::Status) -> String {
    match status.code() {
        tonic::Code::Unavailable => format!("unreachable ({})", status.message()),
        tonic::Code::DeadlineExceeded => "no answer in time".into(),
        code => format!("{code:?}: {}", status.message()),
    }
}

pub(crate) fn build(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    let options: RemoteRewardOptions = config.parse()?;
    let token = token_from_env();
    let verifier = RemoteVerifier::new(&options, token.as_deref())
        .map_err(|m| config.invalid("endpoints", m))?;
    Ok(Arc::new(verifier))
}

areal_sdk::register_reward!(
    NAME,
    "verification on reward servers (`areal serve reward`): `endpoints = [\"http://HOST:PORT\", ...]`",
    build
);
