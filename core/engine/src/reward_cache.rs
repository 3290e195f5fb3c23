//! The reward cache: rewards kept by content, so a completion graded once is not graded again.
//!
//! A reward is keyed by the sha256 of the verifier's name, its
//! [`cache_identity`](areal_sdk::RewardVerifier::cache_identity) (version, plugin sha256,
//! limits, options, environment) and everything of the sample a verifier is given: the item's
//! id, the prompt, the completion and its token ids, why generation ended, the reference and
//! the metadata — all but the sample's own id, which no reward may depend on (plugins loaded
//! at run time are not shown it), so that a completion of the same item graded again is a
//! hit. Within a run every reward the verifier gave is kept (failures are not: they are not
//! rewards). With a folder, rewards whose verdict is deterministic are also appended to a
//! file of their own verifier identity there and read back by the next run: every verdict
//! but a time limit measured in time (a time limit in fuel is deterministic; one in CPU
//! seconds may flip on another machine).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use areal_sdk::{Reward, RewardInput, Verdict};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

/// Rewards by content key.
pub struct RewardCache {
    identity: String,
    memory: Mutex<HashMap<[u8; 32], Reward>>,
    /// Keys being verified now, with whoever waits for their reward.
    in_flight: Mutex<HashMap<[u8; 32], Vec<oneshot::Sender<Reward>>>>,
    file: Option<Mutex<std::fs::File>>,
    path: Option<PathBuf>,
    hits: AtomicU64,
    lookups: AtomicU64,
}

#[derive(Serialize, Deserialize)]
struct Line {
    key: String,
    reward: Reward,
}

impl std::fmt::Debug for RewardCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardCache")
            .field("path", &self.path)
            .field("hits", &self.hits)
            .field("lookups", &self.lookups)
            .finish_non_exhaustive()
    }
}

impl RewardCache {
    /// A cache of the rewards of verifier `name` with `identity`; with `dir`, the
    /// deterministic ones are read from and appended to a file in it.
    pub fn new(name: &str, identity: &str, dir: Option<&Path>) -> std::io::Result<Self> {
        let identity = format!("{name}\0{identity}");
        let mut memory = HashMap::new();
        let (file, path) = match dir {
            None => (None, None),
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                let id = hex(&Sha256::digest(identity.as_bytes()));
                let path = dir.join(format!("{name}-{}.jsonl", &id[..16]));
                if let Ok(f) = std::fs::File::open(&path) {
                    // A line cut short by a killed run, or damaged, is skipped.
                    for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
                        if let Ok(Line { key, reward }) = serde_json::from_str::<Line>(&line)
                            && let Some(key) = unhex(&key)
                        {
                            memory.insert(key, reward);
                        }
                    }
                }
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)?;
                (Some(Mutex::new(file)), Some(path))
            }
        };
        Ok(Self {
            identity,
            memory: Mutex::new(memory),
            in_flight: Mutex::new(HashMap::new()),
            file,
            path,
            hits: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
        })
    }

    /// The file the deterministic rewards go to, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Rewards held now.
    pub fn len(&self) -> usize {
        self.memory.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key of a sample: the identity and every field of the sample but `sample_id`.
    pub fn key(&self, input: &RewardInput) -> [u8; 32] {
        let mut h = Sha256::new();
        let metadata = serde_json::Value::Object(input.metadata.clone()).to_string();
        let finish = serde_json::to_string(&input.finish_reason).expect("a finish reason is JSON");
        let ids: Vec<u8> = input
            .completion_ids
            .iter()
            .flat_map(|id| id.to_le_bytes())
            .collect();
        for part in [
            self.identity.as_bytes(),
            input.item_id.as_bytes(),
            input.prompt.as_bytes(),
            input.completion.as_bytes(),
            &ids,
            finish.as_bytes(),
            input.reference.to_string().as_bytes(),
            metadata.as_bytes(),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.finalize().into()
    }

    /// The reward kept for `key`, counted as a hit or a miss.
    pub fn get(&self, key: &[u8; 32]) -> Option<Reward> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let found = self
            .memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned();
        if found.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Keep `reward` under `key` (a failure is not kept); a deterministic one also on disk.
    /// A write that fails is a warning: the cache is an optimisation, never the run's end.
    pub fn put(&self, key: [u8; 32], reward: &Reward) {
        if reward.verdict.is_failure() {
            return;
        }
        let fresh = self
            .memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, reward.clone())
            .is_none();
        if let Some(file) = &self.file
            && fresh
            && deterministic(reward)
        {
            let line = Line {
                key: hex(&key),
                reward: reward.clone(),
            };
            let mut text = serde_json::to_string(&line).expect("a reward is JSON");
            text.push('\n');
            let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = f.write_all(text.as_bytes()) {
                tracing::warn!(target: "areal::reward", "reward cache {:?}: {e}", self.path);
            }
        }
    }

    /// After a miss on `key`: verify it (`Flight::Lead`), or, when the same key is being
    /// verified now, wait for that reward (`Flight::Follow`; a follow that gets it counts as
    /// a hit). Identical samples sent together — a group whose completions agree — are
    /// verified once.
    pub fn join(&self, key: [u8; 32]) -> Flight<'_> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(waiting) = in_flight.get_mut(&key) {
            let (tx, rx) = oneshot::channel();
            waiting.push(tx);
            return Flight::Follow(rx);
        }
        in_flight.insert(key, Vec::new());
        Flight::Lead(Lead {
            cache: self,
            key,
            finished: false,
        })
    }

    /// A follower got its reward from the leader: a hit.
    pub fn count_hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Hits and lookups so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.lookups.load(Ordering::Relaxed),
        )
    }
}

/// What [`RewardCache::join`] tells a caller to do.
pub enum Flight<'a> {
    /// Verify the sample, then [`Lead::finish`] with its reward.
    Lead(Lead<'a>),
    /// Wait for the leader's reward; an error (the leader failed or was dropped): verify
    /// the sample yourself.
    Follow(oneshot::Receiver<Reward>),
}

/// The verification of a key that others may be waiting for. Dropped unfinished (its sample
/// abandoned), the waiters are released to verify on their own.
pub struct Lead<'a> {
    cache: &'a RewardCache,
    key: [u8; 32],
    finished: bool,
}

impl Lead<'_> {
    /// Keep `reward` and hand it to every waiter; a failure is kept by no one and handed to
    /// no one (each waiter tries for itself).
    pub fn finish(mut self, reward: &Reward) {
        self.finished = true;
        self.cache.put(self.key, reward);
        let waiting = self
            .cache
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key)
            .unwrap_or_default();
        if !reward.verdict.is_failure() {
            for tx in waiting {
                let _ = tx.send(reward.clone());
            }
        }
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.cache
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

/// Whether the same sample would get this verdict on any machine: all but a time limit
/// measured in time (no fuel).
pub(crate) fn deterministic(reward: &Reward) -> bool {
    let timed_out_in_seconds =
        reward.verdict == Verdict::TimeLimit && reward.provenance.fuel.is_none();
    !reward.verdict.is_failure() && !timed_out_in_seconds
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use areal_sdk::FinishReason;
    use serde_json::json;

    fn input(completion: &str, answer: u64) -> RewardInput {
        RewardInput {
            sample_id: 1,
            item_id: "i".into(),
            prompt: "p".into(),
            completion: completion.into(),
            completion_ids: vec![],
            finish_reason: FinishReason::Stop,
            reference: json!({ "answer": answer }),
            metadata: Default::default(),
        }
    }

    /// Issue 32: the key left out the prompt (which `signature = "areal"` passes to a Python
    /// reward), so the same completion of another prompt got the other's reward. Every field
    /// a verifier is given changes the key; the sample's own id does not.
    #[test]
    fn every_field_a_verifier_sees_is_in_the_key_but_the_sample_id() {
        let cache = RewardCache::new("x", "v1", None).unwrap();
        let base = input(">5", 5);
        let key = cache.key(&base);
        let mut changes: Vec<(&str, RewardInput)> = Vec::new();
        let mut change = |field, f: fn(&mut RewardInput)| {
            let mut other = base.clone();
            f(&mut other);
            changes.push((field, other));
        };
        change("item_id", |i| i.item_id = "j".into());
        change("prompt", |i| i.prompt = "q".into());
        change("completion", |i| i.completion = ">6".into());
        change("completion_ids", |i| i.completion_ids = vec![1]);
        change("finish_reason", |i| i.finish_reason = FinishReason::Length);
        change("reference", |i| i.reference = json!({ "answer": 6 }));
        change("metadata", |i| {
            i.metadata.insert("data_source".into(), "b".into());
        });
        for (field, other) in changes {
            assert_ne!(cache.key(&other), key, "{field} is not in the key");
        }
        let mut same = base.clone();
        same.sample_id = 99;
        assert_eq!(cache.key(&same), key, "the sample's id is not in the key");
    }

    #[test]
    fn keys_by_identity_completion_and_reference_and_keeps_deterministic_verdicts_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RewardCache::new("x", "v1", Some(dir.path())).unwrap();
        let a = cache.key(&input(">5", 5));
        assert_ne!(
            a,
            cache.key(&input(">5", 6)),
            "the reference is part of the key"
        );
        assert_ne!(
            a,
            cache.key(&input(">6", 5)),
            "the completion is part of the key"
        );
        let other = RewardCache::new("x", "v2", None).unwrap();
        assert_ne!(
            a,
            other.key(&input(">5", 5)),
            "the identity is part of the key"
        );
        assert_eq!(cache.get(&a), None);
        let accepted = Reward::new(1.0, Verdict::Accepted).with_version("v1");
        cache.put(a, &accepted);
        assert_eq!(cache.get(&a), Some(accepted.clone()));
        // a time limit in seconds stays in memory only; a failure not at all
        let slow = cache.key(&input("slow", 5));
        cache.put(slow, &Reward::new(0.0, Verdict::TimeLimit));
        let failed = cache.key(&input("bad", 5));
        cache.put(failed, &Reward::new(0.0, Verdict::Error));
        assert!(cache.get(&slow).is_some() && cache.get(&failed).is_none());
        assert_eq!(cache.stats(), (2, 4));
        drop(cache);
        let again = RewardCache::new("x", "v1", Some(dir.path())).unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again.get(&a), Some(accepted));
        assert_eq!(again.get(&slow), None);
        // another identity reads its own file
        assert!(
            RewardCache::new("x", "v2", Some(dir.path()))
                .unwrap()
                .is_empty()
        );
    }
}
