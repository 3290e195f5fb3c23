//! Bounds of the engine's settings, checked by [`Config::problems`](super::Config::problems):
//! generous for real runs, finite so that no product wraps and no setting asks for more than a
//! machine has.

/// Most prompts per training step (`rollout.batch_size`).
pub const MAX_BATCH_SIZE: usize = 1 << 20;
/// Most samples per prompt (`rollout.group_size`).
pub const MAX_GROUP_SIZE: usize = 1 << 16;
/// Most samples per step, `rollout.batch_size × rollout.group_size`.
pub const MAX_SAMPLES_PER_STEP: u128 = 1 << 24;
/// Most groups generating at once (`rollout.max_concurrent`).
pub const MAX_CONCURRENT: usize = 1 << 20;
/// Most tokens generated per sample (`rollout.max_new_tokens`).
pub const MAX_NEW_TOKENS: usize = 1 << 20;
/// Most verifier threads (`reward_service.threads`).
pub const MAX_REWARD_THREADS: usize = 1024;
/// Most reward worker processes (`reward_service.workers`).
pub const MAX_REWARD_WORKERS: usize = 256;
/// Longest per-sample verification deadline (`reward_service.deadline_ms`): a day.
pub const MAX_DEADLINE_MS: u64 = 86_400_000;
/// Largest packed micro-batch (`train.token_budget`), in tokens.
pub const MAX_TOKEN_BUDGET: usize = 1 << 24;
/// Largest warm-up batch (`warmup.batch_size`), in demonstrations.
pub const MAX_WARMUP_BATCH: usize = 1 << 16;
/// Largest seed: config files are TOML, whose integers are 64-bit signed.
pub const MAX_SEED: u64 = i64::MAX as u64;
/// Most resume checkpoints kept.
pub const MAX_KEEP: usize = 1 << 16;
/// Bytes held per generated token, for the memory estimate: its id, behaviour logprob and
/// policy version while it waits, and the trainer's per-token arrays (current, proximal
/// and behaviour logprobs, advantages, masks) while it is trained on.
pub const BYTES_PER_TOKEN: u128 = 64;
