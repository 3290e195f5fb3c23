//! Held-out splits: of tasks read from files (what the `math` and `code` tasks share), and of
//! procedural tasks (`chain-sum`, `code-arith`).

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

use areal_sdk::{PluginConfig, PluginError, Split, mix_seed, stable_hash};
use rand::SeedableRng;
use rand::rngs::StdRng;

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

/// Where a file-backed task's items come from, as its options say.
pub(crate) struct Files<'a> {
    /// The option `path`: the train split (and the held-out ones without `eval_path`).
    pub(crate) path: &'a str,
    /// The option `eval_path`: held-out items only.
    pub(crate) eval_path: Option<&'a str>,
    /// At most this many eval items.
    pub(crate) eval_items: Option<usize>,
    /// What an item is, plural (`problems`), for errors.
    pub(crate) what: &'a str,
    /// What `path` must name, for the error when it is missing.
    pub(crate) missing: &'a str,
}

impl Files<'_> {
    /// An error of `path` when it is not given.
    pub(crate) fn require_path(&self, config: &PluginConfig) -> Result<(), PluginError> {
        if self.path.is_empty() {
            return Err(config.invalid("path", format!("missing: {}", self.missing)));
        }
        Ok(())
    }
}

/// The splits of the items in `files`, each file read by `parse` (which names the file and
/// line of a bad record). A file that cannot be read or holds no item, and a train split left
/// empty by the hold-out, are errors of their option.
pub(crate) fn read_splits<T: Identified>(
    config: &PluginConfig,
    files: &Files<'_>,
    parse: impl Fn(&str, &str) -> Result<Vec<T>, String>,
) -> Result<Splits<T>, PluginError> {
    let read = |key: &str, path: &str| -> Result<Vec<T>, PluginError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| config.invalid(key, format!("cannot read {path}: {e}")))?;
        let items = parse(&text, path).map_err(|e| config.invalid(key, e))?;
        if items.is_empty() {
            return Err(config.invalid(key, format!("{path} has no {}", files.what)));
        }
        Ok(items)
    };
    let train = read("path", files.path)?;
    let eval = match files.eval_path {
        Some(p) => Some(read("eval_path", p)?),
        None => None,
    };
    let splits = Splits::new(train, eval, files.eval_items);
    if splits.get(Split::Train).is_empty() {
        return Err(config.invalid(
            "path",
            "every problem was held out; the train split is empty",
        ));
    }
    Ok(splits)
}

/// Item `index` of the held-out `split` of a procedural task `task` (`eval` or `validation`),
/// or an error naming the split's size.
pub(crate) fn held_out_at<'a, T>(
    task: &str,
    split: Split,
    eval: &'a [T],
    validation: &'a [T],
    index: u64,
) -> Result<&'a T, PluginError> {
    let list = if split == Split::Eval {
        eval
    } else {
        validation
    };
    usize::try_from(index)
        .ok()
        .and_then(|i| list.get(i))
        .ok_or_else(|| {
            PluginError::failed(
                task,
                format!("{} has {} items, not {index}", split.as_str(), list.len()),
            )
        })
}

/// The held-out `split` of a procedural task of `seed`: up to `count` distinct items drawn by
/// `draw` from a random stream of the split's own (`None`: the draw is not in the split),
/// in the order drawn, after at most `count × 1000` draws.
pub(crate) fn held_out_draws<T: Eq + Hash + Clone>(
    seed: u64,
    split: Split,
    count: usize,
    mut draw: impl FnMut(&mut StdRng) -> Option<T>,
) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(mix_seed(seed, split as u64 + 101));
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(count);
    let mut attempts = 0usize;
    while out.len() < count && attempts < count * 1000 {
        attempts += 1;
        if let Some(item) = draw(&mut rng)
            && seen.insert(item.clone())
        {
            out.push(item);
        }
    }
    out
}
