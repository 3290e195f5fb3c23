//! A small weight update as an `UpdateWeights` stream would carry it, written to stdout as
//! length-delimited `WeightChunk` messages: the seed of the `weight_parts` fuzz target
//! (`tests/fuzz/run.sh weight_parts`).

use std::io::Write;

use areal_sdk::{NamedTensor, WeightUpdate};
use prost::Message;

fn main() {
    let update = WeightUpdate::new(
        3,
        vec![
            NamedTensor {
                name: "embed.weight".into(),
                shape: vec![4, 3],
                data: (0..12).map(|i| i as f32 * 0.25 - 1.0).collect(),
            },
            NamedTensor {
                name: "norm.weight".into(),
                shape: vec![3],
                data: vec![1.0, -0.0, 0.5],
            },
        ],
    );
    let mut out = Vec::new();
    for chunk in areal_proto::weight_chunks(&update, 5) {
        chunk
            .encode_length_delimited(&mut out)
            .expect("a Vec grows");
    }
    std::io::stdout().write_all(&out).expect("stdout");
}
