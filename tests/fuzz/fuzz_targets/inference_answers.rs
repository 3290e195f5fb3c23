//! The SGLang and vLLM answer readers on arbitrary bytes, as a server's body would arrive:
//! parsed as the API's JSON, then read (tokens, logprobs, finish reason, weight version). They
//! may refuse anything; they must never panic, and what they accept has a logprob per token.
#![no_main]

use areal_serve::inference_api::{
    SglangGenerateResponse, SglangUpdateResponse, VllmGenerateResponse, WeightVersion,
    read_sglang_answer, read_vllm_answer,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(answer) = serde_json::from_slice::<SglangGenerateResponse>(data)
        && let Ok(read) = read_sglang_answer(answer)
    {
        assert_eq!(read.tokens.len(), read.logprobs.len());
    }
    if let Ok(answer) = serde_json::from_slice::<VllmGenerateResponse>(data)
        && let Ok(read) = read_vllm_answer(answer)
    {
        assert_eq!(read.tokens.len(), read.logprobs.len());
    }
    let _ = serde_json::from_slice::<WeightVersion>(data);
    let _ = serde_json::from_slice::<SglangUpdateResponse>(data);
});
