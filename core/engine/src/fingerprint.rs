//! A task's data as one checksum: what a cached warm-up and a resume checkpoint are keyed by,
//! so that a dataset edited in place is noticed.

use areal_sdk::{PluginError, Split, Task};
use sha2::{Digest, Sha256};

use crate::error::EngineError;

/// Items hashed from an unbounded (procedural) split: its items follow from the config, which
/// is keyed on its own; these catch a change in the code that draws them.
const UNBOUNDED_SAMPLE: u64 = 64;

/// The sha256 (hex) of every item of `task`'s finite splits (id, prompt, reference and
/// demonstration), and of the first items of an unbounded one.
pub(crate) fn task_fingerprint(task: &dyn Task) -> Result<String, EngineError> {
    let mut hash = Sha256::new();
    let failed = |split: Split, index: u64, e: PluginError| {
        EngineError::plugin(
            format!(
                "reading {} item {index} to checksum the task's data",
                split.as_str()
            ),
            e,
        )
    };
    for split in [Split::Train, Split::Validation, Split::Eval] {
        let (count, bounded) = match task.len(split) {
            Some(n) => (n as u64, true),
            None => (UNBOUNDED_SAMPLE, false),
        };
        hash.update(format!("{}:{count}:{bounded}\n", split.as_str()).as_bytes());
        for index in 0..count {
            let item = task
                .item(split, index)
                .map_err(|e| failed(split, index, e))?;
            // a task may have no demonstration for some items: that is part of its data too
            let demonstration = task.demonstration(&item).ok().flatten();
            let record = serde_json::json!([item.id, item.prompt, item.reference, demonstration]);
            hash.update(record.to_string().as_bytes());
            hash.update(b"\n");
        }
    }
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
