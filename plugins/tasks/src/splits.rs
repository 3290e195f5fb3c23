//! Held-out splits of a task read from files: what the `math` and `code` tasks share.

use std::sync::Arc;

use areal_sdk::{PluginConfig, PluginError, Split, stable_hash};

/// Whether the item `id` is held out (1 in 20, a different 20th for each `salt`).
fn held_out_as(id: &str, salt: u64) -> bool {
    stable_hash(id).wrapping_add(salt).is_multiple_of(20)
}

/// An item of a file-backed task: it has an id, unique in its file.
pub(crate) trait Identified {
    fn id(&self) -> &str;
}

/// Train, eval and validation items, disjoint by id.
#[derive(Debug)]
pub(crate) struct Splits<T> {
    train: Arc<Vec<T>>,
    eval: Arc<Vec<T>>,
    validation: Arc<Vec<T>>,
}

impl<T> Clone for Splits<T> {
    fn clone(&self) -> Self {
        Self {
            train: Arc::clone(&self.train),
            eval: Arc::clone(&self.eval),
            validation: Arc::clone(&self.validation),
        }
    }
}

impl<T: Identified> Splits<T> {
    /// `items` split into train and validation (1 in 20 by a hash of the id), and into eval
    /// too (another 1 in 20) when `eval` is `None`; eval cut to `eval_items` when given.
    pub(crate) fn new(items: Vec<T>, eval: Option<Vec<T>>, eval_items: Option<usize>) -> Self {
        let (mut eval, rest): (Vec<T>, Vec<T>) = match eval {
            Some(e) => (e, items),
            None => items.into_iter().partition(|p| held_out_as(p.id(), 0)),
        };
        let (validation, train): (Vec<T>, Vec<T>) =
            rest.into_iter().partition(|p| held_out_as(p.id(), 7));
        if let Some(n) = eval_items {
            eval.truncate(n);
        }
        Self::from_parts(train, eval, validation)
    }

    /// The splits as given.
    pub(crate) fn from_parts(train: Vec<T>, eval: Vec<T>, validation: Vec<T>) -> Self {
        Self {
            train: Arc::new(train),
            eval: Arc::new(eval),
            validation: Arc::new(validation),
        }
    }

    /// The items of `split`.
    pub(crate) fn get(&self, split: Split) -> &[T] {
        match split {
            Split::Train => &self.train,
            Split::Eval => &self.eval,
            Split::Validation => &self.validation,
        }
    }

    /// Item `index` of `split`, or an error of `task` naming the split's size.
    pub(crate) fn at(&self, task: &str, split: Split, index: u64) -> Result<&T, PluginError> {
        let list = self.get(split);
        usize::try_from(index)
            .ok()
            .and_then(|i| list.get(i))
            .ok_or_else(|| {
                PluginError::failed(
                    task,
                    format!(
                        "the {} split has {} items, not {index}",
                        split.as_str(),
                        list.len()
                    ),
                )
            })
    }

    /// The item named `id`, in whichever split.
    pub(crate) fn find(&self, id: &str) -> Option<&T> {
        self.train
            .iter()
            .chain(self.validation.iter())
            .chain(self.eval.iter())
            .find(|p| p.id() == id)
    }
}

/// The items of the JSONL file `path` (the option `key`), read by `parse` (which names the
/// file and line of a bad record); a file that cannot be read or holds no item is an error of
/// that option.
pub(crate) fn read_items<T>(
    config: &PluginConfig,
    key: &str,
    path: &str,
    what: &str,
    parse: impl FnOnce(&str, &str) -> Result<Vec<T>, String>,
) -> Result<Vec<T>, PluginError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| config.invalid(key, format!("cannot read {path}: {e}")))?;
    let items = parse(&text, path).map_err(|e| config.invalid(key, e))?;
    if items.is_empty() {
        return Err(config.invalid(key, format!("{path} has no {what}")));
    }
    Ok(items)
}
