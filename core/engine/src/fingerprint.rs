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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use areal_sdk::TaskItem;

    use super::*;

    /// A dataset in memory, editable in place.
    struct Rows(Mutex<Vec<String>>);

    impl Task for Rows {
        fn name(&self) -> &str {
            "rows"
        }
        fn len(&self, split: Split) -> Option<usize> {
            match split {
                Split::Train => Some(self.0.lock().unwrap().len()),
                _ => Some(1),
            }
        }
        fn item(&self, _: Split, index: u64) -> Result<TaskItem, PluginError> {
            let rows = self.0.lock().unwrap();
            Ok(TaskItem {
                id: index.to_string(),
                prompt: rows[index as usize % rows.len()].clone(),
                reference: serde_json::json!(index),
            })
        }
    }

    #[test]
    fn editing_one_item_changes_the_checksum() {
        let task = Rows(Mutex::new(vec!["1+1=".into(), "2+2=".into()]));
        let before = task_fingerprint(&task).unwrap();
        assert_eq!(before.len(), 64);
        assert_eq!(task_fingerprint(&task).unwrap(), before);
        task.0.lock().unwrap()[1] = "2+3=".into();
        assert_ne!(task_fingerprint(&task).unwrap(), before);
        task.0.lock().unwrap()[1] = "2+2=".into();
        assert_eq!(task_fingerprint(&task).unwrap(), before);
        task.0.lock().unwrap().push("3+3=".into());
        assert_ne!(task_fingerprint(&task).unwrap(), before);
    }
}
