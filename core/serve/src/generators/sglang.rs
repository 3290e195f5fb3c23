//! `[generator] kind = "sglang"`: unmodified SGLang servers over their native HTTP API
//! ([`crate::inference_api`]). `POST /generate` with token ids and `return_logprob`, the
//! answer naming the weight version it was sampled with; `/pause_generation` in `abort` mode
//! and `/continue_generation`; weights loaded from the checkpoint folder by
//! `/update_weights_from_disk`, tagged with the version that `/get_weight_version` then
//! reports.

use areal_sdk::{GenerateRequest, PolicyVersion};

use super::api::{CallError, Sampled};
use super::http::{At, Dialect, http_api, request_id};
use crate::inference_api::{self as wire, routes};

http_api!(Sglang, "sglang", version: routes::SGLANG_WEIGHT_VERSION, resume: routes::SGLANG_CONTINUE,
    "generation on SGLang servers over their HTTP API, weights handed over on disk: `endpoints = [\"http://HOST:PORT\"]`, `weights_dir = \"/shared/dir\"`");

#[areal_sdk::async_trait]
impl Dialect for Sglang {
    async fn load(at: At<'_>, folder: String, version: PolicyVersion) -> Result<(), CallError> {
        let request = wire::SglangUpdateFromDiskRequest {
            model_path: folder.clone(),
            weight_version: Some(version.to_string()),
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

    async fn generate(at: At<'_>, request: &GenerateRequest) -> Result<Sampled, CallError> {
        let sampling = &request.sampling;
        let body = wire::SglangGenerateRequest {
            input_ids: request.input_ids.clone(),
            sampling_params: wire::SglangSamplingParams {
                max_new_tokens: request.max_new_tokens,
                temperature: sampling.temperature.max(0.0),
                top_p: sampling.top_p,
                stop_token_ids: request.stop_token_ids.clone(),
                sampling_seed: Some(sampling.seed),
                skip_special_tokens: Some(false),
                other: Default::default(),
            },
            return_logprob: true,
            stream: false,
            rid: Some(request_id(request)),
            other: Default::default(),
        };
        let route = routes::SGLANG_GENERATE;
        at.generate(route, &body, wire::read_sglang_answer).await
    }
}
