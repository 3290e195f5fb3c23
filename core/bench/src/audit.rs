//! `areal bench audit-objective`: real batches of the built-in job, trained with several
//! mini-batches and η > 0, recorded exactly as the algorithm receives them (current,
//! proximal and behaviour logprobs, advantages, loss mask, token versions, normalisers), for
//! `plugins/algo-ppo/tests/fixtures/audit.py` to recompute each variant's loss and gradient in
//! numpy from the paper's Eq. 5, and for the algo-ppo test `recorded_batches_match_numpy` to
//! compare them with the Rust loss, token by token.
//!
//! The recording also checks the proximal recompute where it is made: in the first
//! mini-batch of every step π_θ is the weights the step starts from, so the current logprobs
//! must equal the proximal ones; in the later mini-batches they must not (the clip can act);
//! on the tokens sampled by the trainer's version the proximal logprobs must equal the
//! behaviour ones (the generator and the trainer agree). A violation fails the bench.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, bail};
use areal_core::{ConfigLoader, Quiet, RunOptions};
use areal_sdk::{PROMPT_VERSION, PluginError, TrajectoryGroup};
use areal_sdk_train::burn::tensor::Tensor;
use areal_sdk_train::{AdvantageInput, Advantages, Algorithm, LossInput, LossOutput, Requirements};
use clap::Args;
use serde::Serialize;

#[derive(Debug, Args)]
pub(crate) struct BenchAuditArgs {
    /// File for the recorded batches (JSON), the input of `audit.py`.
    #[arg(long)]
    out: PathBuf,
    /// Steps of RL to train.
    #[arg(long, default_value_t = 12)]
    steps: u64,
    /// How many of the last steps to record (every mini-batch of each).
    #[arg(long, default_value_t = 1)]
    record: u64,
    /// Mini-batches per step (`train.minibatches`).
    #[arg(long, default_value_t = 4)]
    minibatches: usize,
    /// η (`rollout.max_staleness`).
    #[arg(long, default_value_t = 4)]
    max_staleness: u64,
    /// A config override (repeatable), e.g. `--set rollout.batch_size=4`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// One call of `Algorithm::loss`, on the host.
#[derive(Clone, Debug, Serialize)]
struct Call {
    trainer_version: u64,
    /// Which mini-batch of its step (0 first).
    minibatch: usize,
    current: Vec<f32>,
    proximal: Vec<f32>,
    behaviour: Vec<f32>,
    advantages: Vec<f32>,
    loss_mask: Vec<f32>,
    /// −1 for tokens no policy sampled.
    versions: Vec<i64>,
    completions: Vec<[usize; 2]>,
    minibatch_tokens: usize,
    minibatch_sequences: usize,
}

fn host(t: &Tensor<1>) -> Vec<f32> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("converted to f32")
}

/// The run's algorithm, recording every loss call (with one micro-batch per mini-batch, a
/// call is a mini-batch).
struct Recording {
    inner: Arc<dyn Algorithm>,
    calls: Mutex<Vec<Call>>,
}

impl Algorithm for Recording {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn requirements(&self) -> Requirements {
        self.inner.requirements()
    }
    fn keep_group(&self, group: &TrajectoryGroup) -> bool {
        self.inner.keep_group(group)
    }
    fn advantages(&self, input: &AdvantageInput<'_>) -> Result<Advantages, PluginError> {
        self.inner.advantages(input)
    }
    fn loss(&self, input: &LossInput) -> Result<LossOutput, PluginError> {
        let mut calls = self.calls.lock().expect("recording lock");
        let minibatch = calls
            .iter()
            .rev()
            .take_while(|c| c.trainer_version == input.trainer_version)
            .count();
        calls.push(Call {
            trainer_version: input.trainer_version,
            minibatch,
            current: host(&input.current.0),
            proximal: host(&input.proximal.0),
            behaviour: host(&input.behaviour.0),
            advantages: host(&input.advantages),
            loss_mask: host(&input.loss_mask),
            versions: input
                .versions
                .iter()
                .map(|&v| if v == PROMPT_VERSION { -1 } else { v as i64 })
                .collect(),
            completions: input.completions.iter().map(|r| [r.start, r.end]).collect(),
            minibatch_tokens: input.minibatch_tokens,
            minibatch_sequences: input.minibatch_sequences,
        });
        drop(calls);
        self.inner.loss(input)
    }
}

/// What the recompute must satisfy on one call; the largest differences seen.
#[derive(Debug, Default, Serialize)]
struct Checks {
    /// max |log π_θ − log π_prox| over the first mini-batches' trained tokens (must be ~0).
    first_minibatch_ratio_gap: f64,
    /// max of the same over the later mini-batches (must not be 0).
    later_minibatch_ratio_gap: f64,
    /// max |log π_prox − log π_behav| over tokens of the trainer's version (mismatch), and
    /// how many.
    on_version_gap: f64,
    on_version_tokens: usize,
    /// mean |log π_prox − log π_behav| over tokens with lag ≥ 1 (staleness), and how many.
    stale_gap_mean: f64,
    stale_tokens: usize,
}

fn check(calls: &[Call]) -> Checks {
    let mut c = Checks::default();
    let mut stale_sum = 0.0;
    for call in calls {
        for t in 0..call.current.len() {
            if call.loss_mask[t] == 0.0 || call.versions[t] < 0 {
                continue;
            }
            let ratio = f64::from((call.current[t] - call.proximal[t]).abs());
            let gap = f64::from((call.proximal[t] - call.behaviour[t]).abs());
            if call.minibatch == 0 {
                c.first_minibatch_ratio_gap = c.first_minibatch_ratio_gap.max(ratio);
            } else {
                c.later_minibatch_ratio_gap = c.later_minibatch_ratio_gap.max(ratio);
            }
            if call.versions[t] as u64 == call.trainer_version {
                c.on_version_gap = c.on_version_gap.max(gap);
                c.on_version_tokens += 1;
            } else {
                stale_sum += gap;
                c.stale_tokens += 1;
            }
        }
    }
    c.stale_gap_mean = stale_sum / c.stale_tokens.max(1) as f64;
    c
}

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(crate) fn run(args: BenchAuditArgs) -> anyhow::Result<()> {
    if args.record == 0 || args.record > args.steps {
        bail!(
            "--record must be between 1 and --steps ({}), found {}",
            args.steps,
            args.record
        );
    }
    let mut sets = vec![
        format!("train.steps={}", args.steps),
        format!("train.minibatches={}", args.minibatches),
        format!("rollout.max_staleness={}", args.max_staleness),
        "algorithm.kind=\"decoupled-ppo\"".to_owned(),
        "eval.enabled=false".to_owned(),
    ];
    sets.extend(args.set.iter().cloned());
    let (config, mut plugins) = areal_core::resolve(&ConfigLoader::new().set_all(&sets)?)?;
    if config.train.token_budget < config.rollout.batch_size * config.rollout.group_size * 8 {
        eprintln!(
            "note: with train.token_budget = {} a mini-batch may take several micro-batches; \
             each is recorded as a call of its own",
            config.train.token_budget
        );
    }
    let recording = Arc::new(Recording {
        inner: plugins.algorithm.clone(),
        calls: Mutex::new(Vec::new()),
    });
    plugins.algorithm = recording.clone();
    eprintln!(
        "training the built-in job for {} steps ({} mini-batches, η = {}), recording the last {}",
        args.steps, args.minibatches, args.max_staleness, args.record
    );
    let runtime = areal_cli::internal::runtime()?;
    let started = Instant::now();
    let summary = runtime.block_on(areal_core::run(
        config.clone(),
        plugins,
        RunOptions {
            observer: Arc::new(Quiet),
            started,
            ..RunOptions::default()
        },
    ))?;
    let first = summary.steps.saturating_sub(args.record);
    let calls: Vec<Call> = std::mem::take(&mut *recording.calls.lock().expect("recording lock"))
        .into_iter()
        .filter(|c| c.trainer_version >= first)
        .collect();
    let checks = check(&calls);
    let file = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "steps": summary.steps,
        "minibatches": args.minibatches,
        "max_staleness": args.max_staleness,
        "temperature": config.rollout.temperature,
        "checks": checks,
        "calls": calls,
    });
    std::fs::write(&args.out, serde_json::to_string(&file)?)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    println!(
        "{} loss calls recorded in {} ({:.0} s)",
        calls.len(),
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    println!("| check | value |\n|---|---|");
    println!(
        "| max \\|log π_θ − log π_prox\\|, first mini-batch of a step (π_θ = π_prox) | {:.2e} |",
        checks.first_minibatch_ratio_gap
    );
    println!(
        "| max \\|log π_θ − log π_prox\\|, later mini-batches | {:.2e} |",
        checks.later_minibatch_ratio_gap
    );
    println!(
        "| max \\|log π_prox − log π_behav\\|, {} tokens of the trainer's version (mismatch) | {:.2e} |",
        checks.on_version_tokens, checks.on_version_gap
    );
    println!(
        "| mean \\|log π_prox − log π_behav\\|, {} tokens with lag ≥ 1 (staleness) | {:.2e} |",
        checks.stale_tokens, checks.stale_gap_mean
    );
    if checks.first_minibatch_ratio_gap > 1e-5 {
        bail!(
            "the proximal logprobs are not the weights the step starts from: the first \
             mini-batch's current logprobs differ from them by up to {:.2e}",
            checks.first_minibatch_ratio_gap
        );
    }
    if args.minibatches > 1 && checks.later_minibatch_ratio_gap == 0.0 {
        bail!("the later mini-batches trained with π_θ = π_prox: the weights did not move");
    }
    if checks.on_version_gap > 1e-4 {
        bail!(
            "the trainer's logprobs of tokens its own version sampled differ from the \
             generator's by up to {:.2e}",
            checks.on_version_gap
        );
    }
    Ok(())
}
