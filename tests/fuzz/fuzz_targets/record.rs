//! The LiveCodeBench record decoder on arbitrary bytes: a record line (JSON), compressed
//! private tests (base64 → zlib → pickle), a pickle alone. It may refuse anything; it must
//! never panic, hang, or inflate past its limit.
#![no_main]

use areal_reward_code::Problem;
use areal_reward_code::record::{decompress_within, unpickle_string};
use libfuzzer_sys::fuzz_target;

/// What the decoder may inflate to here (a zlib bomb must stop at it).
const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Ok(problem) = Problem::from_record_within(&record, LIMIT) {
            for test in &problem.tests {
                assert!(test.input.len() + test.output.len() <= data.len() + LIMIT);
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(inflated) = decompress_within(text, LIMIT) {
            assert!(inflated.len() <= LIMIT);
        }
    }
    if let Ok(s) = unpickle_string(data) {
        assert!(s.len() <= data.len());
    }
});
