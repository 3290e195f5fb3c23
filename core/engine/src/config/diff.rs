//! What differs between two configs, key by key: a resumed run must be given its own config,
//! and a change made on purpose is reported and recorded.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Config;

/// Keys a resumed run cannot change, not even on purpose: its checkpoint's weights and sample
/// ids depend on them.
pub const FIXED_ON_RESUME: [&str; 2] = ["policy", "rollout.group_size"];

/// One key whose value differs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigChange {
    /// The dotted key, e.g. `train.steps`.
    pub key: String,
    /// Its value before, as JSON (`null` when it was not set).
    pub before: String,
    /// Its value after.
    pub after: String,
}

impl ConfigChange {
    /// Whether resuming can never change this key ([`FIXED_ON_RESUME`]).
    pub fn is_fixed_on_resume(&self) -> bool {
        FIXED_ON_RESUME
            .iter()
            .any(|fixed| self.key == *fixed || self.key.starts_with(&format!("{fixed}.")))
    }
}

impl std::fmt::Display for ConfigChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`: {} → {}", self.key, self.before, self.after)
    }
}

/// Every key whose value differs between `before` and `after`, in key order.
pub fn config_changes(before: &Config, after: &Config) -> Vec<ConfigChange> {
    let flat = |config: &Config| {
        let mut out = BTreeMap::new();
        flatten(
            "",
            &serde_json::to_value(config).expect("a config serialises"),
            &mut out,
        );
        out
    };
    let (a, b) = (flat(before), flat(after));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| {
            let (x, y) = (a.get(key), b.get(key));
            (x != y).then(|| ConfigChange {
                key: key.clone(),
                before: x.map_or_else(|| "null".into(), Value::to_string),
                after: y.map_or_else(|| "null".into(), Value::to_string),
            })
        })
        .collect()
}

/// Leaves of `value` by dotted key (arrays are leaves).
fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_owned(), other.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigLoader;

    #[test]
    fn each_key_that_differs_is_named_with_both_values() {
        let load = |sets: &[&str]| ConfigLoader::new().set_all(sets).unwrap().load().unwrap();
        let run = load(&["train.steps=20"]);
        assert!(config_changes(&run, &run.clone()).is_empty());
        let changes = config_changes(
            &run,
            &load(&["train.steps=40", "rollout.group_size=4", "policy.layers=3"]),
        );
        let text: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "`policy.layers`: 2 → 3",
                "`rollout.group_size`: 8 → 4",
                "`train.steps`: 20 → 40"
            ]
        );
        let fixed: Vec<bool> = changes
            .iter()
            .map(ConfigChange::is_fixed_on_resume)
            .collect();
        assert_eq!(fixed, [true, true, false]);
    }
}
