//! Supervised warm-up: train on the task's demonstrations until held-out accuracy and loss stop
//! improving, then go back to the weights with the best validation accuracy; RL starts from
//! them. The result is cached by everything that determines it, so a later run with the same
//! settings reuses it.

use std::path::{Path, PathBuf};

use areal_sdk::{PluginError, Split, Task, Tokenizer};
use areal_sdk_train::burn::optim::ModuleOptimizer;
use areal_sdk_train::burn::tensor::{Tensor, TensorData};
use areal_sdk_train::{PackedBatch, Policy};
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::packing::pack;

/// `[warmup]`: supervised training on the task's demonstrations before RL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmupConfig {
    /// Whether to warm up. By default false (the task must provide demonstrations).
    pub enabled: bool,
    /// Demonstrations per step. By default 32.
    pub batch_size: usize,
    /// AdamW learning rate. By default 0.003.
    pub lr: f64,
    /// Evaluate greedy accuracy on the validation split every this many steps. By default 100.
    pub eval_every: u64,
    /// Stop after this many evaluations in a row that improve neither the validation accuracy
    /// by `min_delta` nor the validation loss by `min_loss_improvement` over the best so far:
    /// the plateau. (Accuracy alone stays flat at 0 while a small model is still learning to
    /// read its prompt; the loss shows that learning goes on.) By default 3.
    pub patience: u32,
    /// Smallest accuracy improvement that counts. By default 0.01.
    pub min_delta: f64,
    /// Smallest relative decrease of the validation loss that counts. By default 0.02.
    pub min_loss_improvement: f64,
    /// Stop here even without a plateau. By default 5000.
    pub max_steps: u64,
    /// Folder of cached warm-ups (one sub-folder per settings hash); empty disables caching.
    /// By default `.cache/warmup`.
    pub cache_dir: String,
}

impl Default for WarmupConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            batch_size: 32,
            lr: 3e-3,
            eval_every: 100,
            patience: 3,
            min_delta: 0.01,
            min_loss_improvement: 0.02,
            max_steps: 5000,
            cache_dir: ".cache/warmup".into(),
        }
    }
}

impl WarmupConfig {
    /// Problems with the settings, as (key, message).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !self.enabled {
            return out;
        }
        let max = crate::config::bounds::MAX_WARMUP_BATCH;
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

/// One line of `metrics.jsonl` (`"event": "warmup"`) per evaluation of the warm-up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmupMetrics {
    /// Warm-up steps done.
    pub step: u64,
    /// Mean loss (negative logprob per demonstration token) since the previous evaluation.
    pub loss: f64,
    /// Greedy accuracy on the validation split.
    pub validation_accuracy: f64,
    /// Mean negative logprob per token of the validation split's demonstrations.
    pub validation_loss: f64,
    /// Seconds since the warm-up started.
    pub seconds: f64,
    /// Demonstration tokens trained per second since the previous evaluation.
    pub tokens_per_s: f64,
}

/// What the warm-up did (or what the cached one it reused did).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmupReport {
    /// Steps trained.
    pub steps: u64,
    /// Wall time of the warm-up when it ran (also when it is reused from the cache).
    pub seconds: f64,
    /// The step whose weights the warm-up ends with: the evaluation with the best validation
    /// accuracy (the first of equals), or the last step when the policy cannot save.
    #[serde(default)]
    pub best_step: u64,
    /// Validation accuracy at the last evaluation.
    pub validation_accuracy: f64,
    /// Best validation accuracy seen: that of the weights the warm-up ends with.
    pub best_validation_accuracy: f64,
    /// Whether it stopped at a plateau (rather than at `max_steps`).
    pub plateau: bool,
    /// Every evaluation.
    pub curve: Vec<WarmupMetrics>,
    /// Whether this run reused a cached warm-up.
    #[serde(default)]
    pub cached: bool,
}

/// One demonstration: prompt ids and response ids (ending with a stop token).
pub(crate) type Example = (Vec<u32>, Vec<u32>);

/// The examples of one step.
pub(crate) fn examples(
    task: &dyn Task,
    tokenizer: &dyn Tokenizer,
    split: Split,
    indices: impl Iterator<Item = u64>,
) -> Result<Vec<Example>, EngineError> {
    let stop = tokenizer.stop_token_ids().first().copied();
    let plugin = |e: PluginError| EngineError::plugin("preparing warm-up demonstrations", e);
    indices
        .map(|i| {
            let item = task.item(split, i).map_err(plugin)?;
            let demo = task.demonstration(&item).map_err(plugin)?.ok_or_else(|| {
                EngineError::Invalid(format!(
                    "task {} has no demonstrations to warm up on",
                    task.name()
                ))
            })?;
            let prompt = tokenizer.encode(&item.prompt).map_err(plugin)?;
            let mut completion = tokenizer.encode(&demo).map_err(plugin)?;
            completion.extend(stop);
            Ok((prompt, completion))
        })
        .collect()
}

/// The examples packed under `token_budget`: each micro-batch's members (indices into
/// `examples`) and their prompt + response sequences.
fn microbatches(examples: &[Example], token_budget: usize) -> Vec<(Vec<usize>, PackedBatch)> {
    let lengths: Vec<usize> = examples.iter().map(|(p, c)| p.len() + c.len()).collect();
    pack(&lengths, token_budget, 1)
        .microbatches
        .into_iter()
        .map(|members| {
            let mut batch = PackedBatch::new(1.0);
            for &i in &members {
                let (prompt, completion) = &examples[i];
                batch.push(&[prompt.as_slice(), completion].concat());
            }
            (members, batch)
        })
        .collect()
}

/// Mean negative logprob per demonstration token of `examples`, without gradient.
pub(crate) fn validation_loss(
    policy: &dyn Policy,
    examples: &[Example],
    token_budget: usize,
) -> Result<f64, EngineError> {
    let (mut sum, mut count) = (0.0f64, 0usize);
    for (members, batch) in microbatches(examples, token_budget) {
        let values: Vec<f32> = policy
            .logprobs_no_grad(&batch)
            .map_err(|e| EngineError::plugin("warm-up validation pass", e))?
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("converted to f32");
        for (&i, range) in members.iter().zip(batch.ranges()) {
            let prompt = examples[i].0.len();
            sum -= values[range.start + prompt..range.end]
                .iter()
                .map(|&v| f64::from(v))
                .sum::<f64>();
            count += range.len() - prompt;
        }
    }
    Ok(sum / count.max(1) as f64)
}

/// One supervised step: the mean negative logprob of the demonstration tokens, packed under
/// `token_budget`; returns the loss and the number of demonstration tokens.
pub(crate) fn sft_step(
    policy: &mut dyn Policy,
    optimizer: &mut ModuleOptimizer,
    examples: &[Example],
    lr: f64,
    max_grad_norm: Option<f64>,
    token_budget: usize,
) -> Result<(f64, usize), EngineError> {
    let targets: usize = examples.iter().map(|(_, c)| c.len()).sum();
    let device = policy.device();
    let mut loss_sum = 0.0;
    for (members, batch) in microbatches(examples, token_budget) {
        let mut mask = Vec::new();
        for &i in &members {
            let (prompt, completion) = &examples[i];
            mask.extend(std::iter::repeat_n(0.0f32, prompt.len()));
            mask.extend(std::iter::repeat_n(1.0f32, completion.len()));
        }
        let n = mask.len();
        let mask = Tensor::<1>::from_data(TensorData::new(mask, [n]), &device);
        let logprobs = policy
            .logprobs(&batch)
            .map_err(|e| EngineError::plugin("warm-up forward pass", e))?;
        let loss = (logprobs * mask)
            .sum()
            .neg()
            .div_scalar(targets.max(1) as f32);
        loss_sum += f64::from(loss.clone().into_scalar::<f32>());
        policy
            .backward(loss)
            .map_err(|e| EngineError::plugin("warm-up backward pass", e))?;
    }
    policy
        .step(optimizer, lr, max_grad_norm)
        .map_err(|e| EngineError::plugin("warm-up optimizer step", e))?;
    Ok((loss_sum, targets))
}

/// Where a warm-up with these settings is cached, if caching is on.
pub(crate) fn cache_path(config: &crate::Config) -> Option<PathBuf> {
    if config.warmup.cache_dir.is_empty() {
        return None;
    }
    let mut warmup = config.warmup.clone();
    warmup.cache_dir.clear();
    // everything that decides the warmed-up weights and the plateau
    let key = serde_json::json!({
        "policy": config.policy,
        "task": config.task,
        "reward": config.reward,
        "warmup": warmup,
        "seed": config.seed,
        "max_new_tokens": config.rollout.max_new_tokens,
        "token_budget": config.train.token_budget,
        "max_grad_norm": config.train.max_grad_norm,
        "version": env!("CARGO_PKG_VERSION"),
        // what a cached warm-up means: 2 = it ends with the best-validation-accuracy weights;
        // 3 = it carries a manifest of checksums
        "format": 3,
    });
    let hash = areal_sdk::stable_hash(&key.to_string());
    Some(Path::new(&config.warmup.cache_dir).join(format!("{hash:016x}")))
}

/// File of a cached warm-up's report.
pub(crate) const REPORT_FILE: &str = "warmup.json";
/// File of a cached warm-up's checksums: `{"file": "sha256", ...}` of every other file.
pub(crate) const MANIFEST_FILE: &str = "manifest.json";

/// Read a cached warm-up's report, if the folder holds a complete one: every file its
/// manifest lists is there with its checksum. A damaged cache (truncated, edited, half
/// deleted) is reported and ignored, so the warm-up runs again and replaces it.
pub(crate) fn read_cached(dir: &Path) -> Option<WarmupReport> {
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
    let manifest = std::fs::read_to_string(dir.join(MANIFEST_FILE))
        .map_err(|e| format!("no {MANIFEST_FILE}: {e}"))?;
    let manifest: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&manifest).map_err(|e| format!("{MANIFEST_FILE}: {e}"))?;
    if !manifest.contains_key(REPORT_FILE) {
        return Err(format!("{MANIFEST_FILE} does not list {REPORT_FILE}"));
    }
    for (file, sum) in &manifest {
        let bytes = std::fs::read(dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
        if sha256(&bytes) != *sum {
            return Err(format!("{file} does not match its checksum"));
        }
    }
    let text = std::fs::read_to_string(dir.join(REPORT_FILE)).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("{REPORT_FILE}: {e}"))
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Save the policy, the report and their manifest into `dir`, atomically: a warm-up cache is
/// whole or absent, whatever happens while it is written.
pub(crate) fn write_cache(
    dir: &Path,
    policy: &dyn Policy,
    report: &WarmupReport,
) -> Result<(), EngineError> {
    let written = crate::atomic::write_dir(dir, |tmp| {
        policy
            .save(tmp)
            .map_err(|e| EngineError::plugin("saving the warmed-up policy", e))?;
        let json = serde_json::to_string_pretty(report).expect("the report serialises");
        let path = tmp.join(REPORT_FILE);
        std::fs::write(&path, json).map_err(|e| EngineError::io(&path, e))?;
        let mut manifest = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(tmp).map_err(|e| EngineError::io(tmp, e))? {
            let path = entry.map_err(|e| EngineError::io(tmp, e))?.path();
            if path.is_file() {
                let bytes = std::fs::read(&path).map_err(|e| EngineError::io(&path, e))?;
                let name = path
                    .file_name()
                    .expect("a file in the folder")
                    .to_string_lossy()
                    .into_owned();
                manifest.insert(name, sha256(&bytes));
            }
        }
        let json = serde_json::to_string_pretty(&manifest).expect("the manifest serialises");
        let path = tmp.join(MANIFEST_FILE);
        std::fs::write(&path, json).map_err(|e| EngineError::io(&path, e))
    });
    written.map_err(|e| match e {
        crate::atomic::DirError::Fill(e) => e,
        crate::atomic::DirError::Io(path, e) => EngineError::io(path, e),
    })
}
