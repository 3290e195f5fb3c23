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

/// Why a resume may not change its config as asked: the changes, each on a line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResumeRefusal {
    /// Keys no resume may change ([`FIXED_ON_RESUME`]), even on purpose.
    Fixed(String),
    /// Changes not allowed (`--allow-config-change` was not given).
    NotAllowed(String),
}

/// The changes a resume from a run trained with `recorded` to `given` makes, where it may make
/// them: keys fixed on resume never change, and others only when `allow`. Where a remote
/// plugin's servers are is placement, not the experiment (`areal launch local` picks new ports
/// every time): those keys are left out.
pub fn resume_changes(
    recorded: &Config,
    given: &Config,
    allow: bool,
) -> Result<Vec<ConfigChange>, ResumeRefusal> {
    let changes: Vec<_> = config_changes(recorded, given)
        .into_iter()
        .filter(|c| c.key != "generator.endpoints" && c.key != "reward.endpoints")
        .collect();
    let list = |changes: &mut dyn Iterator<Item = &ConfigChange>| {
        changes
            .map(|c| format!("  {c}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if changes.iter().any(ConfigChange::is_fixed_on_resume) {
        let fixed = list(&mut changes.iter().filter(|c| c.is_fixed_on_resume()));
        return Err(ResumeRefusal::Fixed(fixed));
    }
    if !changes.is_empty() && !allow {
        return Err(ResumeRefusal::NotAllowed(list(&mut changes.iter())));
    }
    Ok(changes)
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
