//! `[generator] kind = "sglang"`: unmodified SGLang servers over their native HTTP API
//! ([`crate::inference_api`]). `POST /generate` with token ids and `return_logprob`, the
//! answer naming the weight version it was sampled with; `/pause_generation` in `abort` mode
//! and `/continue_generation`; weights loaded from the checkpoint folder by
//! `/update_weights_from_disk`, tagged with the version that `/get_weight_version` then
//! reports; LoRA adapters (`--enable-lora`) by `/load_lora_adapter` and
//! `/unload_lora_adapter`, requests naming theirs in `lora_path`.

use areal_sdk::GenerateRequest;

use super::api::{CallError, Sampled};
use super::http::{At, Dialect, http_api, request_id, request_seed};
use crate::inference_api::{self as wire, routes};

http_api!(Sglang, "sglang", version: routes::SGLANG_WEIGHT_VERSION, resume: routes::SGLANG_CONTINUE,
    "generation on SGLang servers over their HTTP API, weights handed over on disk: `endpoints = [\"http://HOST:PORT\"]`, `weights_dir = \"/shared/dir\"`");

#[areal_sdk::async_trait]
impl Dialect for Sglang {
    async fn load(at: At<'_>, folder: String, version: &str) -> Result<(), CallError> {
        let request = wire::SglangUpdateFromDiskRequest {
            model_path: folder.clone(),
            weight_version: Some(version.to_owned()),
            abort_all_requests: false,
            flush_cache: true,
            other: Default::default(),
        };
        let route = routes::SGLANG_UPDATE_FROM_DISK;
        let answer: wire::SglangUpdateResponse =
            at.post(route, &request, at.timeouts().weights).await?;
        if !answer.success {
            return Err(CallError::Refused(format!(
                "did not load {folder}: {}",
                answer.message
            )));
        }
        Ok(())
    }

    async fn pause(at: At<'_>) -> Result<(), CallError> {
        let abort = wire::SglangPauseRequest {
            mode: "abort".into(),
        };
        let body = serde_json::to_value(abort).expect("json");
        let url = at.url(routes::SGLANG_PAUSE);
        at.post_to(&url, &body, at.timeouts().call).await
    }

    async fn load_adapter(at: At<'_>, name: &str, folder: String) -> Result<(), CallError> {
        let request = wire::LoadLoraRequest {
            lora_name: name.to_owned(),
            lora_path: folder.clone(),
            load_inplace: None,
            pinned: None,
        };
        lora_answer(
            at,
            routes::SGLANG_LOAD_LORA,
            &request,
            &format!("load {folder}"),
        )
        .await
    }

    async fn unload_adapter(at: At<'_>, name: &str) -> Result<(), CallError> {
        let request = wire::UnloadLoraRequest {
            lora_name: name.to_owned(),
        };
        lora_answer(at, routes::SGLANG_UNLOAD_LORA, &request, "unload").await
    }

    async fn generate(
        at: At<'_>,
        request: &GenerateRequest,
        adapter: Option<&str>,
    ) -> Result<Sampled, CallError> {
        let sampling = &request.sampling;
        let body = wire::SglangGenerateRequest {
            input_ids: request.input_ids.clone(),
            sampling_params: wire::SglangSamplingParams {
                max_new_tokens: request.max_new_tokens,
                temperature: sampling.temperature.max(0.0),
                top_p: sampling.top_p,
                stop_token_ids: request.stop_token_ids.clone(),
                sampling_seed: Some(request_seed(request)),
                skip_special_tokens: Some(false),
                other: Default::default(),
            },
            return_logprob: true,
            stream: false,
            rid: Some(request_id(request)),
            lora_path: adapter.map(str::to_owned),
            other: Default::default(),
        };
        let route = routes::SGLANG_GENERATE;
        at.generate(route, &body, wire::read_sglang_answer).await
    }
}

/// `POST route` with a LoRA request; its `success: false` (a 400) is a refusal naming why.
async fn lora_answer(
    at: At<'_>,
    route: &str,
    body: &(impl serde::Serialize + Sync),
    what: &str,
) -> Result<(), CallError> {
    let answer: Result<wire::SglangLoraAnswer, _> =
        at.post(route, body, at.timeouts().weights).await;
    match answer {
        Ok(a) if a.success => Ok(()),
        Ok(a) => Err(CallError::Refused(format!(
            "did not {what}: {}",
            a.error_message.unwrap_or_default()
        ))),
        Err(e) => Err(e),
    }
}
