//! The `remote` reward: each sample verified by one of a set of reward servers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use areal_proto::pb::verifier_client::VerifierClient;
use areal_proto::{MAX_MESSAGE_BYTES, pb};
use areal_sdk::{
    BuildContext, FaultStats, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier,
    VerifyContext,
};
use serde::Deserialize;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::fleet::{
    CallError, ClientRuntime, Connect, Fleet, check_options, connect_all,
    default_connect_timeout_s, default_grace_s, default_probe_interval_s, request,
};
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

/// Verifies on reward servers: each sample goes to the server with the fewest samples in
/// flight; a server that fails while it has a sample costs that sample one re-issue to
/// another server, never more, so a sample is verified at most twice and counted once.
/// While no server answers, samples wait for one up to `grace_s`.
pub struct RemoteVerifier {
    fleet: Arc<Fleet<Client>>,
    call_margin: Duration,
    // last: its probes and channels stop with it
    runtime: ClientRuntime,
}

impl std::fmt::Debug for RemoteVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteVerifier")
            .field("endpoints", &self.fleet.report())
            .finish_non_exhaustive()
    }
}

impl RemoteVerifier {
    /// A verifier on `options.endpoints`, sending `token` with every call; the error names
    /// the option at fault.
    pub fn new(
        options: &RemoteRewardOptions,
        token: Option<&str>,
    ) -> Result<Self, (&'static str, String)> {
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
        Ok(Self {
            fleet,
            call_margin: Duration::from_secs_f64(options.call_margin_s),
            runtime,
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

    async fn call(
        mut client: Client,
        sample: pb::RewardInput,
        timeout: Duration,
    ) -> Result<pb::VerifyResult, CallError> {
        let batch = pb::VerifyBatch {
            header: Some(areal_proto::header()),
            samples: vec![sample],
        };
        let answer = client.verify(request(batch, timeout)).await;
        let mut results = answer
            .map_err(|s| CallError::from_status(&s))?
            .into_inner()
            .results;
        match (results.pop(), results.is_empty()) {
            (Some(one), true) => Ok(one),
            _ => Err(CallError::from_status(&tonic::Status::internal(
                "the server answered a one-sample batch with another number of results",
            ))),
        }
    }

    /// Whether `input` fits in one call to a reward server ([`MAX_MESSAGE_BYTES`]).
    pub fn fits(input: &RewardInput) -> bool {
        areal_proto::reward_input_size(input) <= MAX_MESSAGE_BYTES
    }

    async fn verify_async(
        &self,
        input: &RewardInput,
        ctx: &VerifyContext,
    ) -> Result<Reward, PluginError> {
        if !Self::fits(input) {
            tracing::warn!(target: "areal::remote", sample_id = input.sample_id, mib = areal_proto::reward_input_size(input) >> 20, "a sample too big for a reward server");
            return Err(PluginError::unsupported(
                NAME,
                "samples over the 64 MiB a reward server accepts",
            ));
        }
        let (result, url) = self
            .fleet
            .call_reissuing_once(
                input.sample_id,
                || std::future::ready(()),
                |_, client| {
                    let deadline = ctx.remaining().max(Duration::from_millis(1));
                    let sample = areal_proto::reward_input(input, deadline);
                    Self::call(client, sample, deadline + self.call_margin)
                },
            )
            .await
            .map_err(|why| PluginError::failed(NAME, why))?;
        outcome(result, &url)
    }
}

/// Check member `index` every `interval`: a health call that answers puts it back to work.
async fn probe(fleet: Arc<Fleet<Client>>, index: usize, interval: Duration, timeout: Duration) {
    loop {
        let mut client = fleet.members()[index].client.clone();
        match client.health(request(areal_proto::ping(), timeout)).await {
            Ok(_) => {
                if !fleet.is_ready(index) {
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

    fn verify(&self, input: &RewardInput, ctx: &VerifyContext) -> Result<Reward, PluginError> {
        self.runtime.get().block_on(self.verify_async(input, ctx))
    }

    fn faults(&self) -> FaultStats {
        self.fleet.faults()
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
    let token = match &options.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                config.invalid("token_file", format!("cannot read {}: {e}", path.display()))
            })?;
            Some(text.trim().to_owned()).filter(|t| !t.is_empty())
        }
        None => token_from_env(),
    };
    let verifier = RemoteVerifier::new(&options, token.as_deref())
        .map_err(|(key, message)| config.invalid(key, message))?;
    Ok(Arc::new(verifier))
}

areal_sdk::register_reward!(
    NAME,
    "verification on reward servers (`areal serve reward`): `endpoints = [\"http://HOST:PORT\", ...]`",
    build
);
