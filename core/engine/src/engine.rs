//! A whole run: plugins built from the config, the rollout controller on the async runtime,
//! the trainer on its own thread, weight updates pushed back to the generators.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use areal_sdk::{
    BuildContext, Generator, GeneratorPlugin, GeneratorStats, PluginError, PolicyVersion,
    RewardPlugin, SamplingParams, Split, Task, TaskPlugin, TrajectoryGroup, Verdict, WeightUpdate,
    mix_seed,
};
use areal_sdk_train::burn::optim::AdamWConfig;
use areal_sdk_train::{Algorithm, AlgorithmPlugin, Policy, PolicyContext, PolicyPlugin};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Serialize;
use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::buffer::ReplayBuffer;
use crate::config::Config;
use crate::device::parse_device;
use crate::error::EngineError;
use crate::metrics::{EvalMetrics, StepMetrics, percentile, staleness};
use crate::reward_service::RewardService;
use crate::rollout::{GroupSpec, Rollout};
use crate::runlog::RunLog;
use crate::staleness::{AdmissionCounts, StalenessManager};
use crate::trainer::{StepReport, TrainerSettings, train_step};
use crate::warmup::{self, WarmupMetrics, WarmupReport};

/// The plugins of a run.
pub struct Plugins {
    /// The trainable model.
    pub policy: Box<dyn Policy>,
    /// Rollout generation.
    pub generator: Arc<dyn areal_sdk::Generator>,
    /// Prompt source.
    pub task: Arc<dyn Task>,
    /// Reward verifier.
    pub verifier: Arc<dyn areal_sdk::RewardVerifier>,
    /// Loss and advantages.
    pub algorithm: Arc<dyn Algorithm>,
}

impl Plugins {
    /// Build every plugin section of `config`; all failures are reported together.
    pub fn build(config: &Config) -> Result<Self, EngineError> {
        let mut errors: Vec<PluginError> = Vec::new();
        let ctx =
            |stream: u64, threads: usize| BuildContext::new(mix_seed(config.seed, stream), threads);
        let device = keep(
            &mut errors,
            parse_device(&config.train.device).map_err(|m| PluginError::config("train.device", m)),
        );
        let policy = keep(&mut errors, config.plugin("policy"))
            .zip(device)
            .and_then(|(section, device)| {
                let ctx = PolicyContext::new(ctx(1, 1), device);
                let built = PolicyPlugin::build_from(&section, &ctx);
                keep(&mut errors, built.map_err(|e| in_section("policy", e)))
            });
        let generator = keep(&mut errors, config.plugin("generator")).and_then(|section| {
            let built = GeneratorPlugin::build_from(&section, &ctx(2, 1));
            keep(&mut errors, built.map_err(|e| in_section("generator", e)))
        });
        let task = keep(&mut errors, config.plugin("task")).and_then(|section| {
            let built = TaskPlugin::build_from(&section, &ctx(3, 1));
            keep(&mut errors, built.map_err(|e| in_section("task", e)))
        });
        let verifier = keep(&mut errors, config.plugin("reward")).and_then(|section| {
            let ctx = ctx(4, config.reward_service.threads);
            let built = RewardPlugin::build_from(&section, &ctx);
            keep(&mut errors, built.map_err(|e| in_section("reward", e)))
        });
        let algorithm = keep(&mut errors, config.plugin("algorithm")).and_then(|section| {
            let ctx = ctx(5, 1).with_max_new_tokens(config.rollout.max_new_tokens);
            let built = AlgorithmPlugin::build_from(&section, &ctx);
            keep(&mut errors, built.map_err(|e| in_section("algorithm", e)))
        });
        // What the algorithm needs from the policy: a value head is part of the model from
        // the start; a reference copy is taken when RL starts, but checked now.
        let policy = match (policy, &algorithm) {
            (Some(mut policy), Some(algorithm)) => {
                let needs = algorithm.requirements();
                let name = policy.name().to_owned();
                let mut check = |what: &str, result: Result<(), PluginError>| {
                    result.map_err(|e| {
                        errors.push(PluginError::config(
                            "algorithm.kind",
                            format!(
                                "{} needs {what}, but policy {name} cannot give it: {e}",
                                algorithm.name(),
                            ),
                        ))
                    })
                };
                let values = if needs.values {
                    check("a critic (values)", policy.enable_values())
                } else {
                    Ok(())
                };
                let reference = if needs.reference {
                    check("a reference policy", policy.snapshot().map(drop))
                } else {
                    Ok(())
                };
                (values.is_ok() && reference.is_ok()).then_some(policy)
            }
            (policy, _) => policy,
        };
        match (policy, generator, task, verifier, algorithm) {
            (Some(policy), Some(generator), Some(task), Some(verifier), Some(algorithm)) => {
                Ok(Self {
                    policy,
                    generator,
                    task,
                    verifier,
                    algorithm,
                })
            }
            _ => Err(EngineError::Build { errors }),
        }
    }
}

/// The value, or `None` with the error recorded.
fn keep<T>(errors: &mut Vec<PluginError>, result: Result<T, PluginError>) -> Option<T> {
    result.map_err(|e| errors.push(e)).ok()
}

/// A plugin's build error filed under its config section: a config error keeps its own key;
/// any other failure (a missing interpreter, a model that cannot fit) is the section's
/// (`reward`, `policy`), never an empty key.
fn in_section(section: &str, error: PluginError) -> PluginError {
    match error {
        e @ (PluginError::Config { .. } | PluginError::UnknownPlugin { .. }) => e,
        other => PluginError::config(section, other.to_string()),
    }
}

/// Hooks to follow a run (progress bars, tests). Called from the controller and trainer
/// threads, hence `&self`.
pub trait Observer: Send + Sync {
    /// The run starts and will train `steps` steps.
    fn on_start(&self, steps: u64) {
        let _ = steps;
    }

    /// The weights generators sample from: version 0 when RL starts (after warm-up and the
    /// baseline evaluation, just before the first rollout), then each step's new version once
    /// the generators have it.
    fn on_weights(&self, update: &WeightUpdate) {
        let _ = update;
    }

    /// A rollout was admitted; `counts` are the counters right after admission.
    fn on_admission(&self, counts: &AdmissionCounts) {
        let _ = counts;
    }

    /// A step trained on `groups` with the weights at `version`.
    fn on_trained(&self, groups: &[TrajectoryGroup], version: PolicyVersion) {
        let _ = (groups, version);
    }

    /// A step finished.
    fn on_step(&self, metrics: &StepMetrics) {
        let _ = metrics;
    }

    /// An evaluation finished.
    fn on_eval(&self, metrics: &EvalMetrics) {
        let _ = metrics;
    }

    /// A warm-up evaluation finished.
    fn on_warmup(&self, metrics: &WarmupMetrics) {
        let _ = metrics;
    }
}

/// An observer that does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl Observer for Quiet {}

/// How to run.
#[derive(Clone)]
pub struct RunOptions {
    /// Run folder for `config.toml`, `metrics.jsonl`, `summary.json` and the checkpoint.
    pub out_dir: Option<PathBuf>,
    /// Progress hooks.
    pub observer: Arc<dyn Observer>,
    /// When the run started, for `wall_seconds` (the process start, say). By default now.
    pub started: Instant,
    /// Asks the run to stop cleanly (`areal train` requests it on SIGINT and SIGTERM).
    pub stop: StopRequest,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            out_dir: None,
            observer: Arc::new(Quiet),
            started: Instant::now(),
            stop: StopRequest::new(),
        }
    }
}

/// A request to stop a run cleanly: the warm-up or training step in progress finishes (a
/// step still waiting for its batch is dropped), no further evaluation runs, and the
/// checkpoint and `summary.json` are written (`interrupted: true`). Clones share the request.
#[derive(Clone, Debug)]
pub struct StopRequest(Arc<watch::Sender<bool>>);

impl StopRequest {
    /// A request not yet made.
    pub fn new() -> Self {
        Self(Arc::new(watch::Sender::new(false)))
    }

    /// Ask the run to stop.
    pub fn request(&self) {
        self.0.send_replace(true);
    }

    /// Whether it was asked to stop.
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Wait until it is asked to stop.
    pub async fn requested(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

impl Default for StopRequest {
    fn default() -> Self {
        Self::new()
    }
}

/// The outcome of a run; written to `summary.json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSummary {
    /// Held-out accuracy before training (if evaluated).
    pub baseline_accuracy: Option<f64>,
    /// Held-out accuracy after training (if evaluated).
    pub final_accuracy: Option<f64>,
    /// Seconds from the start of the run to the end.
    pub wall_seconds: f64,
    /// Training steps done.
    pub steps: u64,
    /// The run stopped before `train.steps` because `train.max_seconds` had passed.
    pub stopped_early: bool,
    /// The run was asked to stop (a signal) before it was done: what it had done is saved.
    pub interrupted: bool,
    /// The saved checkpoint, relative to the run folder (`checkpoint`); `None` when there is
    /// no run folder, the policy cannot save, or saving failed (the run then fails too).
    pub checkpoint: Option<PathBuf>,
    /// Final policy version.
    pub policy_version: PolicyVersion,
    /// η.
    pub max_staleness: u64,
    /// Algorithm name.
    pub algorithm: String,
    /// Run seed.
    pub seed: u64,
    /// Mean reward of the first step's batch.
    pub reward_mean_first: f64,
    /// Mean reward of the last step's batch.
    pub reward_mean_last: f64,
    /// Largest per-token version lag trained on.
    pub token_lag_max: i64,
    /// Mean per-token version lag over all trained tokens.
    pub token_lag_mean: f64,
    /// Groups accepted.
    pub groups_accepted: u64,
    /// Groups rejected (failed or filtered).
    pub groups_rejected: u64,
    /// Samples lost to verifier failures.
    pub reward_failures: u64,
    /// Seconds the supervised warm-up took (when it ran; a reused one reports its original
    /// time), 0 without warm-up.
    pub warmup_seconds: f64,
    /// The warm-up, if there was one.
    pub warmup: Option<WarmupReport>,
    /// Every evaluation.
    pub evals: Vec<EvalMetrics>,
    /// Seconds from the start of RL (after warm-up and the baseline evaluation) to the end of
    /// the last step; evaluations in between included.
    pub rl_seconds: f64,
    /// Generated tokens trained on per second of `rl_seconds`.
    pub trained_tokens_per_s: f64,
    /// Fraction of `rl_seconds` the trainer spent computing steps.
    pub train_busy: f64,
    /// Fraction of `rl_seconds` the generator spent computing (`None` when it does not
    /// measure it).
    pub gen_busy: Option<f64>,
    /// Mean milliseconds of the weight-update protocol (new weights ready to generators
    /// resumed).
    pub weight_sync_ms_mean: f64,
    /// Mean milliseconds from an interruption to decoding running again, over the updates
    /// that interrupted something (`None` when none did or not measured).
    pub resume_ms_mean: Option<f64>,
}

struct Shared {
    config: Config,
    rollout: Arc<Rollout>,
    task: Arc<dyn Task>,
    algorithm: Arc<dyn Algorithm>,
    observer: Arc<dyn Observer>,
    admission: Mutex<StalenessManager>,
    admission_changed: Notify,
    buffer: ReplayBuffer,
    stop: watch::Sender<bool>,
    fatal: Mutex<Option<EngineError>>,
    consecutive_failures: AtomicUsize,
    started: Instant,
    controller: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// A clean stop asked from outside (a signal).
    interrupt: StopRequest,
}

impl Shared {
    fn fail(&self, error: EngineError) {
        let mut fatal = self.fatal.lock().expect("fatal lock poisoned");
        if fatal.is_none() {
            tracing::error!(target: "areal::engine", error = %error, "run aborted");
            *fatal = Some(error);
        }
        drop(fatal);
        self.stop.send_replace(true);
    }

    fn counts(&self) -> AdmissionCounts {
        self.admission
            .lock()
            .expect("admission lock poisoned")
            .counts()
    }
}

/// Run `plugins` as `config` says until `train.steps` steps are trained.
pub async fn run(
    config: Config,
    plugins: Plugins,
    options: RunOptions,
) -> Result<RunSummary, EngineError> {
    let Plugins {
        policy,
        generator,
        task,
        verifier,
        algorithm,
    } = plugins;
    check_task(task.as_ref(), &config)?;
    let log = RunLog::new(options.out_dir.as_deref(), &config)?;
    let tokenizer = policy.tokenizer();
    let rewards = RewardService::new(
        verifier,
        config.reward_service.threads,
        std::time::Duration::from_millis(config.reward_service.deadline_ms),
    );
    let rollout = Arc::new(Rollout::new(generator.clone(), tokenizer, rewards));
    generator
        .update_weights(weight_update(policy.as_ref(), 0))
        .await
        .map_err(|e| EngineError::plugin("loading the initial weights into the generator", e))?;

    let r = &config.rollout;
    let shared = Arc::new(Shared {
        admission: Mutex::new(StalenessManager::new(
            r.batch_size as u64,
            r.max_staleness,
            r.max_concurrent as u64,
        )),
        config: config.clone(),
        rollout,
        task,
        algorithm,
        observer: options.observer.clone(),
        admission_changed: Notify::new(),
        buffer: ReplayBuffer::new(),
        stop: watch::Sender::new(false),
        fatal: Mutex::new(None),
        consecutive_failures: AtomicUsize::new(0),
        started: options.started,
        controller: Mutex::new(None),
        interrupt: options.stop.clone(),
    });
    // If this future is dropped (a caller's timeout, Ctrl-C), the trainer thread must not
    // wait for data forever.
    let _stop_on_drop = StopOnDrop(&shared.stop);
    shared.observer.on_start(config.train.steps);
    let handle = Handle::current();
    let pool = match config.train.threads {
        0 => None,
        n => Some(
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("areal-train-{i}"))
                .build()
                .map_err(|e| {
                    EngineError::Invalid(format!("cannot start {n} trainer threads: {e}"))
                })?,
        ),
    };
    let trainer = {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || {
            let train = || trainer_loop(&shared, policy, &handle, log);
            // the trainer computes on its own threads (burn's CPU backend uses the current
            // rayon pool)
            match pool {
                Some(pool) => pool.install(train),
                None => train(),
            }
        })
    };
    let result = match trainer.await {
        Ok(result) => result,
        Err(e) => Err(EngineError::Invalid(format!(
            "the trainer thread failed: {e}"
        ))),
    };
    shared.stop.send_replace(true);
    let controller = shared.controller.lock().expect("controller lock").take();
    if let Some(controller) = controller {
        let _ = controller.await;
    }
    let (summary, checkpoint_error) = result?;
    if let Some(dir) = &options.out_dir {
        let path = dir.join("summary.json");
        let json = serde_json::to_string_pretty(&summary).expect("the summary serialises");
        crate::atomic::write(&path, (json + "\n").as_bytes())
            .map_err(|e| EngineError::io(path, e))?;
    }
    match checkpoint_error {
        Some(e) => Err(e),
        None => Ok(summary),
    }
}

fn check_task(task: &dyn Task, config: &Config) -> Result<(), EngineError> {
    if task.len(Split::Train) == Some(0) {
        return Err(EngineError::Invalid(format!(
            "task {} has an empty train split",
            task.name()
        )));
    }
    if config.eval.enabled && matches!(task.len(Split::Eval), None | Some(0)) {
        return Err(EngineError::Invalid(format!(
            "task {} has no finite eval split; set eval.enabled = false to train without evaluation",
            task.name()
        )));
    }
    Ok(())
}

/// Train-split indices: in order for unbounded tasks, a fresh shuffle per epoch otherwise.
struct DataOrder {
    len: Option<usize>,
    seed: u64,
    next: u64,
    epoch: Option<u64>,
    permutation: Vec<u64>,
}

impl DataOrder {
    fn new(len: Option<usize>, seed: u64) -> Self {
        Self {
            len,
            seed,
            next: 0,
            epoch: None,
            permutation: Vec::new(),
        }
    }

    fn next_index(&mut self) -> u64 {
        let n = self.next;
        self.next += 1;
        let Some(len) = self.len else { return n };
        let epoch = n / len as u64;
        if self.epoch != Some(epoch) {
            self.permutation = (0..len as u64).collect();
            self.permutation
                .shuffle(&mut StdRng::seed_from_u64(mix_seed(self.seed, epoch)));
            self.epoch = Some(epoch);
        }
        self.permutation[(n % len as u64) as usize]
    }
}

async fn controller(shared: Arc<Shared>) {
    let mut stop = shared.stop.subscribe();
    let mut tasks = JoinSet::new();
    let mut order = DataOrder::new(
        shared.task.len(Split::Train),
        mix_seed(shared.config.seed, 6),
    );
    let r = shared.config.rollout.clone();
    let mut next_group = 0u64;
    loop {
        while tasks.try_join_next().is_some() {}
        if *stop.borrow() {
            tasks.abort_all();
            return;
        }
        let version = loop {
            let changed = shared.admission_changed.notified();
            let admitted = {
                let mut admission = shared.admission.lock().expect("admission lock poisoned");
                admission.try_admit().then(|| admission.counts())
            };
            if let Some(counts) = admitted {
                shared.observer.on_admission(&counts);
                break counts.version as PolicyVersion;
            }
            tokio::select! {
                _ = changed => {}
                _ = stop.wait_for(|s| *s) => {
                    tasks.abort_all();
                    return;
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        };
        let group_id = next_group;
        next_group += 1;
        let index = order.next_index();
        let spec = GroupSpec {
            group_id,
            group_size: r.group_size,
            max_new_tokens: r.max_new_tokens,
            sampling: SamplingParams {
                temperature: r.temperature,
                top_p: r.top_p,
                seed: shared.config.seed,
            },
            admitted_at: version,
        };
        tasks.spawn(group_task(shared.clone(), spec, index));
    }
}

/// Run one group to its end and settle its admission slot, whatever happens to it.
async fn group_task(shared: Arc<Shared>, spec: GroupSpec, index: u64) {
    let group_id = spec.group_id;
    // A separate task, so that a panicking plugin costs this group and not its slot.
    let inner = tokio::spawn(rollout_group(shared.clone(), spec, index));
    let _abort = AbortOnDrop(inner.abort_handle());
    let outcome = match inner.await {
        Ok(outcome) => outcome,
        Err(e) => Err(PluginError::failed(
            "rollout",
            format!("the rollout task failed: {e}"),
        )),
    };
    let accepted = match outcome {
        Ok(Some(group)) => {
            shared.consecutive_failures.store(0, Ordering::SeqCst);
            shared.buffer.push(group);
            true
        }
        Ok(None) => {
            shared.consecutive_failures.store(0, Ordering::SeqCst);
            false
        }
        Err(e) => {
            let failures = shared.consecutive_failures.fetch_add(1, Ordering::SeqCst) + 1;
            tracing::warn!(target: "areal::rollout", group_id, error = %e, failures, "rollout failed; group rejected");
            if failures >= shared.config.rollout.max_consecutive_failures {
                shared.fail(EngineError::plugin(
                    format!("{failures} rollouts in a row failed (rollout.max_consecutive_failures); the last error"),
                    e,
                ));
            }
            false
        }
    };
    shared
        .admission
        .lock()
        .expect("admission lock poisoned")
        .finish(accepted);
    shared.admission_changed.notify_waiters();
}

/// Generate and reward a group; `None` when the algorithm filtered it. A group whose every
/// sample lost its reward is an error (see [`Rollout::run_group`]).
async fn rollout_group(
    shared: Arc<Shared>,
    spec: GroupSpec,
    index: u64,
) -> Result<Option<TrajectoryGroup>, PluginError> {
    let group_id = spec.group_id;
    let item = shared.task.item(Split::Train, index)?;
    let group = shared.rollout.run_group(spec, item).await?;
    let kept = shared.algorithm.keep_group(&group);
    if !kept {
        tracing::debug!(target: "areal::rollout", group_id, "group filtered by the algorithm");
    }
    Ok(kept.then_some(group))
}

/// Stops the run when dropped.
struct StopOnDrop<'a>(&'a watch::Sender<bool>);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// Aborts a task when dropped (when the task awaiting it is aborted at the end of a run).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The next batch, or `None` when the run is asked to stop first.
async fn next_batch(shared: &Shared) -> Result<Option<Vec<TrajectoryGroup>>, EngineError> {
    let mut stop = shared.stop.subscribe();
    tokio::select! {
        groups = shared.buffer.take(shared.config.rollout.batch_size) => Ok(Some(groups)),
        () = shared.interrupt.requested() => Ok(None),
        _ = stop.wait_for(|s| *s) => Err(shared
            .fatal
            .lock()
            .expect("fatal lock poisoned")
            .take()
            .unwrap_or_else(|| EngineError::Invalid("the run was stopped".into()))),
    }
}

/// Push new weights: pause the generators (in-flight samples come back interrupted and are
/// resubmitted), load the weights, resume, and open admission for the new version.
async fn publish(shared: &Shared, weights: WeightUpdate) -> Result<(), EngineError> {
    let version = weights.version;
    let generator = shared.rollout.generator();
    let paused = match generator.pause().await {
        Ok(()) => true,
        Err(e) if e.is_unsupported() => false,
        Err(e) => return Err(EngineError::plugin("pausing the generator", e)),
    };
    generator.update_weights(weights).await.map_err(|e| {
        EngineError::plugin(
            format!("loading weights of version {version} into the generator"),
            e,
        )
    })?;
    if paused {
        generator
            .resume()
            .await
            .map_err(|e| EngineError::plugin("resuming the generator", e))?;
    }
    shared
        .admission
        .lock()
        .expect("admission lock poisoned")
        .set_version(version);
    shared.admission_changed.notify_waiters();
    Ok(())
}

/// The policy's current weights as version `version`, with its architecture.
pub(crate) fn weight_update(policy: &dyn Policy, version: PolicyVersion) -> WeightUpdate {
    WeightUpdate::new(version, policy.weights()).with_architecture(policy.architecture())
}

/// Greedy pass@1 over `split` (at most `eval.max_items` items).
async fn evaluate(
    shared: &Shared,
    split: Split,
    step: u64,
    version: PolicyVersion,
) -> Result<EvalMetrics, EngineError> {
    let r = &shared.config.rollout;
    let spec = crate::eval::EvalSpec {
        split,
        max_items: shared.config.eval.max_items,
        samples: 1,
        sampling: SamplingParams::greedy(),
        max_new_tokens: r.max_new_tokens,
        concurrency: r.max_concurrent * r.group_size,
    };
    let outcome = crate::eval::evaluate(&shared.task, &shared.rollout, &spec).await?;
    Ok(EvalMetrics {
        step,
        policy_version: version,
        wall_s: shared.started.elapsed().as_secs_f64(),
        accuracy: outcome.accuracy,
        reward_mean: outcome.reward_mean,
        items: outcome.items,
        failures: outcome.failures,
    })
}

fn trainer_loop(
    shared: &Arc<Shared>,
    mut policy: Box<dyn Policy>,
    handle: &Handle,
    mut log: RunLog,
) -> Result<(RunSummary, Option<EngineError>), EngineError> {
    let config = &shared.config;
    let t = &config.train;
    let warmup = if config.warmup.enabled {
        let report = warm_up(shared, policy.as_mut(), handle, &mut log)?;
        handle
            .block_on(
                shared
                    .rollout
                    .generator()
                    .update_weights(weight_update(policy.as_ref(), 0)),
            )
            .map_err(|e| {
                EngineError::plugin("loading the warmed-up weights into the generator", e)
            })?;
        Some(report)
    } else {
        None
    };
    // The reference policy of a KL penalty: the weights RL starts from.
    let reference = if shared.algorithm.requirements().reference {
        Some(policy.snapshot().map_err(|e| {
            EngineError::plugin(
                format!(
                    "copying the policy as the reference of {}",
                    shared.algorithm.name()
                ),
                e,
            )
        })?)
    } else {
        None
    };
    let mut optimizer = AdamWConfig::new()
        .with_beta_1(t.beta1 as f32)
        .with_beta_2(t.beta2 as f32)
        .with_weight_decay(t.weight_decay as f32)
        .init();
    let settings = TrainerSettings {
        lr: t.lr,
        max_grad_norm: (t.max_grad_norm > 0.0).then_some(t.max_grad_norm),
        minibatches: t.minibatches,
        token_budget: t.token_budget,
        min_microbatches: t.min_microbatches,
        temperature: config.rollout.temperature,
    };
    let mut evals = Vec::new();
    let mut eval = |step: u64, version: PolicyVersion, log: &mut RunLog| {
        let m = handle.block_on(evaluate(shared, Split::Eval, step, version))?;
        tracing::info!(target: "areal::eval", step, policy_version = version, accuracy = m.accuracy, reward_mean = m.reward_mean, "eval");
        log.record("eval", &m)?;
        log.eval_point(m.wall_s, m.accuracy)?;
        shared.observer.on_eval(&m);
        evals.push(m);
        Ok::<_, EngineError>(())
    };
    // Asked to stop during the warm-up: no evaluation, no RL; what there is gets saved.
    let stop_before_rl = shared.interrupt.is_requested();
    if config.eval.enabled && !stop_before_rl {
        eval(0, 0, &mut log)?;
    }

    // RL starts now: generation may run ahead from here.
    let mut rl = RlClock::start(shared.rollout.generator().as_ref());
    if !stop_before_rl {
        log.rl_started(shared.started.elapsed().as_secs_f64());
        shared
            .observer
            .on_weights(&weight_update(policy.as_ref(), 0));
        *shared.controller.lock().expect("controller lock") =
            Some(handle.spawn(controller(shared.clone())));
    }

    let counters = &shared.rollout.counters;
    let mut version: PolicyVersion = 0;
    let mut steps = Vec::new();
    let mut generated = (
        Instant::now(),
        counters.generated_tokens.load(Ordering::Relaxed),
    );
    for step in 1..=t.steps {
        if shared.interrupt.is_requested() {
            break;
        }
        let wait = Instant::now();
        // A stop asked while waiting for the batch drops this step.
        let Some(groups) = handle.block_on(next_batch(shared))? else {
            break;
        };
        let wait_ms = wait.elapsed().as_secs_f64() * 1e3;

        let compute = Instant::now();
        let report = train_step(
            policy.as_mut(),
            reference.as_deref(),
            &mut optimizer,
            shared.algorithm.as_ref(),
            &groups,
            version,
            &settings,
        )?;
        let train_ms = compute.elapsed().as_secs_f64() * 1e3;
        shared.observer.on_trained(&groups, version);

        let sync = Instant::now();
        let update = weight_update(policy.as_ref(), version + 1);
        handle.block_on(publish(shared, update.clone()))?;
        let weight_sync_ms = sync.elapsed().as_secs_f64() * 1e3;
        shared.observer.on_weights(&update);
        let (gen_busy, resume_ms) = rl.step(shared.rollout.generator().as_ref());

        let now = (
            Instant::now(),
            counters.generated_tokens.load(Ordering::Relaxed),
        );
        let gen_tokens_per_s =
            (now.1 - generated.1) as f64 / (now.0 - generated.0).as_secs_f64().max(1e-9);
        generated = now;
        let mut metrics = step_metrics(shared, &groups, version, report);
        version += 1;
        metrics.step = step;
        metrics.gen_tokens_per_s = gen_tokens_per_s;
        metrics.train_tokens_per_s = metrics.packed_tokens as f64 / (train_ms / 1e3).max(1e-9);
        (metrics.wait_ms, metrics.train_ms, metrics.weight_sync_ms) =
            (wait_ms, train_ms, weight_sync_ms);
        (metrics.gen_busy, metrics.resume_ms) = (gen_busy, resume_ms);
        tracing::info!(
            target: "areal::train",
            step,
            policy_version = version,
            reward_mean = metrics.reward_mean,
            token_lag_max = metrics.staleness.token_lag_max,
            loss = metrics.loss,
            "step"
        );
        log.record("step", &metrics)?;
        shared.observer.on_step(&metrics);
        steps.push(metrics);
        if t.max_seconds > 0.0 && step < t.steps && rl.seconds() >= t.max_seconds {
            tracing::info!(target: "areal::train", step, seconds = rl.seconds(), "train.max_seconds reached; stopping");
            rl.stopped_early = true;
            break;
        }
        let every = config.eval.every;
        if config.eval.enabled && every > 0 && step % every == 0 && step != t.steps {
            eval(step, version, &mut log)?;
        }
    }
    let interrupted = shared.interrupt.is_requested();
    if interrupted {
        tracing::warn!(target: "areal::train", steps = steps.len(), "stopped on request; saving the checkpoint and summary");
    }
    // The checkpoint first: the trained model is what a failure later must not cost.
    let (checkpoint, checkpoint_error) = match log.dir() {
        Some(dir) => match save_checkpoint(shared, policy.as_ref(), handle, dir) {
            Ok(saved) => (saved, None),
            Err(e) => (None, Some(e)),
        },
        None => (None, None),
    };
    if config.eval.enabled && !interrupted {
        eval(steps.len() as u64, version, &mut log)?;
    }
    let mut summary = summarise(shared, &steps, evals, warmup, &rl);
    summary.interrupted = interrupted;
    summary.checkpoint = checkpoint;
    Ok((summary, checkpoint_error))
}

/// How long to wait between attempts at saving the checkpoint.
const CHECKPOINT_RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Save the policy into `checkpoint/` of the run folder, atomically. A failure (a full disk)
/// is retried every 10 s for `checkpoint.retry_s`, so that freeing space saves the model;
/// a stop request gives up at once. `Ok(None)` when the policy cannot save at all.
fn save_checkpoint(
    shared: &Shared,
    policy: &dyn Policy,
    handle: &Handle,
    dir: &Path,
) -> Result<Option<PathBuf>, EngineError> {
    const NAME: &str = "checkpoint";
    let target = dir.join(NAME);
    let started = Instant::now();
    let budget = std::time::Duration::from_secs_f64(shared.config.checkpoint.retry_s);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let error = match crate::atomic::write_dir(&target, |tmp| policy.save(tmp)) {
            Ok(()) => return Ok(Some(PathBuf::from(NAME))),
            Err(crate::atomic::DirError::Fill(e)) if e.is_unsupported() => {
                tracing::warn!(target: "areal::engine", policy = policy.name(), "the policy cannot save checkpoints");
                return Ok(None);
            }
            Err(crate::atomic::DirError::Fill(e)) => e.to_string(),
            Err(crate::atomic::DirError::Io(path, e)) => format!("{}: {e}", path.display()),
        };
        let left = budget.saturating_sub(started.elapsed());
        if left.is_zero() || shared.interrupt.is_requested() {
            return Err(EngineError::Checkpoint {
                path: target,
                attempts,
                seconds: started.elapsed().as_secs_f64(),
                message: error,
            });
        }
        tracing::warn!(
            target: "areal::engine",
            "cannot save the checkpoint to {}: {error}; trying again in {} s for up to {:.0} s more (checkpoint.retry_s): free some space, or stop the run",
            target.display(),
            CHECKPOINT_RETRY_EVERY.as_secs(),
            left.as_secs_f64()
        );
        handle.block_on(async {
            tokio::select! {
                () = tokio::time::sleep(CHECKPOINT_RETRY_EVERY.min(left)) => {}
                () = shared.interrupt.requested() => {}
            }
        });
    }
}

/// Wall time and generator counters since RL started, and since the previous step.
struct RlClock {
    /// Stopped by `train.max_seconds`.
    stopped_early: bool,
    started: Instant,
    at_start: GeneratorStats,
    last: (Instant, GeneratorStats),
}

impl RlClock {
    fn start(generator: &dyn Generator) -> Self {
        let (now, stats) = (Instant::now(), generator.stats());
        Self {
            stopped_early: false,
            started: now,
            at_start: stats,
            last: (now, stats),
        }
    }

    /// A step ended: the generator's busy fraction and mean resume time since the previous.
    fn step(&mut self, generator: &dyn Generator) -> (Option<f64>, Option<f64>) {
        let now = (Instant::now(), generator.stats());
        let since = busy_and_resume(&self.last, &now);
        self.last = now;
        since
    }

    /// Seconds from the start of RL to the end of the last step.
    fn seconds(&self) -> f64 {
        (self.last.0 - self.started).as_secs_f64()
    }

    /// Busy fraction and mean resume time over the whole of RL.
    fn totals(&self) -> (Option<f64>, Option<f64>) {
        busy_and_resume(&(self.started, self.at_start), &self.last)
    }
}

/// The generator's busy fraction and mean resume milliseconds between two readings.
fn busy_and_resume(
    from: &(Instant, GeneratorStats),
    to: &(Instant, GeneratorStats),
) -> (Option<f64>, Option<f64>) {
    let wall = (to.0 - from.0).as_secs_f64().max(1e-9);
    let busy =
        to.1.busy_seconds
            .zip(from.1.busy_seconds)
            .map(|(b, a)| ((b - a) / wall).clamp(0.0, 1.0));
    let resumes = to.1.resumes.saturating_sub(from.1.resumes);
    let resume =
        (resumes > 0).then(|| (to.1.resume_seconds - from.1.resume_seconds) * 1e3 / resumes as f64);
    (busy, resume)
}

/// The metrics of a step that trained `groups` on version `version`; the caller fills in
/// the step number, rates and timings.
fn step_metrics(
    shared: &Shared,
    groups: &[TrajectoryGroup],
    version: PolicyVersion,
    report: StepReport,
) -> StepMetrics {
    let counters = &shared.rollout.counters;
    let samples: Vec<_> = groups.iter().flat_map(|g| &g.samples).collect();
    let n = samples.len().max(1) as f64;
    let lengths: Vec<usize> = samples.iter().map(|s| s.completion.len()).collect();
    let latencies = counters.drain_latencies();
    let counts = shared.counts();
    StepMetrics {
        policy_version: version + 1,
        wall_s: shared.started.elapsed().as_secs_f64(),
        reward_mean: samples.iter().map(|s| s.reward.value).sum::<f64>() / n,
        accepted_fraction: samples
            .iter()
            .filter(|s| s.reward.verdict == Verdict::Accepted)
            .count() as f64
            / n,
        groups: groups.len(),
        samples: samples.len(),
        trained_tokens: lengths.iter().sum(),
        packed_tokens: report.packed_tokens,
        response_len_mean: lengths.iter().sum::<usize>() as f64 / n,
        response_len_max: lengths.iter().copied().max().unwrap_or(0),
        staleness: staleness(groups, version),
        reward_latency_p50_ms: percentile(&latencies, 50.0),
        reward_latency_p99_ms: percentile(&latencies, 99.0),
        buffer_size: shared.buffer.len(),
        running: counts.running,
        accepted_total: counts.accepted,
        rejected_total: counts.rejected,
        reward_failures: counters.reward_failures.swap(0, Ordering::Relaxed),
        interrupted_samples: counters.interruptions.swap(0, Ordering::Relaxed),
        loss: report.loss,
        grad_norm: report.grad_norm,
        microbatches: report.microbatches,
        on_policy_logprob_gap: report.on_policy_logprob_gap,
        algorithm: report.stats,
        ..StepMetrics::default()
    }
}

fn summarise(
    shared: &Shared,
    steps: &[StepMetrics],
    evals: Vec<EvalMetrics>,
    warmup: Option<WarmupReport>,
    rl: &RlClock,
) -> RunSummary {
    let config = &shared.config;
    let counts = shared.counts();
    let tokens: usize = steps.iter().map(|m| m.trained_tokens).sum();
    let lag_sum: f64 = steps
        .iter()
        .map(|m| m.staleness.token_lag_mean * m.trained_tokens as f64)
        .sum();
    let rl_seconds = rl.seconds();
    let train_ms: f64 = steps.iter().map(|m| m.train_ms).sum();
    let (gen_busy, resume_ms_mean) = rl.totals();
    RunSummary {
        baseline_accuracy: evals.first().map(|e| e.accuracy),
        final_accuracy: evals.last().map(|e| e.accuracy),
        wall_seconds: shared.started.elapsed().as_secs_f64(),
        steps: steps.len() as u64,
        stopped_early: rl.stopped_early,
        interrupted: false,
        checkpoint: None,
        policy_version: steps.last().map_or(0, |m| m.policy_version),
        max_staleness: config.rollout.max_staleness,
        algorithm: shared.algorithm.name().to_owned(),
        seed: config.seed,
        reward_mean_first: steps.first().map_or(0.0, |m| m.reward_mean),
        reward_mean_last: steps.last().map_or(0.0, |m| m.reward_mean),
        token_lag_max: steps
            .iter()
            .map(|m| m.staleness.token_lag_max)
            .max()
            .unwrap_or(0),
        token_lag_mean: if tokens > 0 {
            lag_sum / tokens as f64
        } else {
            0.0
        },
        groups_accepted: counts.accepted,
        groups_rejected: counts.rejected,
        reward_failures: steps.iter().map(|m| m.reward_failures).sum(),
        warmup_seconds: warmup.as_ref().map_or(0.0, |w| w.seconds),
        warmup,
        evals,
        rl_seconds,
        trained_tokens_per_s: tokens as f64 / rl_seconds.max(1e-9),
        train_busy: (train_ms / 1e3 / rl_seconds.max(1e-9)).min(1.0),
        gen_busy,
        weight_sync_ms_mean: steps.iter().map(|m| m.weight_sync_ms).sum::<f64>()
            / steps.len().max(1) as f64,
        resume_ms_mean,
    }
}

/// The supervised warm-up: reuse a cached one, or train on demonstrations until validation
/// accuracy stops improving (and cache the result).
fn warm_up(
    shared: &Shared,
    policy: &mut dyn Policy,
    handle: &Handle,
    log: &mut RunLog,
) -> Result<WarmupReport, EngineError> {
    let config = &shared.config;
    let w = &config.warmup;
    let cache = warmup::cache_path(config);
    if let Some(dir) = &cache
        && let Some(mut report) = warmup::read_cached(dir)
    {
        match policy.load(dir) {
            Ok(()) => {
                report.cached = true;
                tracing::info!(target: "areal::warmup", dir = %dir.display(), seconds = report.seconds, "reusing a cached warm-up");
                for m in &report.curve {
                    log.record("warmup", m)?;
                    shared.observer.on_warmup(m);
                }
                return Ok(report);
            }
            // Unloadable although its checksums hold (the policy is left as it was): warm
            // up again, and the new warm-up replaces it.
            Err(e) => {
                tracing::warn!(target: "areal::warmup", dir = %dir.display(), error = %e, "the cached warm-up cannot be loaded; warming up again");
            }
        }
    }
    let started = Instant::now();
    let mut optimizer = AdamWConfig::new()
        .with_beta_1(config.train.beta1 as f32)
        .with_beta_2(config.train.beta2 as f32)
        .with_weight_decay(config.train.weight_decay as f32)
        .init();
    let max_grad_norm = (config.train.max_grad_norm > 0.0).then_some(config.train.max_grad_norm);
    let tokenizer = policy.tokenizer();
    // The warm-up draws from a part of an unbounded train split that RL does not start from;
    // a finite one (a dataset) it goes through like RL does, shuffled afresh each epoch.
    let train_len = shared.task.len(Split::Train);
    let first = if train_len.is_none() { 1u64 << 40 } else { 0 };
    let mut order = DataOrder::new(train_len, mix_seed(config.seed, 7));
    let validation_items = shared.task.len(Split::Validation).unwrap_or(0) as u64;
    let validation = warmup::examples(
        shared.task.as_ref(),
        tokenizer.as_ref(),
        Split::Validation,
        0..validation_items,
    )?;
    let (mut best, mut best_loss, mut since_best, mut plateau) =
        (f64::NEG_INFINITY, f64::INFINITY, 0u32, false);
    // The weights with the best validation accuracy so far: the warm-up ends with them, so the
    // baseline is the best the demonstrations gave, not wherever the last step happened to be.
    let snapshots = tempfile::tempdir().map_err(|e| EngineError::io(Path::new("(temp dir)"), e))?;
    let best_dir = snapshots.path().join("best");
    let (mut best_step, mut can_snapshot) = (0u64, true);
    let (mut loss_sum, mut tokens, mut window) = (0.0, 0usize, Instant::now());
    let mut curve = Vec::new();
    let mut steps = 0;
    let mut interrupted = false;
    while steps < w.max_steps {
        if shared.interrupt.is_requested() {
            interrupted = true;
            break;
        }
        steps += 1;
        let indices: Vec<u64> = (0..w.batch_size)
            .map(|_| first + order.next_index())
            .collect();
        let batch = warmup::examples(
            shared.task.as_ref(),
            tokenizer.as_ref(),
            Split::Train,
            indices.into_iter(),
        )?;
        let (loss, n) = warmup::sft_step(
            policy,
            &mut optimizer,
            &batch,
            w.lr,
            max_grad_norm,
            config.train.token_budget,
        )?;
        loss_sum += loss * n as f64;
        tokens += n;
        if steps % w.eval_every == 0 || steps == w.max_steps {
            handle
                .block_on(
                    shared
                        .rollout
                        .generator()
                        .update_weights(weight_update(policy, 0)),
                )
                .map_err(|e| {
                    EngineError::plugin("loading warm-up weights into the generator", e)
                })?;
            let eval = handle.block_on(evaluate(shared, Split::Validation, steps, 0))?;
            let validation_loss =
                warmup::validation_loss(policy, &validation, config.train.token_budget)?;
            let m = WarmupMetrics {
                step: steps,
                loss: loss_sum / tokens.max(1) as f64,
                validation_accuracy: eval.accuracy,
                validation_loss,
                seconds: started.elapsed().as_secs_f64(),
                tokens_per_s: tokens as f64 / window.elapsed().as_secs_f64().max(1e-9),
            };
            tracing::info!(
                target: "areal::warmup",
                step = steps,
                loss = m.loss,
                validation_loss,
                validation_accuracy = m.validation_accuracy,
                "warm-up"
            );
            log.record("warmup", &m)?;
            log.warmup_point(
                shared.started.elapsed().as_secs_f64(),
                m.validation_accuracy,
            );
            shared.observer.on_warmup(&m);
            curve.push(m);
            (loss_sum, tokens, window) = (0.0, 0, Instant::now());
            let accuracy_improved = eval.accuracy >= best + w.min_delta;
            let loss_improved = validation_loss <= best_loss * (1.0 - w.min_loss_improvement);
            if eval.accuracy > best && can_snapshot {
                match policy.save(&best_dir) {
                    Ok(()) => best_step = steps,
                    Err(e) if e.is_unsupported() => can_snapshot = false,
                    Err(e) => {
                        return Err(EngineError::plugin("saving the best warm-up weights", e));
                    }
                }
            }
            best = best.max(eval.accuracy);
            best_loss = best_loss.min(validation_loss);
            if accuracy_improved || loss_improved {
                since_best = 0;
            } else {
                since_best += 1;
                if since_best >= w.patience {
                    plateau = true;
                    break;
                }
            }
        }
    }
    let last_step = curve.last().map_or(0, |m| m.step);
    if can_snapshot && best_step > 0 && best_step != last_step {
        policy
            .load(&best_dir)
            .map_err(|e| EngineError::plugin("restoring the best warm-up weights", e))?;
    } else {
        best_step = last_step;
    }
    let report = WarmupReport {
        steps,
        seconds: started.elapsed().as_secs_f64(),
        best_step,
        validation_accuracy: curve.last().map_or(0.0, |m| m.validation_accuracy),
        best_validation_accuracy: best.max(0.0),
        plateau,
        curve,
        cached: false,
    };
    // A cache is only a saving: failing to write one costs the next run time, not this run.
    if let Some(dir) = &cache
        && !interrupted
        && let Err(e) = warmup::write_cache(dir, policy, &report)
    {
        tracing::warn!(target: "areal::warmup", dir = %dir.display(), error = %e, "cannot cache the warm-up; the next run with these settings warms up again");
    }
    Ok(report)
}
