//! The weight-part decoder (`WeightAssembler`) on arbitrary bytes, read as a stream of
//! length-prefixed `WeightChunk` messages as a peer would send them: it may refuse anything; it
//! must never panic, never hold more values than its budget, and never reserve ahead of the
//! values that arrived (a shape claiming 2^40 values costs nothing).
#![no_main]

use areal_proto::{WeightAssembler, pb};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// The receiver's budget here, in values.
const BUDGET: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let mut assembler = WeightAssembler::with_budget(BUDGET);
    let mut rest = data;
    let mut arrived = 0usize;
    while !rest.is_empty() {
        let Ok(chunk) = pb::WeightChunk::decode_length_delimited(&mut rest) else {
            break;
        };
        if let Some(pb::weight_chunk::Chunk::Part(part)) = &chunk.chunk {
            arrived += part.data.len() / 4;
        }
        if assembler.push(chunk).is_err() {
            return;
        }
    }
    if let Ok(update) = assembler.finish() {
        let values: usize = update.tensors.iter().map(|t| t.data.len()).sum();
        assert!(values <= BUDGET && values <= arrived);
        assert!(update.tensors.iter().all(|t| t.data.iter().all(|v| v.is_finite())));
    }
});
