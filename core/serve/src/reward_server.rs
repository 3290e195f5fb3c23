//! The reward server: `Verify` calls answered by the engine's reward service.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use areal_core::config::bounds::MAX_DEADLINE_MS;
use areal_core::{RewardService, RewardServiceConfig};
use areal_proto::pb::verifier_server::{Verifier, VerifierServer};
use areal_proto::{MAX_MESSAGE_BYTES, PROTOCOL_VERSION, check_header, pb};
use areal_sdk::RewardVerifier;
use tonic::{Request, Response, Status};

use crate::security::{Listen, ServeError};
use crate::server::{guarded, serve_on};

/// The most samples one `Verify` call may carry.
const MAX_BATCH: usize = 4096;

struct RewardServer {
    service: Arc<RewardService>,
    threads: usize,
}

#[tonic::async_trait]
impl Verifier for RewardServer {
    async fn verify(
        &self,
        request: Request<pb::VerifyBatch>,
    ) -> Result<Response<pb::VerifyResults>, Status> {
        let batch = request.into_inner();
        check_header(batch.header.as_ref())?;
        if batch.samples.len() > MAX_BATCH {
            return Err(Status::invalid_argument(format!(
                "{} samples in one call; at most {MAX_BATCH}",
                batch.samples.len()
            )));
        }
        let mut calls = tokio::task::JoinSet::new();
        let mut results: Vec<Option<pb::VerifyResult>> = vec![None; batch.samples.len()];
        for (i, sample) in batch.samples.into_iter().enumerate() {
            let sample_id = sample.sample_id;
            let (input, deadline) = match areal_proto::from_reward_input(sample) {
                Ok(decoded) => decoded,
                Err(e) => {
                    results[i] = Some(failure(sample_id, format!("malformed sample: {e}")));
                    continue;
                }
            };
            if deadline.is_zero() || deadline > Duration::from_millis(MAX_DEADLINE_MS) {
                results[i] = Some(failure(
                    sample_id,
                    format!(
                        "deadline {} ms: between 1 and {MAX_DEADLINE_MS} ms",
                        deadline.as_millis()
                    ),
                ));
                continue;
            }
            let service = self.service.clone();
            calls.spawn(async move {
                let verified = service.verify_within(input, deadline).await;
                (i, sample_id, verified.reward)
            });
        }
        while let Some(done) = calls.join_next().await {
            let (i, sample_id, reward) =
                done.map_err(|e| Status::internal(format!("verification task failed: {e}")))?;
            results[i] = Some(pb::VerifyResult {
                sample_id,
                outcome: Some(pb::verify_result::Outcome::Reward(areal_proto::reward(
                    &reward,
                ))),
            });
        }
        Ok(Response::new(pb::VerifyResults {
            results: results
                .into_iter()
                .map(|r| r.expect("every sample has a result"))
                .collect(),
        }))
    }

    async fn health(
        &self,
        request: Request<pb::Ping>,
    ) -> Result<Response<pb::RewardHealth>, Status> {
        check_header(request.get_ref().header.as_ref())?;
        Ok(Response::new(pb::RewardHealth {
            plugin: self.service.verifier().name().to_owned(),
            protocol: PROTOCOL_VERSION,
            threads: self.threads as u32,
        }))
    }
}

fn failure(sample_id: u64, message: String) -> pb::VerifyResult {
    pb::VerifyResult {
        sample_id,
        outcome: Some(pb::verify_result::Outcome::Error(message)),
    }
}

/// Serve `verifier` as `config` says (its threads and its reward cache; the deadline is each
/// sample's own) until `shutdown` completes. `on_bound` gets the address actually bound
/// (port 0 picks one) once the server accepts calls.
pub async fn serve_reward(
    verifier: Arc<dyn RewardVerifier>,
    config: &RewardServiceConfig,
    listen: Listen,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let threads = config.threads;
    let service = RewardService::from_config(verifier, config);
    let server = RewardServer {
        service: Arc::new(service),
        threads,
    };
    let service = VerifierServer::new(server)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let service = guarded(service, &listen);
    serve_on(&listen, "reward", on_bound, shutdown, |server| {
        server.add_service(service)
    })
    .await
}
