//! The warm-up cache: one folder per settings hash, holding the warmed-up policy, its report
//! and a manifest of checksums; written atomically, verified before it is reused.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::error::EngineError;

use crate::atomic::StagedDir;
use crate::metrics::WarmupReport;
use crate::worker::ComputeWorker;

/// Where a warm-up with these settings, on the task data of checksum `task_data`, graded by a
/// reward of identity `reward` (its `cache_identity`: a plugin file's sha256, say), is cached,
/// if caching is on.
pub(super) fn path(config: &Config, task_data: &str, reward: Option<&str>) -> Option<PathBuf> {
    if config.warmup.cache_dir.is_empty() {
        return None;
    }
    let mut warmup = config.warmup.clone();
    warmup.cache_dir.clear();
    // A remote reward's section says where its servers are, not what they grade (which the
    // servers' own config decides): `areal launch local` picks new ports for every run, so
    // the endpoints and the connection settings are left out of the key.
    let identity = reward;
    let mut reward = config.reward.clone();
    if let Some(section) = reward.as_object_mut()
        && section.get("kind").and_then(|k| k.as_str()) == Some("remote")
    {
        section.retain(|key, _| key == "kind");
    }
    // The warm-up trains every weight: what RL trains instead (`[policy.lora]`, adapters put
    // on when RL starts, `Policy::start_rl`) is not part of it.
    let mut policy = config.policy.clone();
    if let Some(section) = policy.as_object_mut() {
        section.remove("lora");
    }
    // everything that decides the warmed-up weights and the plateau
    let mut key = serde_json::json!({
        "policy": policy,
        "task": config.task,
        // the data itself: a dataset edited in place is another warm-up
        "task_data": task_data,
        "reward": reward,
        // what the reward is beyond its section: a plugin file edited in place grades anew
        "reward_identity": identity,
        "warmup": warmup,
        "seed": config.seed,
        "max_new_tokens": config.rollout.max_new_tokens,
        "token_budget": config.train.token_budget,
        "max_grad_norm": config.train.max_grad_norm,
        "version": env!("CARGO_PKG_VERSION"),
        // what a cached warm-up means: 2 = it ends with the best-validation-accuracy weights;
        // 3 = it carries a manifest of checksums; 4 = keyed by the task's data; 5 = and by
        // the reward's identity
        "format": 5,
    });
    // prompts in another format are another warm-up (the default, text, adds nothing, so
    // that caches from before `[prompt]` existed stay valid)
    if config.prompt != crate::config::PromptConfig::default() {
        key["prompt"] = serde_json::json!(config.prompt);
    }
    let hash = areal_sdk::stable_hash(&key.to_string());
    Some(crate::config::cache_path(&config.warmup.cache_dir).join(format!("{hash:016x}")))
}

/// File of a cached warm-up's report.
const REPORT_FILE: &str = "warmup.json";

/// Read a cached warm-up's report, if the folder holds a complete one: every file its
/// manifest lists is there with its checksum. A damaged cache (truncated, edited, half
/// deleted) is reported and ignored, so the warm-up runs again and replaces it.
pub(super) fn read(dir: &Path) -> Option<WarmupReport> {
    if !dir.exists() {
        return None;
    }
    match verify_cache(dir) {
        Ok(report) => Some(report),
        Err(why) => {
            tracing::warn!(target: "areal::warmup", dir = %dir.display(), "the cached warm-up is damaged ({why}); warming up again");
            None
        }
    }
}

fn verify_cache(dir: &Path) -> Result<WarmupReport, String> {
    crate::manifest::verify(dir, REPORT_FILE)?;
    let text = std::fs::read_to_string(dir.join(REPORT_FILE)).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("{REPORT_FILE}: {e}"))
}

/// Save the policy, the report and their manifest into `dir`, atomically: a warm-up cache is
/// whole or absent, whatever happens while it is written.
pub(super) async fn write(
    dir: &Path,
    worker: &ComputeWorker,
    report: &WarmupReport,
) -> Result<(), EngineError> {
    let staged = StagedDir::new(dir).map_err(|e| EngineError::io(e.path, e.source))?;
    let tmp = staged.path().to_owned();
    worker
        .save(tmp.clone())
        .await?
        .map_err(|e| EngineError::plugin("saving the warmed-up policy", e))?;
    let json = serde_json::to_string_pretty(report).expect("the report serialises");
    let path = tmp.join(REPORT_FILE);
    std::fs::write(&path, json).map_err(|e| EngineError::io(&path, e))?;
    crate::manifest::write(&tmp)?;
    staged
        .commit()
        .map_err(|e| EngineError::io(e.path, e.source))
}

#[cfg(test)]
mod tests {
    use crate::config::ConfigLoader;

    fn path(sets: &[&str]) -> std::path::PathBuf {
        let config = ConfigLoader::new().set_all(sets).unwrap().load().unwrap();
        super::path(&config, "data", None).expect("caching is on by default")
    }

    /// Adapters are put on after the warm-up: a run with them reuses the warm-up of a run
    /// without.
    #[test]
    fn adapters_do_not_change_the_key_but_the_model_does() {
        assert_eq!(path(&["policy.lora.rank=4"]), path(&[]));
        assert_ne!(path(&["policy.hidden_size=32"]), path(&[]));
    }

    /// A remote reward's endpoints change with every launch; what it grades does not.
    #[test]
    fn remote_endpoints_do_not_change_the_key_but_the_reward_does() {
        let remote = |url: &str| {
            path(&[
                "reward.kind=remote",
                &format!("reward.endpoints=[\"{url}\"]"),
            ])
        };
        assert_eq!(
            remote("http://127.0.0.1:4001"),
            remote("http://10.0.0.9:50061")
        );
        assert_ne!(remote("http://127.0.0.1:4001"), path(&[]));
        assert_ne!(path(&[]), path(&["reward.kind=math"]));
    }

    /// Prompts in the chat format, or with another system message, are another warm-up; the
    /// default format leaves the key as it was before `[prompt]` existed.
    #[test]
    fn the_prompt_format_is_part_of_the_key() {
        let chat = path(&["prompt.format=chat"]);
        assert_ne!(chat, path(&[]));
        assert_ne!(
            chat,
            path(&["prompt.format=chat", "prompt.system=be brief"])
        );
        assert_eq!(path(&["prompt.format=text"]), path(&[]));
    }

    /// The same config over other data (a dataset edited in place) is another warm-up.
    #[test]
    fn the_task_data_is_part_of_the_key() {
        let config = ConfigLoader::new().load().unwrap();
        assert_ne!(
            super::path(&config, "a", None),
            super::path(&config, "b", None)
        );
        assert_eq!(
            super::path(&config, "a", None),
            super::path(&config, "a", None)
        );
    }

    /// A reward plugin's file edited in place (another identity) is another warm-up.
    #[test]
    fn the_reward_s_identity_is_part_of_the_key() {
        let config = ConfigLoader::new().load().unwrap();
        let p = |id| super::path(&config, "a", id);
        assert_ne!(p(Some("sha256 1")), p(Some("sha256 2")));
        assert_ne!(p(Some("sha256 1")), p(None));
        assert_eq!(p(Some("sha256 1")), p(Some("sha256 1")));
    }
}
