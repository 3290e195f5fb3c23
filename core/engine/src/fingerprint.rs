//! A task's data as one checksum: what a cached warm-up and a resume checkpoint are keyed by,
//! so that a dataset edited in place is noticed.

use areal_sdk::{Split, Task};
use sha2::{Digest, Sha256};

use crate::config::Config;

/// The sha256 (hex) of the data of the finite splits `config`'s run uses (train; validation
/// with a warm-up; eval with evaluation): every item's id, prompt, reference and demonstration.
/// An unbounded (procedural) split is left out: its items follow from the config, which is
/// keyed on its own. A task that fails or panics on an item gets an empty checksum, with a
/// warning: its data cannot be told from other data.
pub(crate) fn task_fingerprint(task: &dyn Task, config: &Config) -> String {
    let mut splits = vec![Split::Train];
    if config.warmup.enabled {
        splits.push(Split::Validation);
    }
    if config.eval.enabled {
        splits.push(Split::Eval);
    }
    let hashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| checksum(task, &splits)));
    match hashed {
        Ok(Ok(hex)) => hex,
        Ok(Err(why)) => unknown(task, &why),
        Err(_) => unknown(task, "it panicked reading an item"),
    }
}

fn unknown(task: &dyn Task, why: &str) -> String {
    tracing::warn!(target: "areal::engine", task = task.name(), "cannot checksum the task's data ({why}): a cached warm-up or a resumed run cannot tell whether it changed");
    String::new()
}

fn checksum(task: &dyn Task, splits: &[Split]) -> Result<String, String> {
    let mut hash = Sha256::new();
    for &split in splits {
        let Some(count) = task.len(split) else {
            continue;
        };
        hash.update(format!("{}:{count}\n", split.as_str()).as_bytes());
        for index in 0..count as u64 {
            let item = task
                .item(split, index)
                .map_err(|e| format!("{} item {index}: {e}", split.as_str()))?;
            // a task may have no demonstration for some items: that is part of its data too
            let demonstration = task.demonstration(&item).ok().flatten();
            let record = serde_json::json!([item.id, item.prompt, item.reference, demonstration]);
            hash.update(record.to_string().as_bytes());
            hash.update(b"\n");
        }
    }
    Ok(crate::manifest::hex(&hash.finalize()))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use areal_sdk::{PluginError, TaskItem};

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
        let config = Config::default();
        let task = Rows(Mutex::new(vec!["1+1=".into(), "2+2=".into()]));
        let sum = || task_fingerprint(&task, &config);
        let before = sum();
        assert_eq!(before.len(), 64);
        assert_eq!(sum(), before);
        task.0.lock().unwrap()[1] = "2+3=".into();
        assert_ne!(sum(), before);
        task.0.lock().unwrap()[1] = "2+2=".into();
        assert_eq!(sum(), before);
        task.0.lock().unwrap().push("3+3=".into());
        assert_ne!(sum(), before);
        task.0.lock().unwrap().clear();
        assert_eq!(sum(), "", "a task that panics has no checksum");
    }
}
