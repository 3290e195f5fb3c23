//! Any generator plugin behind the subset of SGLang's or vLLM's HTTP API that RL uses
//! (`areal serve generator --api sglang|vllm`): the burn model served to any client of those
//! APIs, and the real server the `sglang` and `vllm` generators are tested against.
//!
//! Served (see [`crate::inference_api`] for the bodies): generation by token ids with
//! per-token logprobs, pause in `abort` mode and resume, weights loaded from a checkpoint
//! folder with the version the client names, the version held, health, and `/tokenize` when
//! the config's policy gives a tokenizer; LoRA adapters in PEFT's format loaded and unloaded
//! by name over the weights loaded last (`/load_lora_adapter`, `/unload_lora_adapter` for
//! SGLang, `/v1/...` for vLLM), listed in `/v1/models`, and named by requests (`lora_path`,
//! `model`). The generator holds one adapter at a time: a request naming another switches
//! it, cutting what runs with the other (their answers end in `abort`). A request this server cannot honour exactly (a
//! sampling parameter it does not implement, streaming, another pause mode) is refused with
//! HTTP 400 naming the field, never served approximately.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use areal_sdk::{
    Adapter, Completion, FinishReason, GenerateRequest, Generator, NamedTensor, PolicyVersion,
    SamplingParams, Tokenizer, WeightUpdate,
};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::inference_api::{
    InferenceApi, LoadLoraRequest, SglangGenerateRequest, SglangPauseRequest,
    SglangUpdateFromDiskRequest, TokenizeRequest, UnloadLoraRequest, VllmFinishRequest,
    VllmGenerateRequest, VllmUpdateRequest, routes,
};
use crate::security::{Listen, ServeError, ServerTls, bind, constant_time_eq};
use crate::server::{ErrorBody, refuse};
use crate::weights_folder;

struct Served {
    api: InferenceApi,
    generator: Arc<dyn Generator>,
    /// The most tokens one request may ask for.
    max_new_tokens: usize,
    tokenizer: Option<Arc<dyn Tokenizer>>,
    token: Option<String>,
    /// Versions loaded so far (the generator's own numbering), and the label the client gave
    /// each (what `weight_version` reports).
    loads: AtomicU64,
    labels: Mutex<BTreeMap<PolicyVersion, String>>,
    /// The label of the weights held; `None` before any load.
    held: Mutex<Option<(PolicyVersion, String)>>,
    /// The folder loaded last.
    model_path: Mutex<Option<PathBuf>>,
    paused: AtomicBool,
    /// One load at a time.
    loading: tokio::sync::Mutex<()>,
    /// vLLM: a weight update between `start` and `finish`, and what it loaded.
    vllm_update: Mutex<Option<Option<PolicyVersion>>>,
    requests: AtomicU64,
    /// The weights loaded last, with their architecture: the base of any adapter.
    base: Mutex<Option<(Arc<Vec<NamedTensor>>, Value)>>,
    /// The adapters loaded, by name, with their folders.
    adapters: Mutex<BTreeMap<String, (String, Arc<Adapter>)>>,
    /// The adapter the generator holds (`None`: the base).
    active: Mutex<Option<String>>,
    /// Folders adapters may be loaded from (resolved); empty: the folder holding the weights
    /// loaded last.
    adapter_dirs: Vec<PathBuf>,
}

/// Adapters one server holds at most (SGLang's default `--max-loras-per-batch`): past it, a
/// load is refused until one is unloaded, so that a client that never unloads is noticed.
pub(crate) const MAX_LOADED_ADAPTERS: usize = 8;

type Answer = Result<Response, ErrorBody>;

fn bad(message: impl Into<String>) -> ErrorBody {
    refuse(StatusCode::BAD_REQUEST, message)
}

fn ok(value: Value) -> Answer {
    Ok(axum::Json(value).into_response())
}

/// `body` as `T`, or 400 naming the field at fault.
fn parse<T: DeserializeOwned>(body: &Bytes, what: &str) -> Result<T, ErrorBody> {
    let body: &[u8] = if body.is_empty() { b"{}" } else { body };
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        bad(format!("{what}: {} (at {path})", e.inner()))
    })
}

/// Fields this server does not implement are accepted only at a value that leaves the answer
/// unchanged (an empty list: any value does).
fn check_neutral(
    other: &BTreeMap<String, Value>,
    neutral: &[(&str, &[Value])],
    where_: &str,
) -> Result<(), ErrorBody> {
    for (key, value) in other {
        match neutral.iter().find(|(k, _)| k == key) {
            Some((_, allowed))
                if value.is_null() || allowed.is_empty() || allowed.contains(value) => {}
            Some((_, allowed)) => {
                return Err(bad(format!(
                    "{where_}.{key} = {value} is not supported by this server (only {})",
                    allowed
                        .iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join(" or ")
                )));
            }
            None => {
                return Err(bad(format!(
                    "{where_}.{key} is not supported by this server"
                )));
            }
        }
    }
    Ok(())
}

impl Served {
    fn label(&self, version: PolicyVersion) -> Option<String> {
        self.labels
            .lock()
            .expect("labels lock")
            .get(&version)
            .cloned()
    }

    fn held_label(&self) -> Option<String> {
        self.held
            .lock()
            .expect("held lock")
            .as_ref()
            .map(|(_, l)| l.clone())
    }

    /// Generate, with the seed as SGLang and vLLM take it: a request that names one
    /// (`seeded`) gets the same tokens for the same input whatever else the server runs; one
    /// without draws a stream of its own.
    async fn generate(
        &self,
        input_ids: Vec<u32>,
        max_new_tokens: usize,
        sampling: SamplingParams,
        seeded: bool,
        stop_token_ids: Vec<u32>,
        adapter: Option<String>,
    ) -> Result<Completion, ErrorBody> {
        if input_ids.is_empty() {
            return Err(bad("the request has no input tokens"));
        }
        if self.held.lock().expect("held lock").is_none() {
            return Err(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "no weights loaded yet: load a checkpoint folder first",
            ));
        }
        self.activate(adapter).await?;
        sampling.check().map_err(bad)?;
        if max_new_tokens > self.max_new_tokens {
            return Err(bad(format!(
                "max_new_tokens {max_new_tokens} is past this server's bound of {} (its config's rollout.max_new_tokens)",
                self.max_new_tokens
            )));
        }
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        let (sampling, sample_id) = if seeded {
            (sampling, 0)
        } else {
            (
                SamplingParams {
                    seed: n,
                    ..sampling
                },
                n,
            )
        };
        let request = GenerateRequest {
            sample_id,
            input_ids,
            max_new_tokens,
            sampling,
            stop_token_ids,
        };
        let completion = self.generator.generate(request).await.map_err(|e| {
            // a request the generator refuses as malformed is the client's error
            let status = if e.is_invalid_request() {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            refuse(status, format!("generation failed: {e}"))
        })?;
        // Never answer what no client can train on (NaN logprobs from damaged weights).
        completion.check().map_err(|e| {
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the generator produced a malformed completion: {e}"),
            )
        })?;
        Ok(completion)
    }

    /// Load the checkpoint folder at `path`; the generator's number for it.
    async fn load(&self, path: &str) -> Result<PolicyVersion, ErrorBody> {
        let folder = PathBuf::from(path);
        if !folder.is_absolute() || !folder.is_dir() {
            return Err(bad(format!(
                "{path:?} is not an absolute path to a folder this server can read"
            )));
        }
        let _one_at_a_time = self.loading.lock().await;
        let read = {
            let folder = folder.clone();
            tokio::task::spawn_blocking(move || weights_folder::read_checkpoint(&folder))
        };
        let (tensors, architecture, _) = read
            .await
            .map_err(|e| refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
            .map_err(|e| {
                bad(format!(
                    "cannot read the checkpoint: {}",
                    crate::error_chain(&e)
                ))
            })?;
        areal_sdk::NamedTensor::check_finite(&tensors)
            .map_err(|e| bad(format!("cannot load {path}: {e}")))?;
        let version = self.loads.fetch_add(1, Ordering::SeqCst);
        let update = WeightUpdate::new(version, tensors).with_architecture(architecture.clone());
        let tensors = update.tensors.clone();
        self.generator
            .update_weights(update)
            .await
            .map_err(|e| bad(format!("cannot load {path}: {e}")))?;
        *self.model_path.lock().expect("path lock") = Some(folder);
        *self.base.lock().expect("base lock") = Some((tensors, architecture));
        // adapters of other weights mean nothing over these
        self.adapters.lock().expect("adapters lock").clear();
        *self.active.lock().expect("active lock") = None;
        tracing::info!(target: "areal::serve", path, "weights loaded");
        Ok(version)
    }

    /// Load the PEFT adapter folder at `path` under `name`, over the weights loaded last;
    /// each of its matrices must fit the projection it adapts.
    async fn load_adapter(&self, name: &str, path: &str, inplace: bool) -> Result<(), ErrorBody> {
        if name.is_empty() {
            return Err(bad("lora_name is empty"));
        }
        let folder = PathBuf::from(path);
        if !folder.is_absolute() || !folder.is_dir() {
            return Err(bad(format!(
                "{path:?} is not an absolute path to a folder this server can read"
            )));
        }
        let Some((base, _)) = self.base.lock().expect("base lock").clone() else {
            return Err(bad("no weights loaded yet: an adapter needs its base"));
        };
        // a client names a folder on the server's disk: only those it may load from (links
        // resolved), as SGLang's and vLLM's deployments restrict it
        let folder = folder
            .canonicalize()
            .map_err(|e| bad(format!("{path:?}: {e}")))?;
        let allowed = if self.adapter_dirs.is_empty() {
            let loaded = self.model_path.lock().expect("path lock").clone();
            loaded
                .and_then(|p| p.canonicalize().ok())
                .and_then(|p| p.parent().map(Path::to_path_buf))
                .into_iter()
                .collect()
        } else {
            self.adapter_dirs.clone()
        };
        if !allowed.iter().any(|dir| folder.starts_with(dir)) {
            let dirs: Vec<String> = allowed.iter().map(|d| d.display().to_string()).collect();
            return Err(refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "{path:?} is outside the folders this server loads adapters from ({}): start it with --adapter-dir to allow others",
                    if dirs.is_empty() {
                        "none yet".to_owned()
                    } else {
                        dirs.join(", ")
                    }
                ),
            ));
        }
        // checked before the folder is read (a cheap refusal) and again, with the insertion,
        // under one lock: loads that run together never pass the bound between them
        let admissible = |adapters: &BTreeMap<String, (String, Arc<Adapter>)>| {
            if adapters.contains_key(name) && !inplace {
                return Err(bad(format!("the adapter {name:?} is already loaded")));
            }
            if !adapters.contains_key(name) && adapters.len() >= MAX_LOADED_ADAPTERS {
                return Err(bad(format!(
                    "this server holds {MAX_LOADED_ADAPTERS} adapters, its most: unload one first"
                )));
            }
            Ok(())
        };
        admissible(&self.adapters.lock().expect("adapters lock"))?;
        let read_over = base.clone();
        let adapter = tokio::task::spawn_blocking(move || {
            let adapter = weights_folder::read_adapter(&folder)
                .map_err(|e| format!("cannot read the adapter: {}", crate::error_chain(&e)))?;
            fits(&adapter, &read_over).map(|()| adapter)
        })
        .await
        .map_err(|e| refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(bad)?;
        let _one_at_a_time = self.loading.lock().await;
        let held = self.base.lock().expect("base lock").clone();
        if !held.is_some_and(|(now, _)| Arc::ptr_eq(&now, &base)) {
            return Err(bad(
                "other weights were loaded while the adapter was read: load it again over them",
            ));
        }
        {
            let mut adapters = self.adapters.lock().expect("adapters lock");
            admissible(&adapters)?;
            adapters.insert(name.to_owned(), (path.to_owned(), Arc::new(adapter)));
        }
        let mut active = self.active.lock().expect("active lock");
        if active.as_deref() == Some(name) {
            // replaced in place: switched to again by the next request that names it
            *active = Some(String::new());
        }
        tracing::info!(target: "areal::serve", name, path, "adapter loaded");
        Ok(())
    }

    fn unload_adapter(&self, name: &str) -> Result<(), ErrorBody> {
        if self
            .adapters
            .lock()
            .expect("adapters lock")
            .remove(name)
            .is_none()
        {
            return Err(bad(format!("no adapter {name:?} is loaded")));
        }
        tracing::info!(target: "areal::serve", name, "adapter unloaded");
        Ok(())
    }

    /// Have the generator hold `adapter` (by name; `None`: the base alone).
    async fn activate(&self, adapter: Option<String>) -> Result<(), ErrorBody> {
        if *self.active.lock().expect("active lock") == adapter {
            return Ok(());
        }
        let _one_at_a_time = self.loading.lock().await;
        if *self.active.lock().expect("active lock") == adapter {
            return Ok(());
        }
        let Some((base, architecture)) = self.base.lock().expect("base lock").clone() else {
            return Err(bad("no weights loaded yet"));
        };
        let version = self.loads.fetch_add(1, Ordering::SeqCst);
        let update = match &adapter {
            None => WeightUpdate {
                tensors: base,
                ..WeightUpdate::new(version, Vec::new())
            },
            Some(name) => {
                let Some((_, loaded)) = self
                    .adapters
                    .lock()
                    .expect("adapters lock")
                    .get(name)
                    .cloned()
                else {
                    return Err(refuse(
                        StatusCode::NOT_FOUND,
                        format!("no adapter {name:?} is loaded (load it first)"),
                    ));
                };
                WeightUpdate::adapted(version, base, (*loaded).clone())
            }
        }
        .with_architecture(architecture);
        self.generator.update_weights(update).await.map_err(|e| {
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot switch to {adapter:?}: {e}"),
            )
        })?;
        if let Some(label) = self.held_label() {
            self.labels
                .lock()
                .expect("labels lock")
                .insert(version, label);
        }
        *self.active.lock().expect("active lock") = adapter;
        Ok(())
    }

    /// `GET /v1/models`: the weights loaded, and each adapter with them as its parent.
    fn models(&self) -> Value {
        let root = self
            .model_path
            .lock()
            .expect("path lock")
            .as_ref()
            .map(|p| p.display().to_string());
        let base = root.clone().unwrap_or_else(|| "default".into());
        let mut data = vec![json!({
            "id": base, "object": "model", "owned_by": "areal-rs", "root": root, "parent": null,
        })];
        for (name, (path, _)) in self.adapters.lock().expect("adapters lock").iter() {
            data.push(json!({
                "id": name, "object": "model", "owned_by": "areal-rs", "root": path, "parent": base,
            }));
        }
        json!({ "object": "list", "data": data })
    }

    /// Weights `version` are held, reported as `label`.
    fn hold(&self, version: PolicyVersion, label: Option<String>) {
        let label = label
            .or_else(|| self.held_label())
            .unwrap_or_else(|| "default".into());
        self.labels
            .lock()
            .expect("labels lock")
            .insert(version, label.clone());
        *self.held.lock().expect("held lock") = Some((version, label));
    }

    async fn pause(&self, mode: &str) -> Result<(), ErrorBody> {
        if mode != "abort" {
            return Err(bad(format!(
                "pause mode {mode:?} is not supported by this server (only \"abort\": running requests return at once with what they have)"
            )));
        }
        self.generator.pause().await.map_err(|e| {
            refuse(
                StatusCode::NOT_IMPLEMENTED,
                format!("the generator cannot pause: {e}"),
            )
        })?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn resume(&self) -> Result<(), ErrorBody> {
        if self.paused.swap(false, Ordering::SeqCst) {
            self.generator.resume().await.map_err(|e| {
                refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("cannot resume: {e}"),
                )
            })?;
        }
        Ok(())
    }

    fn tokenize(&self, body: &Bytes) -> Answer {
        let Some(tokenizer) = &self.tokenizer else {
            return Err(refuse(
                StatusCode::NOT_FOUND,
                "this server has no tokenizer (its config's [policy] gives none)",
            ));
        };
        let request: TokenizeRequest = parse(body, "tokenize")?;
        let tokens = tokenizer
            .encode(&request.prompt)
            .map_err(|e| bad(e.to_string()))?;
        ok(json!({ "count": tokens.len(), "max_model_len": null, "tokens": tokens }))
    }
}

/// Whether every matrix of `adapter` fits the projection of `base` it adapts: PEFT's
/// `…<module>.lora_A.weight` `[rank, in]` and `lora_B.weight` `[out, rank]` over
/// `<module>.weight` `[out, in]`.
fn fits(adapter: &Adapter, base: &[NamedTensor]) -> Result<(), String> {
    if adapter.tensors.is_empty() {
        return Err("the adapter holds no tensors".into());
    }
    for t in &adapter.tensors {
        let module = t.name.strip_prefix("base_model.model.").and_then(|n| {
            n.strip_suffix(".lora_A.weight")
                .map(|m| (m, 'A'))
                .or_else(|| n.strip_suffix(".lora_B.weight").map(|m| (m, 'B')))
        });
        let Some((module, matrix)) = module else {
            return Err(format!("`{}` is not a LoRA matrix in PEFT's names", t.name));
        };
        let weight = format!("{module}.weight");
        let Some(w) = base.iter().find(|b| b.name == weight) else {
            return Err(format!(
                "`{}` adapts `{weight}`, which the weights do not have",
                t.name
            ));
        };
        let ok = match (matrix, t.shape.as_slice(), w.shape.as_slice()) {
            ('A', [_, i], [_, wi]) => i == wi,
            ('B', [o, _], [wo, _]) => o == wo,
            _ => false,
        };
        if !ok {
            return Err(format!(
                "`{}` has shape {:?}, which does not fit `{weight}` of shape {:?}",
                t.name, t.shape, w.shape
            ));
        }
    }
    Ok(())
}

fn finish_sglang(c: &Completion) -> Value {
    match c.finish_reason {
        FinishReason::Stop => json!({ "type": "stop", "matched": c.token_ids.last() }),
        FinishReason::Length => json!({ "type": "length", "length": c.len() }),
        FinishReason::Interrupted => {
            json!({ "type": "abort", "message": "paused for new weights" })
        }
    }
}

fn finish_vllm(c: &Completion) -> &'static str {
    match c.finish_reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Interrupted => "abort",
    }
}

fn neutral_sampling() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        ("top_k", vec![json!(-1), json!(0)]),
        ("min_p", vec![json!(0), json!(0.0)]),
        ("frequency_penalty", vec![json!(0), json!(0.0)]),
        ("presence_penalty", vec![json!(0), json!(0.0)]),
        ("repetition_penalty", vec![json!(1), json!(1.0)]),
        ("n", vec![json!(1)]),
        ("ignore_eos", vec![json!(false)]),
        ("no_stop_trim", vec![json!(false), json!(true)]),
        (
            "spaces_between_special_tokens",
            vec![json!(false), json!(true)],
        ),
        ("skip_special_tokens", vec![json!(false), json!(true)]),
        (
            "include_stop_str_in_output",
            vec![json!(false), json!(true)],
        ),
        ("stop", vec![json!([])]),
        ("min_new_tokens", vec![json!(0)]),
        ("min_tokens", vec![json!(0)]),
    ]
}

fn check_fields(
    other: &BTreeMap<String, Value>,
    neutral: &[(&'static str, Vec<Value>)],
    where_: &str,
) -> Result<(), ErrorBody> {
    let table: Vec<(&str, &[Value])> = neutral.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    check_neutral(other, &table, where_)
}

fn check_sampling(other: &BTreeMap<String, Value>) -> Result<(), ErrorBody> {
    check_fields(other, &neutral_sampling(), "sampling_params")
}

/// Fields of SGLang's `GenerateReqInput` besides those read, at values that change nothing
/// here.
fn neutral_sglang_request() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        ("return_text_in_logprobs", vec![]),
        ("logprob_start_len", vec![json!(-1)]),
        ("top_logprobs_num", vec![json!(0)]),
        ("log_metrics", vec![]),
    ]
}

/// Fields of vLLM's `GenerateRequest` besides those read, at values that change nothing here.
fn neutral_vllm_request() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        ("priority", vec![json!(0)]),
        ("cache_salt", vec![]),
        ("stream_options", vec![]),
    ]
}

async fn sglang_generate(State(s): State<Arc<Served>>, body: Bytes) -> Answer {
    let request: SglangGenerateRequest = parse(&body, "generate")?;
    if request.stream {
        return Err(bad("stream = true is not supported by this server"));
    }
    check_fields(&request.other, &neutral_sglang_request(), "generate")?;
    let p = request.sampling_params;
    check_sampling(&p.other)?;
    let sampling = SamplingParams {
        temperature: p.temperature,
        top_p: p.top_p,
        seed: p.sampling_seed.unwrap_or_default(),
    };
    let c = s
        .generate(
            request.input_ids.clone(),
            p.max_new_tokens,
            sampling,
            p.sampling_seed.is_some(),
            p.stop_token_ids,
            request.lora_path.clone(),
        )
        .await?;
    let text = match &s.tokenizer {
        Some(t) => t.decode(&c.token_ids).unwrap_or_default(),
        None => String::new(),
    };
    let logprobs: Vec<Value> = c
        .token_ids
        .iter()
        .zip(&c.behaviour_logprobs)
        .map(|(id, lp)| json!([lp, id, null]))
        .collect();
    let version = c
        .versions
        .first()
        .and_then(|&v| s.label(v))
        .or_else(|| s.held_label());
    ok(json!({
        "text": text,
        "output_ids": c.token_ids,
        "meta_info": {
            "id": request.rid.unwrap_or_default(),
            "finish_reason": finish_sglang(&c),
            "prompt_tokens": request.input_ids.len(),
            "completion_tokens": c.len(),
            "cached_tokens": 0,
            "weight_version": version,
            "output_token_logprobs": logprobs,
        }
    }))
}

async fn sglang_pause(State(s): State<Arc<Served>>, body: Bytes) -> Answer {
    let request: SglangPauseRequest = parse(&body, "pause_generation")?;
    s.pause(&request.mode).await?;
    ok(json!({ "message": "Generation paused successfully.", "status": "ok" }))
}

async fn sglang_continue(State(s): State<Arc<Served>>) -> Answer {
    s.resume().await?;
    ok(json!({ "message": "Generation continued successfully.", "status": "ok" }))
}

async fn sglang_update_from_disk(State(s): State<Arc<Served>>, body: Bytes) -> Answer {
    let request: SglangUpdateFromDiskRequest = parse(&body, "update_weights_from_disk")?;
    match s.load(&request.model_path).await {
        Ok(version) => {
            s.hold(version, request.weight_version.clone());
            let mut message = "Succeeded to update model weights.".to_owned();
            if let Some(v) = &request.weight_version {
                message.push_str(&format!(" Weight version updated to {v}."));
            }
            ok(json!({ "success": true, "message": message, "num_paused_requests": 0 }))
        }
        Err(ErrorBody(status, error)) => Ok((
            status,
            axum::Json(json!({
                "success": false,
                "message": error["message"],
                "num_paused_requests": 0,
            })),
        )
            .into_response()),
    }
}

async fn weight_version(State(s): State<Arc<Served>>) -> Answer {
    ok(json!({ "weight_version": s.held_label() }))
}

async fn sglang_model_info(State(s): State<Arc<Served>>) -> Answer {
    let path = s.model_path.lock().expect("path lock").clone();
    ok(json!({
        "model_path": path.map(|p| p.display().to_string()),
        "tokenizer_path": null,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": s.held_label(),
        "served_by": format!("areal-rs {} ({})", env!("CARGO_PKG_VERSION"), s.generator.name()),
    }))
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn tokenize(State(s): State<Arc<Served>>, body: Bytes) -> Answer {
    s.tokenize(&body)
}

async fn vllm_generate(State(s): State<Arc<Served>>, body: Bytes) -> Answer {
    let request: VllmGenerateRequest = parse(&body, "generate")?;
    if request.stream {
        return Err(bad("stream = true is not supported by this server"));
    }
    check_fields(&request.other, &neutral_vllm_request(), "generate")?;
    let p = request.sampling_params;
    let mut other = p.other.clone();
    // text handling has no effect on ids
    other.remove("detokenize");
    check_sampling(&other)?;
    let sampling = SamplingParams {
        temperature: p.temperature,
        top_p: p.top_p,
        seed: p.seed.unwrap_or_default(),
    };
    // a model that names a loaded adapter generates with it; any other is the weights loaded
    let adapter = request
        .model
        .filter(|m| s.adapters.lock().expect("adapters lock").contains_key(m));
    let c = s
        .generate(
            request.token_ids,
            p.max_tokens,
            sampling,
            p.seed.is_some(),
            p.stop_token_ids,
            adapter,
        )
        .await?;
    let logprobs = p.logprobs.map(|_| {
        let content: Vec<Value> = c
            .token_ids
            .iter()
            .zip(&c.behaviour_logprobs)
            .map(|(id, lp)| {
                let lp = f64::from(*lp).max(-9999.0);
                json!({
                    "token": format!("token_id:{id}"),
                    "logprob": lp,
                    "bytes": null,
                    "top_logprobs": [{ "token": format!("token_id:{id}"), "logprob": lp, "bytes": null }],
                })
            })
            .collect();
        json!({ "content": content })
    });
    ok(json!({
        "request_id": format!("generate-tokens-{}", request.request_id.unwrap_or_default()),
        "choices": [{
            "index": 0,
            "logprobs": logprobs,
            "finish_reason": finish_vllm(&c),
            "token_ids": c.token_ids,
        }],
        "prompt_logprobs": null,
        "kv_transfer_params": null,
    }))
}

#[derive(Deserialize)]
struct PauseQuery {
    #[serde(default = "abort_mode")]
    mode: String,
}

fn abort_mode() -> String {
    "abort".into()
}

async fn vllm_pause(State(s): State<Arc<Served>>, Query(q): Query<PauseQuery>) -> Answer {
    s.pause(&q.mode).await?;
    ok(json!({ "status": "paused" }))
}

async fn vllm_resume(State(s): State<Arc<Served>>) -> Answer {
    s.resume().await?;
    ok(json!({ "status": "resumed" }))
}

async fn vllm_is_paused(State(s): State<Arc<Served>>) -> Answer {
    ok(json!({ "is_paused": s.paused.load(Ordering::SeqCst) }))
}

async fn vllm_init_transfer(body: Bytes) -> Answer {
    let body: Value = parse(&body, "init_weight_transfer_engine")?;
    if body.get("init_info").is_none() {
        return Err(bad("Missing 'init_info' in request body"));
    }
    ok(json!({ "message": "Weight transfer initialized" }))
}

async fn vllm_start_update(State(s): State<Arc<Served>>) -> Answer {
    // a client that died mid-update leaves one open: a new start replaces it
    *s.vllm_update.lock().expect("update lock") = Some(None);
    ok(json!({ "message": "Weight update started" }))
}

async fn vllm_update(State(s): State<Arc<Served>>, body: Bytes) -> Answer {
    if s.vllm_update.lock().expect("update lock").is_none() {
        return Err(bad(
            "start_weight_update must be called before loading a checkpoint",
        ));
    }
    let request: VllmUpdateRequest = parse(&body, "update_weights")?;
    let version = s.load(&request.update_info.path).await?;
    *s.vllm_update.lock().expect("update lock") = Some(Some(version));
    ok(json!({ "message": "Weights updated" }))
}

async fn vllm_finish_update(State(s): State<Arc<Served>>, body: Bytes) -> Answer {
    let request: VllmFinishRequest = parse(&body, "finish_weight_update")?;
    let loaded = s.vllm_update.lock().expect("update lock").take();
    match loaded {
        Some(Some(version)) => {
            s.hold(version, request.weight_version);
            ok(json!({ "message": "Weight update finished" }))
        }
        Some(None) => Err(bad(
            "No checkpoint was loaded during the shared-disk update session",
        )),
        None => Err(bad("No shared-disk weight update is active")),
    }
}

async fn sglang_load_lora(State(s): State<Arc<Served>>, body: Bytes) -> Answer {
    let request: LoadLoraRequest = parse(&body, "load_lora_adapter")?;
    let done = s
        .load_adapter(&request.lora_name, &request.lora_path, false)
        .await;
    sglang_lora_answer(&s, done)
}

async fn sglang_unload_lora(State(s): State<Arc<Served>>, body: Bytes) -> Answer {
    let request: UnloadLoraRequest = parse(&body, "unload_lora_adapter")?;
    let done = s.unload_adapter(&request.lora_name);
    sglang_lora_answer(&s, done)
}

/// SGLang's `LoRAUpdateOutput`: 200 on success, 400 with `success: false` otherwise.
fn sglang_lora_answer(s: &Served, done: Result<(), ErrorBody>) -> Answer {
    let loaded: BTreeMap<String, String> = s
        .adapters
        .lock()
        .expect("adapters lock")
        .iter()
        .map(|(name, (path, _))| (name.clone(), path.clone()))
        .collect();
    let (status, success, error) = match done {
        Ok(()) => (StatusCode::OK, true, Value::Null),
        Err(ErrorBody(status, error)) => (status, false, error["message"].clone()),
    };
    Ok((
        status,
        axum::Json(
            json!({ "success": success, "error_message": error, "loaded_adapters": loaded }),
        ),
    )
        .into_response())
}

async fn vllm_load_lora(State(s): State<Arc<Served>>, body: Bytes) -> Result<String, ErrorBody> {
    let request: LoadLoraRequest = parse(&body, "load_lora_adapter")?;
    let inplace = request.load_inplace.unwrap_or(false);
    s.load_adapter(&request.lora_name, &request.lora_path, inplace)
        .await?;
    Ok(format!(
        "Success: LoRA adapter '{}' added successfully.",
        request.lora_name
    ))
}

async fn vllm_unload_lora(State(s): State<Arc<Served>>, body: Bytes) -> Result<String, ErrorBody> {
    let request: UnloadLoraRequest = parse(&body, "unload_lora_adapter")?;
    s.unload_adapter(&request.lora_name)?;
    Ok(format!(
        "Success: LoRA adapter '{}' removed successfully.",
        request.lora_name
    ))
}

async fn models(State(s): State<Arc<Served>>) -> Answer {
    ok(s.models())
}

/// Refuse calls without the bearer token, when there is one.
async fn require_token(
    State(s): State<Arc<Served>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    if let Some(token) = &s.token {
        let sent = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !sent.is_some_and(|t| constant_time_eq(t.as_bytes(), token.as_bytes())) {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "this server needs a token: send `Authorization: Bearer <token>`",
            )
            .into_response();
        }
    }
    next.run(request).await
}

fn router(served: Arc<Served>) -> Router {
    let router = match served.api {
        InferenceApi::Sglang => Router::new()
            .route(routes::SGLANG_GENERATE, post(sglang_generate))
            .route(routes::SGLANG_PAUSE, post(sglang_pause))
            .route(routes::SGLANG_CONTINUE, post(sglang_continue))
            .route(
                routes::SGLANG_UPDATE_FROM_DISK,
                post(sglang_update_from_disk),
            )
            .route(routes::SGLANG_WEIGHT_VERSION, get(weight_version))
            .route(routes::SGLANG_MODEL_INFO, get(sglang_model_info))
            .route("/health_generate", get(health))
            .route("/v1/tokenize", post(tokenize))
            .route(routes::SGLANG_LOAD_LORA, post(sglang_load_lora))
            .route(routes::SGLANG_UNLOAD_LORA, post(sglang_unload_lora)),
        InferenceApi::Vllm => Router::new()
            .route(routes::VLLM_GENERATE, post(vllm_generate))
            .route(routes::VLLM_PAUSE, post(vllm_pause))
            .route(routes::VLLM_RESUME, post(vllm_resume))
            .route(routes::VLLM_IS_PAUSED, get(vllm_is_paused))
            .route(routes::VLLM_INIT_TRANSFER, post(vllm_init_transfer))
            .route(routes::VLLM_START_UPDATE, post(vllm_start_update))
            .route(routes::VLLM_UPDATE, post(vllm_update))
            .route(routes::VLLM_FINISH_UPDATE, post(vllm_finish_update))
            .route(routes::VLLM_WEIGHT_INFO, get(weight_version))
            .route(routes::VLLM_LOAD_LORA, post(vllm_load_lora))
            .route(routes::VLLM_UNLOAD_LORA, post(vllm_unload_lora)),
    };
    router
        .route(routes::HEALTH, get(health))
        .route(routes::MODELS, get(models))
        .route(routes::TOKENIZE, post(tokenize))
        // the body is read (bounded) only once the token is checked: layers added later run
        // first
        .layer(axum::middleware::from_fn(crate::server::bounded_body))
        .layer(axum::middleware::from_fn_with_state(
            served.clone(),
            require_token,
        ))
        .with_state(served)
}

/// Serve `generator` (with `tokenizer` for `/tokenize`, if given) behind `api` until
/// `shutdown` completes, refusing requests for more than `max_new_tokens` tokens.
/// `on_bound` gets the address actually bound (port 0 picks one) once the server accepts
/// calls. If `initial` is given, that checkpoint folder is loaded first (as the model a
/// server starts with), reported as version `default`. Adapters load only from folders
/// under `adapter_dirs`, or, when it is empty, under the folder that holds the weights
/// loaded last (where a client's `weights_dir` puts the base and each version's adapter).
#[allow(
    clippy::too_many_arguments,
    reason = "the server's parts, each a caller's choice"
)]
pub async fn serve_inference_api(
    api: InferenceApi,
    generator: Arc<dyn Generator>,
    max_new_tokens: usize,
    tokenizer: Option<Arc<dyn Tokenizer>>,
    initial: Option<&Path>,
    adapter_dirs: &[PathBuf],
    listen: Listen,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let tls = listen.tls.as_ref().map(ServerTls::rustls).transpose()?;
    let adapter_dirs = adapter_dirs
        .iter()
        .map(|dir| {
            dir.canonicalize().map_err(|e| {
                ServeError::Unsupported(format!("the adapter folder {}: {e}", dir.display()))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let served = Arc::new(Served {
        adapter_dirs,
        api,
        generator,
        max_new_tokens,
        tokenizer,
        token: listen.token.clone().filter(|t| !t.is_empty()),
        loads: AtomicU64::new(0),
        labels: Mutex::new(BTreeMap::new()),
        held: Mutex::new(None),
        model_path: Mutex::new(None),
        paused: AtomicBool::new(false),
        loading: tokio::sync::Mutex::new(()),
        vllm_update: Mutex::new(None),
        requests: AtomicU64::new(0),
        base: Mutex::new(None),
        adapters: Mutex::new(BTreeMap::new()),
        active: Mutex::new(None),
    });
    if let Some(folder) = initial {
        let path = folder.display().to_string();
        let version = served.load(&path).await.map_err(|ErrorBody(_, e)| {
            ServeError::Unsupported(format!("{path}: {}", e["message"]))
        })?;
        served.hold(version, None);
    }
    let (listener, addr) = bind(&listen).await?;
    tracing::info!(target: "areal::serve", %addr, api = api.name(), "inference API listening");
    on_bound(addr);
    crate::server::serve_http(listener, router(served), tls, shutdown).await;
    Ok(())
}
