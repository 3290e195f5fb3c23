//! The HTTP APIs of SGLang and vLLM that areal-rs speaks, in one place: routes, request and
//! response bodies, with their field names as those projects' sources define them.
//!
//! - **SGLang** (`python/sglang/srt/entrypoints/http_server.py`, `managers/io_struct.py`):
//!   `POST /generate` (`GenerateReqInput`: `input_ids`, `sampling_params`, `return_logprob`);
//!   the answer's `meta_info.output_token_logprobs` is `[[logprob, token_id, text], ...]` and
//!   `meta_info.finish_reason.type` is `stop`, `length` or `abort`. `POST /pause_generation`
//!   (`mode`), `POST /continue_generation`, `POST /update_weights_from_disk`
//!   (`UpdateWeightFromDiskReqInput`: `model_path`, `weight_version`, ...) answering
//!   `{success, message, num_paused_requests}`, `GET /get_weight_version`, `GET /health`,
//!   `POST /tokenize`.
//! - **vLLM** (`vllm/entrypoints/serve/disagg/protocol.py`, `serve/dev/rlhf/api_router.py`,
//!   `distributed/weight_transfer/disk_engine.py`; the RL routes need `VLLM_SERVER_DEV_MODE=1`):
//!   `POST /inference/v1/generate` (`token_ids`, `sampling_params`) answering
//!   `choices[0].{token_ids, logprobs.content[].logprob, finish_reason}`; `POST /pause?mode=`,
//!   `POST /resume`, `GET /is_paused`; weights through the `disk` weight-transfer backend:
//!   `POST /init_weight_transfer_engine {init_info}`, `POST /start_weight_update`,
//!   `POST /update_weights {update_info: {path}}`, `POST /finish_weight_update
//!   {weight_version}`, `GET /weight_info`; `GET /health`, `POST /tokenize`.
//!
//! Answers are read leniently (fields this side does not use are ignored, as both projects add
//! fields often); what is read is checked.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which API a server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InferenceApi {
    /// SGLang's native API.
    Sglang,
    /// vLLM's token-in/token-out and RL routes.
    Vllm,
}

impl InferenceApi {
    /// Its name in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sglang => "sglang",
            Self::Vllm => "vllm",
        }
    }
}

/// The routes, by API.
pub(crate) mod routes {
    /// Both APIs: liveness.
    pub(crate) const HEALTH: &str = "/health";
    /// Both APIs: text to token ids with the served model's tokenizer.
    pub(crate) const TOKENIZE: &str = "/tokenize";

    /// SGLang: generate.
    pub(crate) const SGLANG_GENERATE: &str = "/generate";
    /// SGLang: pause (body `{"mode": ...}`).
    pub(crate) const SGLANG_PAUSE: &str = "/pause_generation";
    /// SGLang: resume.
    pub(crate) const SGLANG_CONTINUE: &str = "/continue_generation";
    /// SGLang: load weights from a folder.
    pub(crate) const SGLANG_UPDATE_FROM_DISK: &str = "/update_weights_from_disk";
    /// SGLang: the version of the weights held.
    pub(crate) const SGLANG_WEIGHT_VERSION: &str = "/get_weight_version";
    /// SGLang: what is served.
    pub(crate) const SGLANG_MODEL_INFO: &str = "/get_model_info";
    /// SGLang: load a LoRA adapter (`--enable-lora`).
    pub(crate) const SGLANG_LOAD_LORA: &str = "/load_lora_adapter";
    /// SGLang: unload a LoRA adapter.
    pub(crate) const SGLANG_UNLOAD_LORA: &str = "/unload_lora_adapter";
    /// vLLM: load a LoRA adapter (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`).
    pub(crate) const VLLM_LOAD_LORA: &str = "/v1/load_lora_adapter";
    /// vLLM: unload a LoRA adapter.
    pub(crate) const VLLM_UNLOAD_LORA: &str = "/v1/unload_lora_adapter";
    /// Both APIs (OpenAI's): the models served, LoRA adapters included (`parent` set).
    pub(crate) const MODELS: &str = "/v1/models";

    /// vLLM: tokens in, tokens out.
    pub(crate) const VLLM_GENERATE: &str = "/inference/v1/generate";
    /// vLLM: pause (query `mode=abort|wait|keep`).
    pub(crate) const VLLM_PAUSE: &str = "/pause";
    /// vLLM: resume.
    pub(crate) const VLLM_RESUME: &str = "/resume";
    /// vLLM: whether paused.
    pub(crate) const VLLM_IS_PAUSED: &str = "/is_paused";
    /// vLLM weight transfer, step 1 of 4 (once per engine; a no-op for the disk backend).
    pub(crate) const VLLM_INIT_TRANSFER: &str = "/init_weight_transfer_engine";
    /// vLLM weight transfer, step 2.
    pub(crate) const VLLM_START_UPDATE: &str = "/start_weight_update";
    /// vLLM weight transfer, step 3 (`update_info.path` for the disk backend).
    pub(crate) const VLLM_UPDATE: &str = "/update_weights";
    /// vLLM weight transfer, step 4 (sets the version).
    pub(crate) const VLLM_FINISH_UPDATE: &str = "/finish_weight_update";
    /// vLLM: the version of the weights held.
    pub(crate) const VLLM_WEIGHT_INFO: &str = "/weight_info";
}

// ---------------------------------------------------------------------------------------
// SGLang

/// `POST /generate`: SGLang's `GenerateReqInput`, the fields areal-rs sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SglangGenerateRequest {
    /// The prompt (and any output before an interruption).
    pub input_ids: Vec<u32>,
    /// How to sample.
    pub sampling_params: SglangSamplingParams,
    /// Ask for the logprob of each sampled token.
    #[serde(default)]
    pub return_logprob: bool,
    /// Stream server-sent events (not used by areal-rs; refused by its server).
    #[serde(default)]
    pub stream: bool,
    /// The request id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rid: Option<String>,
    /// The LoRA adapter to generate with, by the name it was loaded under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_path: Option<String>,
    /// Other fields of `GenerateReqInput`: a server refuses those it does not implement.
    #[serde(flatten, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// SGLang's `sampling_params` (its `SamplingParams`), the fields areal-rs sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SglangSamplingParams {
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[serde(default = "one")]
    pub temperature: f32,
    /// Nucleus sampling.
    #[serde(default = "one")]
    pub top_p: f32,
    /// Generation stops after any of these (the token is part of the output).
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// The request's own random stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_seed: Option<u64>,
    /// Keep special tokens in the text (areal-rs reads ids, not text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// Other sampling parameters: a server refuses those that would change sampling.
    #[serde(flatten, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, serde_json::Value>,
}

fn one() -> f32 {
    1.0
}

/// SGLang's answer to `/generate` (not streamed), the fields areal-rs reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SglangGenerateResponse {
    /// The output as text (empty from a server without a tokenizer).
    #[serde(default)]
    pub text: String,
    /// The output token ids (newer servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_ids: Option<Vec<u32>>,
    /// Everything else.
    pub meta_info: SglangMetaInfo,
}

/// `meta_info` of an SGLang answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SglangMetaInfo {
    /// The request id.
    #[serde(default)]
    pub id: String,
    /// Why it ended.
    pub finish_reason: SglangFinishReason,
    /// Prompt length.
    #[serde(default)]
    pub prompt_tokens: usize,
    /// Output length.
    #[serde(default)]
    pub completion_tokens: usize,
    /// `[logprob, token_id, text or null]` per output token (with `return_logprob`).
    #[serde(default)]
    pub output_token_logprobs: Vec<(f64, u32, Option<String>)>,
    /// The version of the weights that served it (servers that track one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
}

/// `meta_info.finish_reason`: `{"type": "stop", "matched": ...}`, `{"type": "length",
/// "length": n}` or `{"type": "abort", "message": ...}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SglangFinishReason {
    /// `stop`, `length` or `abort`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The stop token or string matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<serde_json::Value>,
    /// Why it was aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The length reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<usize>,
}

/// `POST /pause_generation`: SGLang's `PauseGenerationReqInput`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SglangPauseRequest {
    /// `abort` (in-flight requests return at once with what they have), `retract` or
    /// `in_place`. areal-rs uses `abort`.
    #[serde(default = "abort")]
    pub mode: String,
}

fn abort() -> String {
    "abort".into()
}

/// `POST /update_weights_from_disk`: SGLang's `UpdateWeightFromDiskReqInput`, the fields
/// areal-rs sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SglangUpdateFromDiskRequest {
    /// The checkpoint folder (`config.json` + safetensors), as the server sees it.
    pub model_path: String,
    /// The version the server reports once loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
    /// Abort running requests first (areal-rs has paused them already).
    #[serde(default)]
    pub abort_all_requests: bool,
    /// Drop the prefix cache (computed with the old weights).
    #[serde(default = "yes")]
    pub flush_cache: bool,
    /// Other fields: a server ignores those it does not implement.
    #[serde(flatten, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, serde_json::Value>,
}

fn yes() -> bool {
    true
}

/// SGLang's answer to `/update_weights_from_disk`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SglangUpdateResponse {
    /// Whether the weights were loaded.
    pub success: bool,
    /// What happened.
    #[serde(default)]
    pub message: String,
    /// Requests paused while loading.
    #[serde(default)]
    pub num_paused_requests: Option<u64>,
}

/// `GET /get_weight_version` (SGLang) and `GET /weight_info` (vLLM): the version held, as the
/// string last given to the server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightVersion {
    /// `null` before any was set.
    pub weight_version: Option<String>,
}

/// `POST /load_lora_adapter` (SGLang) and `/v1/load_lora_adapter` (vLLM): an adapter folder
/// in PEFT's format, loaded under a name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadLoraRequest {
    /// The name requests will give.
    pub lora_name: String,
    /// The folder, as the server sees it.
    pub lora_path: String,
    /// vLLM: replace an adapter already loaded under that name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_inplace: Option<bool>,
    /// SGLang: keep it in GPU memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<bool>,
}

/// `POST /unload_lora_adapter` (SGLang) and `/v1/unload_lora_adapter` (vLLM).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnloadLoraRequest {
    /// The name it was loaded under.
    pub lora_name: String,
}

/// SGLang's answer to a LoRA load or unload (`LoRAUpdateOutput`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SglangLoraAnswer {
    /// Whether it was done.
    pub success: bool,
    /// Why not.
    #[serde(default)]
    pub error_message: Option<String>,
    /// The adapters loaded now, by name.
    #[serde(default)]
    pub loaded_adapters: Option<BTreeMap<String, serde_json::Value>>,
}

/// `GET /v1/models`: OpenAI's model list, LoRA adapters with a `parent`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// The models.
    pub data: Vec<ModelCard>,
}

/// One model of [`ModelList`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// Its name (an adapter's `lora_name`).
    pub id: String,
    /// Where it came from (an adapter's folder).
    #[serde(default)]
    pub root: Option<String>,
    /// The base model, for an adapter.
    #[serde(default)]
    pub parent: Option<String>,
}

// ---------------------------------------------------------------------------------------
// vLLM

/// `POST /inference/v1/generate`: vLLM's `GenerateRequest`, the fields areal-rs sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VllmGenerateRequest {
    /// The request id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The model: a LoRA adapter's name to generate with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The prompt (and any output before an interruption).
    pub token_ids: Vec<u32>,
    /// How to sample.
    pub sampling_params: VllmSamplingParams,
    /// Stream server-sent events (not used by areal-rs; refused by its server).
    #[serde(default)]
    pub stream: bool,
    /// Other fields: a server refuses those it does not implement.
    #[serde(flatten, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// vLLM's `SamplingParams`, the fields areal-rs sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VllmSamplingParams {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[serde(default = "one")]
    pub temperature: f32,
    /// Nucleus sampling.
    #[serde(default = "one")]
    pub top_p: f32,
    /// The request's own random stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Generation stops after any of these (the token is part of the output).
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// Top logprobs per token besides the sampled one's: 0 gives the sampled token's alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Skip turning tokens into text (areal-rs reads ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detokenize: Option<bool>,
    /// Other sampling parameters: a server refuses those that would change sampling.
    #[serde(flatten, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// vLLM's `GenerateResponse`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VllmGenerateResponse {
    /// The request id.
    #[serde(default)]
    pub request_id: String,
    /// One per sample asked (`n`; areal-rs asks one).
    pub choices: Vec<VllmChoice>,
}

/// One `choices[]` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VllmChoice {
    /// Its index.
    #[serde(default)]
    pub index: usize,
    /// Per-token logprobs (with `sampling_params.logprobs`).
    #[serde(default)]
    pub logprobs: Option<VllmLogprobs>,
    /// `stop`, `length` or `abort`.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// The output token ids.
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
}

/// `ChatCompletionLogProbs`: `{"content": [...]}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VllmLogprobs {
    /// One entry per output token.
    pub content: Vec<VllmLogprob>,
}

/// `ChatCompletionLogProbsContent`: `token` is `"token_id:<id>"` on this route.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VllmLogprob {
    /// `token_id:<id>`.
    pub token: String,
    /// The sampled token's logprob (clamped at −9999 by vLLM).
    #[serde(default)]
    pub logprob: Option<f64>,
    /// Top alternatives (areal-rs asks none).
    #[serde(default)]
    pub top_logprobs: Vec<serde_json::Value>,
}

/// `POST /update_weights` of vLLM's disk backend: `{"update_info": {"path": ...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VllmUpdateRequest {
    /// The backend's update info.
    pub update_info: VllmDiskUpdateInfo,
}

/// `DiskWeightTransferUpdateInfo`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VllmDiskUpdateInfo {
    /// An absolute path to a folder of safetensors files.
    pub path: String,
}

/// `POST /finish_weight_update`: `{"weight_version": ...}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VllmFinishRequest {
    /// The version the server reports from now on.
    pub weight_version: Option<String>,
}

/// `GET /is_paused`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VllmIsPaused {
    /// Whether generation is paused.
    pub is_paused: bool,
}

// ---------------------------------------------------------------------------------------
// Both

/// `POST /tokenize` (SGLang's and vLLM's `TokenizeRequest`, the fields areal-rs sends).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenizeRequest {
    /// The text.
    pub prompt: String,
    /// Add the tokenizer's special tokens (BOS...); areal-rs encodes without them.
    #[serde(default = "yes")]
    pub add_special_tokens: bool,
    /// The served model's name (optional on both servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// The answer to `/tokenize`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    /// The ids.
    pub tokens: Vec<u32>,
    /// How many.
    #[serde(default)]
    pub count: usize,
    /// The context length served.
    #[serde(default)]
    pub max_model_len: Option<usize>,
}

/// The error body both servers send (`ErrorResponse`: `{"object": "error", "message", "type",
/// "code"}`; vLLM's RL routes send `{"error": ...}`): its message, however it is shaped.
pub(crate) fn error_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return text.chars().take(500).collect();
    };
    let found = ["message", "error", "detail"]
        .iter()
        .find_map(|k| value.get(k))
        .map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(o) => o
                .get("message")
                .and_then(|m| m.as_str())
                .map_or_else(|| v.to_string(), str::to_owned),
            other => other.to_string(),
        });
    found.unwrap_or_else(|| text.chars().take(500).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> serde_json::Value {
        let path = format!(
            "{}/tests/fixtures/inference-api/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Every fixture reads, and what areal-rs sends writes back as the projects' own bodies.
    #[test]
    fn sglang_bodies_read_and_write_as_sglang_defines_them() {
        let request: SglangGenerateRequest =
            serde_json::from_value(fixture("sglang-generate-request.json")).unwrap();
        assert_eq!(request.input_ids, [151644, 872, 198, 3838]);
        assert_eq!(request.sampling_params.max_new_tokens, 16);
        assert_eq!(request.sampling_params.sampling_seed, Some(42));
        assert!(request.return_logprob && request.other.is_empty());
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            fixture("sglang-generate-request.json")
        );

        let answer: SglangGenerateResponse =
            serde_json::from_value(fixture("sglang-generate-response.json")).unwrap();
        let meta = &answer.meta_info;
        assert_eq!(meta.finish_reason.kind, "length");
        assert_eq!(meta.output_token_logprobs.len(), 4);
        assert_eq!(meta.output_token_logprobs[0].1, 785);
        assert!((meta.output_token_logprobs[0].0 - -0.0283).abs() < 1e-9);
        assert_eq!(meta.weight_version.as_deref(), Some("default"));
        assert_eq!(
            answer.output_ids.as_deref(),
            Some(&[785, 6722, 315, 9625][..])
        );

        let aborted: SglangGenerateResponse =
            serde_json::from_value(fixture("sglang-generate-response-abort.json")).unwrap();
        assert_eq!(aborted.meta_info.finish_reason.kind, "abort");
        assert_eq!(aborted.meta_info.output_token_logprobs.len(), 2);

        let update: SglangUpdateFromDiskRequest =
            serde_json::from_value(fixture("sglang-update-weights-from-disk-request.json"))
                .unwrap();
        assert_eq!(update.weight_version.as_deref(), Some("7"));
        assert!(update.flush_cache && !update.abort_all_requests);
        let done: SglangUpdateResponse =
            serde_json::from_value(fixture("sglang-update-weights-from-disk-response.json"))
                .unwrap();
        assert!(done.success);
    }

    #[test]
    fn vllm_bodies_read_and_write_as_vllm_defines_them() {
        let request: VllmGenerateRequest =
            serde_json::from_value(fixture("vllm-generate-request.json")).unwrap();
        assert_eq!(request.token_ids, [9707, 11, 847, 829]);
        assert_eq!(request.sampling_params.max_tokens, 8);
        assert_eq!(request.sampling_params.logprobs, Some(0));
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            fixture("vllm-generate-request.json")
        );
        let answer: VllmGenerateResponse =
            serde_json::from_value(fixture("vllm-generate-response.json")).unwrap();
        let choice = &answer.choices[0];
        assert_eq!(choice.finish_reason.as_deref(), Some("stop"));
        let content = &choice.logprobs.as_ref().unwrap().content;
        assert_eq!(content.len(), choice.token_ids.as_ref().unwrap().len());
        assert_eq!(content[2].token, "token_id:151645");
        let update: VllmUpdateRequest =
            serde_json::from_value(fixture("vllm-update-weights-request.json")).unwrap();
        assert!(update.update_info.path.starts_with('/'));
        let tokenized: TokenizeResponse =
            serde_json::from_value(fixture("tokenize-response.json")).unwrap();
        assert_eq!(tokenized.tokens.len(), tokenized.count);
    }

    #[test]
    fn error_messages_are_found_however_they_are_shaped() {
        assert_eq!(
            error_message(br#"{"object":"error","message":"bad","type":"BadRequest","code":400}"#),
            "bad"
        );
        assert_eq!(
            error_message(br#"{"error":"Failed to pause"}"#),
            "Failed to pause"
        );
        assert_eq!(
            error_message(br#"{"detail":"Invalid JSON"}"#),
            "Invalid JSON"
        );
        assert_eq!(
            error_message(b"Internal Server Error"),
            "Internal Server Error"
        );
    }
}

/// What a generation answer says, read and checked: the tokens with their logprobs (as many
/// of each), why it ended (the finish reason, and the server's message with it) and the
/// weight version it names, if any. The readers below take an answer that parsed as JSON of
/// the API's shape and refuse, naming what is wrong, one whose parts do not agree.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationAnswer {
    /// The output token ids.
    pub tokens: Vec<u32>,
    /// The logprob of each.
    pub logprobs: Vec<f64>,
    /// The finish reason (`stop`, `length`, `abort`, or what the server said) and message.
    pub reason: (String, Option<String>),
    /// The weight version the server names (SGLang's `meta_info.weight_version`).
    pub weight_version: Option<String>,
}

/// An SGLang `/generate` answer, read: `output_token_logprobs` gives each token and its logprob;
/// `output_ids`, when there, must be the same tokens.
pub fn read_sglang_answer(answer: SglangGenerateResponse) -> Result<GenerationAnswer, String> {
    let meta = answer.meta_info;
    let (logprobs, tokens): (Vec<f64>, Vec<u32>) = meta
        .output_token_logprobs
        .iter()
        .map(|(lp, id, _)| (*lp, *id))
        .unzip();
    if let Some(ids) = &answer.output_ids
        && *ids != tokens
    {
        return Err(format!(
            "output_ids {ids:?} differ from the tokens of output_token_logprobs {tokens:?}"
        ));
    }
    Ok(GenerationAnswer {
        tokens,
        logprobs,
        reason: (meta.finish_reason.kind, meta.finish_reason.message),
        weight_version: meta.weight_version,
    })
}

/// A vLLM `/inference/v1/generate` answer, read: exactly one choice, whose logprob entries name
/// its tokens (`token_id:<id>`) one for one, each with a logprob.
pub fn read_vllm_answer(answer: VllmGenerateResponse) -> Result<GenerationAnswer, String> {
    let [choice] = <[_; 1]>::try_from(answer.choices)
        .map_err(|c| format!("{} choices for one sample", c.len()))?;
    let tokens = choice.token_ids.unwrap_or_default();
    let content = choice.logprobs.map(|l| l.content).unwrap_or_default();
    if content.len() != tokens.len() {
        return Err(format!(
            "{} tokens with {} logprobs",
            tokens.len(),
            content.len()
        ));
    }
    let mut logprobs = Vec::with_capacity(tokens.len());
    for (i, (entry, id)) in content.iter().zip(&tokens).enumerate() {
        if entry.token != format!("token_id:{id}") {
            return Err(format!(
                "logprob {i} is for {:?}, token {id} was sampled",
                entry.token
            ));
        }
        logprobs.push(
            entry
                .logprob
                .ok_or_else(|| format!("token {i} has no logprob"))?,
        );
    }
    Ok(GenerationAnswer {
        tokens,
        logprobs,
        reason: (choice.finish_reason.unwrap_or_else(|| "stop".into()), None),
        weight_version: None,
    })
}
