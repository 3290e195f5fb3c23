//! The generator server: `Generate`, `Pause`, `Resume`, `UpdateWeights`, `LoadWeights`,
//! `Stats` and `Health` calls answered by a generator plugin.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use areal_proto::pb::generator_server::{
    Generator as GeneratorService, GeneratorServer as Service,
};
use areal_proto::{
    MAX_MESSAGE_BYTES, PROTOCOL_VERSION, Received, WeightAssembler, check_header, pb,
};
use areal_sdk::{Generator, NamedTensor, PluginError, WeightUpdate};
use tokio::sync::Mutex;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::security::{Listen, ServeError};
use crate::server::{guarded, serve_on};
use crate::weights_folder;

struct GeneratorServer {
    generator: Arc<dyn Generator>,
    /// The most tokens one request may ask for.
    max_new_tokens: usize,
    /// The version of the weights the plugin holds; `None` before the first.
    held: std::sync::Mutex<Option<u64>>,
    paused: AtomicBool,
    /// One weight update at a time.
    loading: Mutex<()>,
    /// The frozen base of the last adapter, with its sha256: later adapters come alone.
    base: std::sync::Mutex<Option<(String, Arc<Vec<NamedTensor>>)>>,
}

/// A plugin's failure, which the client does not send elsewhere (another server's plugin
/// would fail the same way); a request the plugin refuses as malformed is the caller's
/// (`INVALID_ARGUMENT`).
fn plugin_failed(what: &str, e: &PluginError) -> Status {
    let why = crate::error_chain(e);
    if e.is_invalid_request() {
        Status::invalid_argument(format!("{what}: {why}"))
    } else {
        Status::aborted(format!("{what}: {why}"))
    }
}

impl GeneratorServer {
    /// An update as it arrived, its adapter put over the base it names: the one that came
    /// with it (kept once the update is loaded), or the one held (`FAILED_PRECONDITION` if
    /// another).
    fn with_base(&self, received: Received) -> Result<(WeightUpdate, Option<String>), Status> {
        let Received {
            mut update,
            base_sha256,
        } = received;
        let Some(sha) = base_sha256 else {
            return Ok((update, None));
        };
        if update.tensors.is_empty() {
            match &*self.base.lock().expect("base lock") {
                Some((held_sha, base)) if *held_sha == sha => update.tensors = base.clone(),
                _ => {
                    return Err(Status::failed_precondition(format!(
                        "an adapter over the base of sha256 {sha}, which this server does not hold: send the base with it"
                    )));
                }
            }
            return Ok((update, None));
        }
        Ok((update, Some(sha)))
    }

    /// Load `update`; once the plugin took it, hold its base (of sha256 `new_base`) for the
    /// adapters that come alone. A refused update changes nothing the server holds.
    async fn load(
        &self,
        update: WeightUpdate,
        new_base: Option<String>,
    ) -> Result<Response<pb::WeightsHeld>, Status> {
        let version = update.version;
        let base = new_base.map(|sha| (sha, update.tensors.clone()));
        let _one_at_a_time = self.loading.lock().await;
        self.generator
            .update_weights(update)
            .await
            .map_err(|e| plugin_failed(&format!("loading weights of version {version}"), &e))?;
        if let Some(base) = base {
            *self.base.lock().expect("base lock") = Some(base);
        }
        *self.held.lock().expect("held lock") = Some(version);
        tracing::info!(target: "areal::serve", version, "weights loaded");
        Ok(Response::new(pb::WeightsHeld { version }))
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateEvent, Status>> + Send>>;

#[tonic::async_trait]
impl GeneratorService for GeneratorServer {
    type GenerateStream = EventStream;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let request = request.into_inner();
        check_header(request.header.as_ref())?;
        let request = areal_proto::from_generate_request(request)?;
        if request.input_ids.is_empty() {
            return Err(Status::invalid_argument("the request has no input tokens"));
        }
        request.sampling.check().map_err(Status::invalid_argument)?;
        if request.max_new_tokens > self.max_new_tokens {
            return Err(Status::invalid_argument(format!(
                "max_new_tokens {} is past this server's bound of {} (its config's rollout.max_new_tokens)",
                request.max_new_tokens, self.max_new_tokens
            )));
        }
        let sample_id = request.sample_id;
        let completion = self
            .generator
            .generate(request)
            .await
            .map_err(|e| plugin_failed(&format!("sample {sample_id}"), &e))?;
        // Never answer what no client can train on (NaN logprobs from damaged weights).
        completion.check().map_err(|e| {
            Status::internal(format!(
                "sample {sample_id}: the generator produced a malformed completion: {e}"
            ))
        })?;
        let events = areal_proto::completion_events(&completion);
        Ok(Response::new(Box::pin(tokio_stream::iter(
            events.into_iter().map(Ok),
        ))))
    }

    async fn pause(&self, request: Request<pb::Ping>) -> Result<Response<pb::Ping>, Status> {
        check_header(request.get_ref().header.as_ref())?;
        match self.generator.pause().await {
            Ok(()) => {
                self.paused.store(true, Ordering::SeqCst);
                Ok(Response::new(areal_proto::ping()))
            }
            Err(e) if e.is_unsupported() => Err(Status::unimplemented(e.to_string())),
            Err(e) => Err(plugin_failed("pausing", &e)),
        }
    }

    async fn resume(&self, request: Request<pb::Ping>) -> Result<Response<pb::Ping>, Status> {
        check_header(request.get_ref().header.as_ref())?;
        match self.generator.resume().await {
            Ok(()) => {
                self.paused.store(false, Ordering::SeqCst);
                Ok(Response::new(areal_proto::ping()))
            }
            Err(e) if e.is_unsupported() => Err(Status::unimplemented(e.to_string())),
            Err(e) => Err(plugin_failed("resuming", &e)),
        }
    }

    async fn update_weights(
        &self,
        request: Request<Streaming<pb::WeightChunk>>,
    ) -> Result<Response<pb::WeightsHeld>, Status> {
        let mut chunks = request.into_inner();
        let started = std::time::Instant::now();
        let mut assembler = WeightAssembler::new();
        while let Some(chunk) = chunks.message().await? {
            assembler.push(chunk)?;
        }
        let received = started.elapsed();
        let arrived = tokio::task::spawn_blocking(move || assembler.finish())
            .await
            .map_err(|e| Status::internal(format!("checking the weights failed: {e}")))??;
        let (update, new_base) = self.with_base(arrived)?;
        tracing::debug!(target: "areal::serve", version = update.version, receive_ms = received.as_secs_f64() * 1e3, check_ms = (started.elapsed() - received).as_secs_f64() * 1e3, "weights received");
        self.load(update, new_base).await
    }

    async fn load_weights(
        &self,
        request: Request<pb::LoadWeightsRequest>,
    ) -> Result<Response<pb::WeightsHeld>, Status> {
        let request = request.into_inner();
        check_header(request.header.as_ref())?;
        let path = Path::new(&request.path).to_owned();
        let update = tokio::task::spawn_blocking(move || {
            weights_folder::read(&path, request.version, &request.sha256)
        })
        .await
        .map_err(|e| Status::internal(format!("reading the weights failed: {e}")))?
        .map_err(|e| Status::invalid_argument(crate::error_chain(&e)))?;
        self.load(update, None).await
    }

    async fn stats(
        &self,
        request: Request<pb::Ping>,
    ) -> Result<Response<pb::GeneratorStats>, Status> {
        check_header(request.get_ref().header.as_ref())?;
        Ok(Response::new(areal_proto::stats(&self.generator.stats())))
    }

    async fn health(
        &self,
        request: Request<pb::Ping>,
    ) -> Result<Response<pb::GeneratorHealth>, Status> {
        check_header(request.get_ref().header.as_ref())?;
        Ok(Response::new(pb::GeneratorHealth {
            plugin: self.generator.name().to_owned(),
            version: *self.held.lock().expect("held lock"),
            paused: self.paused.load(Ordering::SeqCst),
            protocol: PROTOCOL_VERSION,
        }))
    }
}

/// Serve `generator` until `shutdown` completes, refusing requests for more than
/// `max_new_tokens` tokens (a generator that never stops would otherwise grow without
/// bound). `on_bound` gets the address actually bound (port 0 picks one) once the server
/// accepts calls.
pub async fn serve_generator(
    generator: Arc<dyn Generator>,
    max_new_tokens: usize,
    listen: Listen,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let server = GeneratorServer {
        generator,
        max_new_tokens,
        held: std::sync::Mutex::new(None),
        paused: AtomicBool::new(false),
        loading: Mutex::new(()),
        base: std::sync::Mutex::new(None),
    };
    let service = Service::new(server)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let service = guarded(service, &listen);
    serve_on(&listen, "generator", on_bound, shutdown, |server| {
        server.add_service(service)
    })
    .await
}
