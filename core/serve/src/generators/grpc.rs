//! `[generator] kind = "remote"`: areal's own generator servers (`areal serve generator`) over
//! gRPC. Weights are streamed in chunks (encoded once per version for every server), or read
//! by the servers from `weights_dir` with the sha256 computed here; each token comes back
//! with the version that sampled it, and each server reports its own statistics.

use std::sync::{Arc, Mutex};

use areal_proto::pb::generator_client::GeneratorClient;
use areal_proto::{CompletionBuilder, MAX_MESSAGE_BYTES, PART_VALUES, pb};
use areal_sdk::{GenerateRequest, GeneratorStats, PolicyVersion, WeightUpdate};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::api::{
    CallError, Joining, OptionError, Published, Sampled, ServerApi, Setup, Timeouts, wire_api,
};
use crate::fleet::{channel, request};
use crate::security::SendToken;

/// The name the plugin is registered under.
const NAME: &str = "remote";

type Client = GeneratorClient<InterceptedService<Channel, SendToken>>;

/// A version of the weights as servers are sent it.
enum Payload {
    /// Streamed: the chunks, built once and shared by every stream.
    Chunks(Arc<Vec<pb::WeightChunk>>),
    /// Through the shared folder, with the sha256 of its tensors.
    Folder { path: String, sha256: String },
    /// An adapter, streamed alone (a few megabytes) to servers that hold its base; with the
    /// base to those that do not (built the first time one needs it).
    Adapter {
        alone: Arc<Vec<pb::WeightChunk>>,
        update: WeightUpdate,
        base_sha256: String,
        whole: tokio::sync::OnceCell<Arc<Vec<pb::WeightChunk>>>,
    },
}

struct Grpc {
    clients: Vec<Client>,
    timeouts: Timeouts,
    /// The version prepared last, as it is sent.
    prepared: Mutex<Option<(PolicyVersion, Arc<Payload>)>>,
}

/// Send `chunks` as one `UpdateWeights` stream.
async fn stream(
    mut client: Client,
    chunks: Arc<Vec<pb::WeightChunk>>,
    timeout: std::time::Duration,
) -> Result<tonic::Response<pb::WeightsHeld>, tonic::Status> {
    let stream = tokio_stream::iter((0..chunks.len()).map(move |i| chunks[i].clone()));
    client.update_weights(request(stream, timeout)).await
}

fn connect(setup: &Setup<'_>) -> Result<Box<dyn ServerApi>, OptionError> {
    let token = SendToken::new(setup.token).map_err(|e| OptionError::new("endpoints", e))?;
    let clients = setup
        .options
        .endpoints
        .iter()
        .map(|url| {
            let channel = channel(url, setup.connect)?;
            Ok(
                GeneratorClient::new(InterceptedService::new(channel, token.clone()))
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
        })
        .collect::<Result<_, OptionError>>()?;
    Ok(Box::new(Grpc {
        clients,
        timeouts: setup.timeouts,
        prepared: Mutex::new(None),
    }))
}

wire_api!(
    NAME,
    "generation on generator servers (`areal serve generator`): `endpoints = [\"http://HOST:PORT\", ...]`",
    connect
);

fn status(s: tonic::Status) -> CallError {
    CallError::from_status(&s)
}

/// A status of a call the server may not have (`UNIMPLEMENTED`: it cannot `what`).
fn optional(what: &'static str) -> impl Fn(tonic::Status) -> CallError {
    move |s| match s.code() {
        tonic::Code::Unimplemented => CallError::Unsupported(what),
        _ => status(s),
    }
}

impl Grpc {
    fn client(&self, server: usize) -> Client {
        self.clients[server].clone()
    }
}

#[areal_sdk::async_trait]
impl ServerApi for Grpc {
    async fn alive(
        &self,
        server: usize,
        _paused: bool,
    ) -> Result<Option<GeneratorStats>, CallError> {
        let answer = self
            .client(server)
            .stats(request(areal_proto::ping(), self.timeouts.probe))
            .await
            .map_err(status)?;
        Ok(Some(areal_proto::from_stats(answer.get_ref())))
    }

    async fn joining(&self, server: usize) -> Result<Joining, CallError> {
        let health = self
            .client(server)
            .health(request(areal_proto::ping(), self.timeouts.probe))
            .await
            .map_err(status)?
            .into_inner();
        Ok(Joining {
            version: health.version,
            paused: Some(health.paused),
        })
    }

    /// Adapters are always streamed (they are small), whatever `weights_dir` says.
    async fn prepare(&self, update: WeightUpdate, published: &Published) -> Result<(), String> {
        let folder = published.folder.clone();
        let base_sha256 = published.base_sha256.clone();
        let payload = tokio::task::spawn_blocking(move || match (folder, base_sha256) {
            (_, Some(base_sha256)) => {
                let alone = areal_proto::adapter_chunks(&update, &base_sha256, false, PART_VALUES);
                Payload::Adapter {
                    alone: Arc::new(alone),
                    update,
                    base_sha256,
                    whole: tokio::sync::OnceCell::new(),
                }
            }
            (Some(folder), None) => Payload::Folder {
                path: folder.to_string_lossy().into_owned(),
                sha256: areal_proto::weights_sha256(&update.tensors),
            },
            (None, None) => {
                Payload::Chunks(Arc::new(areal_proto::weight_chunks(&update, PART_VALUES)))
            }
        })
        .await
        .map_err(|e| format!("encoding the weights: {e}"))?;
        *self.prepared.lock().expect("prepared lock") =
            Some((published.version, Arc::new(payload)));
        Ok(())
    }

    async fn load(
        &self,
        server: usize,
        published: &Published,
    ) -> Result<Option<PolicyVersion>, CallError> {
        let payload = match &*self.prepared.lock().expect("prepared lock") {
            Some((version, payload)) if *version == published.version => payload.clone(),
            _ => {
                return Err(CallError::Refused(format!(
                    "version {} was never prepared",
                    published.version
                )));
            }
        };
        let mut client = self.client(server);
        let timeout = self.timeouts.weights;
        let answer = match &*payload {
            Payload::Chunks(chunks) => stream(client, chunks.clone(), timeout).await,
            Payload::Adapter {
                alone,
                update,
                base_sha256,
                whole,
            } => match stream(client.clone(), alone.clone(), timeout).await {
                Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                    // this server lacks the base: once, with it
                    let whole = whole
                        .get_or_try_init(|| async {
                            let (update, sha) = (update.clone(), base_sha256.clone());
                            tokio::task::spawn_blocking(move || {
                                Arc::new(areal_proto::adapter_chunks(
                                    &update,
                                    &sha,
                                    true,
                                    PART_VALUES,
                                ))
                            })
                            .await
                        })
                        .await
                        .map_err(|e| CallError::Fault(format!("encoding the base: {e}")))?
                        .clone();
                    stream(client, whole, timeout).await
                }
                other => other,
            },
            Payload::Folder { path, sha256 } => {
                let message = pb::LoadWeightsRequest {
                    header: Some(areal_proto::header()),
                    version: published.version,
                    path: path.clone(),
                    sha256: sha256.clone(),
                };
                client.load_weights(request(message, timeout)).await
            }
        };
        Ok(Some(answer.map_err(status)?.into_inner().version))
    }

    async fn pause(&self, server: usize) -> Result<(), CallError> {
        self.client(server)
            .pause(request(areal_proto::ping(), self.timeouts.call))
            .await
            .map(drop)
            .map_err(optional("pause"))
    }

    async fn resume(&self, server: usize) -> Result<(), CallError> {
        self.client(server)
            .resume(request(areal_proto::ping(), self.timeouts.call))
            .await
            .map(drop)
            .map_err(optional("resume"))
    }

    /// The server's own `pause` returns once its running samples are cut (they come back
    /// interrupted in their streams); one that reaches it paused waits there for the resume.
    fn pause_returns_samples(&self) -> bool {
        false
    }

    async fn generate(
        &self,
        server: usize,
        request: &GenerateRequest,
        _held: Option<PolicyVersion>,
    ) -> Result<Sampled, CallError> {
        let message = areal_proto::generate_request(request);
        let mut stream = self
            .client(server)
            .generate(self::request(message, self.timeouts.call))
            .await
            .map_err(status)?
            .into_inner();
        let mut builder = CompletionBuilder::new(request.max_new_tokens);
        while let Some(event) = stream.message().await.map_err(status)? {
            let done = builder
                .push(event)
                .map_err(|e| CallError::Refused(format!("sent a malformed answer: {e}")))?;
            if let Some(completion) = done {
                // read on to the stream's end (its trailers): a stream dropped before it would
                // be reset, and h2 ends a connection once it has had to reset 1 024 streams
                // whose frames came after it forgot them
                return match stream.message().await.map_err(status)? {
                    None => Ok(Sampled::Tagged(completion)),
                    Some(_) => Err(CallError::Refused(
                        "sent events after the sample's last one".into(),
                    )),
                };
            }
        }
        Err(CallError::Fault(
            "the stream ended before the sample finished".into(),
        ))
    }
}
