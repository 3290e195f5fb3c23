//! Checking the engine's own settings: every problem as (key, message), every size bounded.

use super::bounds::{self, *};
use super::{Config, WarmupConfig};

impl Config {
    /// The most rollout data a run holds at once, in bytes: [`Config::rollout_groups_held`]
    /// groups of `group_size` samples of up to `max_new_tokens` tokens, at
    /// [`bounds::BYTES_PER_TOKEN`] each. Saturates instead of wrapping.
    pub fn rollout_memory_estimate(&self) -> u128 {
        let r = &self.rollout;
        self.rollout_groups_held()
            .saturating_mul(r.group_size as u128)
            .saturating_mul(r.max_new_tokens as u128)
            .saturating_mul(bounds::BYTES_PER_TOKEN)
    }

    /// The most groups a run holds at once: `(min(η, steps) + 2) · B + max_concurrent` (up to
    /// `min(η, steps) + 1` batches accepted ahead of training, the batch being trained, and
    /// the groups generating).
    pub fn rollout_groups_held(&self) -> u128 {
        let r = &self.rollout;
        (u128::from(r.max_staleness.min(self.train.steps)) + 2)
            .saturating_mul(r.batch_size as u128)
            .saturating_add(r.max_concurrent as u128)
    }

    /// Check the engine's own settings; returns every problem as (key, message).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut p = Problems::default();
        p.check(self.seed <= MAX_SEED, "seed", || {
            format!(
                "{} is past the largest seed, {MAX_SEED} (2^63 − 1: config files are TOML, whose integers are 64-bit signed)",
                self.seed
            )
        });
        let r = &self.rollout;
        let before = p.0.len();
        p.in_range("rollout.batch_size", r.batch_size, MAX_BATCH_SIZE);
        p.in_range("rollout.group_size", r.group_size, MAX_GROUP_SIZE);
        p.in_range("rollout.max_concurrent", r.max_concurrent, MAX_CONCURRENT);
        p.in_range("rollout.max_new_tokens", r.max_new_tokens, MAX_NEW_TOKENS);
        let per_step = r.batch_size as u128 * r.group_size as u128;
        // Products and the memory estimate only once each size is within its own bound (a
        // size past it is reported once, above).
        let sizes_ok = p.0.len() == before;
        p.check(
            !sizes_ok || per_step <= MAX_SAMPLES_PER_STEP,
            "rollout.group_size",
            || {
                format!(
                    "{} prompts (rollout.batch_size) × {} samples = {per_step} samples per step is past the most, {MAX_SAMPLES_PER_STEP}",
                    r.batch_size, r.group_size
                )
            },
        );
        let fits = || {
            areal_sdk::resources::check_memory(
                &format!(
                    "rollout data (up to {} groups of {} samples of up to {} tokens held at once: (min(rollout.max_staleness, train.steps) + 2) × rollout.batch_size + rollout.max_concurrent)",
                    self.rollout_groups_held(),
                    r.group_size,
                    r.max_new_tokens
                ),
                self.rollout_memory_estimate(),
            )
        };
        if sizes_ok && let Err(message) = fits() {
            p.0.push(("rollout".into(), message));
        }
        p.at_least_one(
            "rollout.max_consecutive_failures",
            r.max_consecutive_failures as u64,
        );
        p.check(
            r.temperature > 0.0 && r.temperature.is_finite(),
            "rollout.temperature",
            || {
                format!(
                    "must be positive (training needs the sampling distribution), found {}",
                    r.temperature
                )
            },
        );
        p.check(r.top_p > 0.0 && r.top_p <= 1.0, "rollout.top_p", || {
            format!("must be in (0, 1], found {}", r.top_p)
        });
        let s = &self.reward_service;
        p.in_range("reward_service.threads", s.threads, MAX_REWARD_THREADS);
        p.check(
            s.workers <= MAX_REWARD_WORKERS,
            "reward_service.workers",
            || format!("must be at most {MAX_REWARD_WORKERS}, found {}", s.workers),
        );
        p.check(
            s.workers == 0 || self.reward.get("kind").and_then(|k| k.as_str()) != Some("remote"),
            "reward_service.workers",
            || {
                format!(
                    "is {}, but `[reward] kind = \"remote\"` already verifies on servers: set it to 0",
                    s.workers
                )
            },
        );
        p.check(
            (1..=MAX_DEADLINE_MS).contains(&s.deadline_ms),
            "reward_service.deadline_ms",
            || {
                format!(
                    "must be between 1 and {MAX_DEADLINE_MS} (a day), found {}",
                    s.deadline_ms
                )
            },
        );
        let t = &self.train;
        p.at_least_one("train.steps", t.steps);
        p.check(t.lr > 0.0 && t.lr.is_finite(), "train.lr", || {
            format!("must be positive, found {}", t.lr)
        });
        p.non_negative("train.weight_decay", t.weight_decay);
        p.non_negative("train.max_grad_norm", t.max_grad_norm);
        p.non_negative("train.max_seconds", t.max_seconds);
        for (key, beta) in [("train.beta1", t.beta1), ("train.beta2", t.beta2)] {
            p.check((0.0..1.0).contains(&beta), key, || {
                format!("must be in [0, 1), found {beta}")
            });
        }
        p.at_least_one("train.minibatches", t.minibatches as u64);
        p.check(
            t.minibatches as u128 <= per_step.max(1),
            "train.minibatches",
            || {
                format!(
                    "{} mini-batches cannot be cut from {per_step} samples (rollout.batch_size × rollout.group_size)",
                    t.minibatches
                )
            },
        );
        p.in_range("train.token_budget", t.token_budget, MAX_TOKEN_BUDGET);
        if let Err(message) = areal_sdk::resources::check_threads(t.threads) {
            p.0.push(("train.threads".into(), message));
        }
        p.at_least_one("train.min_microbatches", t.min_microbatches as u64);
        if let Err(message) = areal_sdk_train::parse_device(&t.device) {
            p.0.push(("train.device".into(), message));
        }
        p.in_range("rollout.chunk_tokens", r.chunk_tokens, MAX_NEW_TOKENS);
        p.check(
            self.deterministic || !r.generate_ahead,
            "rollout.generate_ahead",
            || {
                "needs deterministic mode (`deterministic = true`): asynchronous, the generator already runs as far ahead as the staleness rule and its speed allow".to_owned()
            },
        );
        p.check(
            !self.deterministic || t.max_seconds == 0.0,
            "train.max_seconds",
            || {
                format!(
                    "must be 0 in deterministic mode (`deterministic = true`): a time limit makes the steps trained depend on the wall clock, found {}",
                    t.max_seconds
                )
            },
        );
        p.in_range("checkpoint.keep", self.checkpoint.keep, MAX_KEEP);
        let retry = self.checkpoint.retry_s;
        p.check(
            (0.0..=MAX_DEADLINE_MS as f64 / 1e3).contains(&retry),
            "checkpoint.retry_s",
            || format!("must be between 0 and 86400 seconds, found {retry}"),
        );
        p.0.extend(self.warmup.problems());
        p.check(
            self.prompt.system.is_none() || self.prompt.format == super::PromptFormat::Chat,
            "prompt.system",
            || "a system message needs prompt.format = \"chat\"".to_owned(),
        );
        p.0
    }
}

#[derive(Default)]
struct Problems(Vec<(String, String)>);

impl Problems {
    fn check(&mut self, ok: bool, key: &str, message: impl FnOnce() -> String) {
        if !ok {
            self.0.push((key.to_owned(), message()));
        }
    }

    fn at_least_one(&mut self, key: &str, value: u64) {
        self.check(value >= 1, key, || {
            format!("must be at least 1, found {value}")
        });
    }

    fn in_range(&mut self, key: &str, value: usize, max: usize) {
        self.check((1..=max).contains(&value), key, || {
            format!("must be between 1 and {max}, found {value}")
        });
    }

    fn non_negative(&mut self, key: &str, value: f64) {
        self.check(value >= 0.0, key, || {
            format!("must not be negative, found {value}")
        });
    }
}

impl WarmupConfig {
    /// Problems with the settings, as (key, message).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !self.enabled {
            return out;
        }
        let max = MAX_WARMUP_BATCH;
        if !(1..=max).contains(&self.batch_size) {
            out.push((
                "warmup.batch_size".into(),
                format!("must be between 1 and {max}, found {}", self.batch_size),
            ));
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            out.push((
                "warmup.lr".into(),
                format!("must be positive, found {}", self.lr),
            ));
        }
        if self.eval_every == 0 {
            out.push((
                "warmup.eval_every".into(),
                "must be at least 1, found 0".into(),
            ));
        }
        if self.max_steps == 0 {
            out.push((
                "warmup.max_steps".into(),
                "must be at least 1, found 0".into(),
            ));
        }
        out
    }
}
