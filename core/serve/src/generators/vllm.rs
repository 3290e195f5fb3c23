//! `[generator] kind = "vllm"`: unmodified vLLM servers (`VLLM_SERVER_DEV_MODE=1`) over their
//! token-in/token-out and RL routes ([`crate::inference_api`]). `POST /inference/v1/generate`
//! with token ids and one logprob per token; `/pause?mode=abort` and `/resume`; weights
//! through the `disk` weight-transfer backend (`/init_weight_transfer_engine`,
//! `/start_weight_update`, `/update_weights` with the checkpoint folder,
//! `/finish_weight_update` with the version that `/weight_info` then reports); LoRA adapters
//! (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) by `/v1/load_lora_adapter` and
//! `/v1/unload_lora_adapter`, requests naming theirs as their `model`. vLLM's answers name no
//! version: the fleet works it out.

use areal_sdk::GenerateRequest;
use serde_json::json;

use super::api::{CallError, Sampled};
use super::http::{At, Dialect, http_api, request_id, request_seed};
use crate::inference_api::{self as wire, routes};

http_api!(Vllm, "vllm", version: routes::VLLM_WEIGHT_INFO, resume: routes::VLLM_RESUME,
    "generation on vLLM servers (VLLM_SERVER_DEV_MODE=1, disk weight transfer) over their HTTP API: `endpoints = [\"http://HOST:PORT\"]`, `weights_dir = \"/shared/dir\"`");

#[areal_sdk::async_trait]
impl Dialect for Vllm {
    /// The four steps of the `disk` backend, in order.
    async fn load(at: At<'_>, folder: String, version: &str) -> Result<(), CallError> {
        let update = wire::VllmUpdateRequest {
            update_info: wire::VllmDiskUpdateInfo { path: folder },
        };
        let finish = wire::VllmFinishRequest {
            weight_version: Some(version.to_owned()),
        };
        let steps = [
            (routes::VLLM_INIT_TRANSFER, json!({ "init_info": {} })),
            (routes::VLLM_START_UPDATE, json!({})),
            (routes::VLLM_UPDATE, json!(update)),
            (routes::VLLM_FINISH_UPDATE, json!(finish)),
        ];
        for (route, body) in steps {
            at.post_to(&at.url(route), &body, at.timeouts().weights)
                .await?;
        }
        Ok(())
    }

    async fn pause(at: At<'_>) -> Result<(), CallError> {
        at.post_empty(&format!("{}?mode=abort", at.url(routes::VLLM_PAUSE)))
            .await
    }

    /// A new name for every version: never `load_inplace` (a request admitted under the old
    /// version keeps it).
    async fn load_adapter(at: At<'_>, name: &str, folder: String) -> Result<(), CallError> {
        let request = wire::LoadLoraRequest {
            lora_name: name.to_owned(),
            lora_path: folder,
            load_inplace: Some(false),
            pinned: None,
        };
        let body = serde_json::to_value(request).expect("json");
        at.post_to(
            &at.url(routes::VLLM_LOAD_LORA),
            &body,
            at.timeouts().weights,
        )
        .await
    }

    async fn unload_adapter(at: At<'_>, name: &str) -> Result<(), CallError> {
        let body = json!(wire::UnloadLoraRequest {
            lora_name: name.to_owned(),
        });
        at.post_to(&at.url(routes::VLLM_UNLOAD_LORA), &body, at.timeouts().call)
            .await
    }

    async fn generate(
        at: At<'_>,
        request: &GenerateRequest,
        adapter: Option<&str>,
    ) -> Result<Sampled, CallError> {
        let sampling = &request.sampling;
        let body = wire::VllmGenerateRequest {
            request_id: Some(request_id(request)),
            model: adapter.map(str::to_owned),
            token_ids: request.input_ids.clone(),
            sampling_params: wire::VllmSamplingParams {
                max_tokens: request.max_new_tokens,
                temperature: sampling.temperature.max(0.0),
                top_p: sampling.top_p,
                seed: Some(request_seed(request)),
                stop_token_ids: request.stop_token_ids.clone(),
                logprobs: Some(0),
                detokenize: Some(false),
                other: Default::default(),
            },
            stream: false,
            other: Default::default(),
        };
        let route = routes::VLLM_GENERATE;
        at.generate(route, &body, wire::read_vllm_answer).await
    }
}
