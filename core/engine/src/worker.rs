//! The compute worker: the one owner of the policy, its optimizer and the reference copy.
//!
//! It runs on a thread of its own, inside the trainer's thread pool (`train.threads`; burn's
//! CPU backend computes on the current rayon pool), takes one [`Command`] at a time from a
//! channel and answers each on a one-shot channel of its own. It never waits on async work:
//! the run awaits its answers. What goes in and out is plain data (demonstrations, batches
//! of groups, weight updates, folders), the boundary a separate trainer process will keep.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use areal_sdk::{PluginError, PolicyVersion, TrajectoryGroup, WeightUpdate};
use areal_sdk_train::burn::optim::{AdamWConfig, ModuleOptimizer};
use areal_sdk_train::{Algorithm, Policy};
use tokio::sync::oneshot;

use crate::config::{Config, LagPolicy, TrainConfig};
use crate::error::EngineError;
use crate::trainer::sft::{self, Example};
use crate::trainer::{StepReport, TrainerSettings, train_step};

/// A step the worker trained.
pub(crate) struct Trained {
    /// The batch, handed back for the step's metrics.
    pub(crate) groups: Vec<TrajectoryGroup>,
    /// What the step did.
    pub(crate) report: StepReport,
    /// The new weights (version + 1).
    pub(crate) weights: WeightUpdate,
    /// Milliseconds of compute.
    pub(crate) train_ms: f64,
}

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// What the worker is asked to do.
enum Command {
    /// One supervised step on demonstrations: (loss sum, demonstration tokens).
    Sft {
        examples: Vec<Example>,
        reply: Reply<(f64, usize)>,
    },
    /// Mean negative logprob per demonstration token, without gradient.
    ValidationLoss {
        examples: Arc<Vec<Example>>,
        reply: Reply<f64>,
    },
    /// RL starts: copy the reference policy if the algorithm needs one, fresh optimizer.
    StartRl { reply: Reply<()> },
    /// One RL step on a batch trained with the weights at `version`.
    Train {
        groups: Vec<TrajectoryGroup>,
        version: PolicyVersion,
        reply: Reply<Trained>,
    },
    /// The current weights as `version`.
    Weights {
        version: PolicyVersion,
        reply: Reply<WeightUpdate>,
    },
    /// Save the policy into a folder.
    Save {
        dir: PathBuf,
        reply: oneshot::Sender<Result<(), PluginError>>,
    },
    /// Load the policy from a folder (on failure it is unchanged).
    Load {
        dir: PathBuf,
        reply: oneshot::Sender<Result<(), PluginError>>,
    },
    /// Save everything training changed (policy, optimizer, reference) into a folder.
    SaveState {
        dir: PathBuf,
        reply: Reply<TrainerState>,
    },
    /// Restore what `SaveState` wrote.
    LoadState {
        dir: PathBuf,
        saved: TrainerState,
        reply: Reply<()>,
    },
}

/// What a saved trainer state holds besides the policy's parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct TrainerState {
    /// The optimizer's state (there is none before the first step).
    pub(crate) optimizer: bool,
    /// The reference policy's parameters.
    pub(crate) reference: bool,
}

/// Folders of a saved trainer state.
pub(crate) const POLICY_DIR: &str = "policy";
pub(crate) const REFERENCE_DIR: &str = "reference";

/// The handle the run holds; dropping it ends the worker once its current command is done.
pub(crate) struct ComputeWorker {
    commands: crossbeam_channel::Sender<Command>,
}

/// What the worker owns and how it trains.
struct State {
    policy: Box<dyn Policy>,
    algorithm: Arc<dyn Algorithm>,
    reference: Option<Box<dyn Policy>>,
    optimizer: Option<ModuleOptimizer>,
    train: TrainConfig,
    warmup_lr: f64,
    settings: TrainerSettings,
}

impl ComputeWorker {
    /// Start the worker on `train.threads` threads of its own (0: the global pool).
    pub(crate) fn start(
        config: &Config,
        policy: Box<dyn Policy>,
        algorithm: Arc<dyn Algorithm>,
    ) -> Result<Self, EngineError> {
        let t = &config.train;
        let pool = match t.threads {
            0 => None,
            n => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("areal-train-{i}"))
                    .build()
                    .map_err(|e| {
                        EngineError::setup(format!("cannot start {n} trainer threads: {e}"))
                    })?,
            ),
        };
        let mut state = State {
            policy,
            algorithm,
            reference: None,
            optimizer: None,
            train: t.clone(),
            warmup_lr: config.warmup.lr,
            settings: TrainerSettings {
                lr: t.lr,
                max_grad_norm: max_grad_norm(t),
                minibatches: t.minibatches,
                token_budget: t.token_budget,
                min_microbatches: t.min_microbatches,
                temperature: config.rollout.temperature,
                withhold_past_lag: config
                    .rollout
                    .max_lag
                    .filter(|_| config.rollout.max_lag_policy == LagPolicy::Withhold),
            },
        };
        let (commands, inbox) = crossbeam_channel::unbounded::<Command>();
        std::thread::Builder::new()
            .name("areal-compute".into())
            .spawn(move || {
                let mut serve = || {
                    while let Ok(command) = inbox.recv() {
                        state.handle(command);
                    }
                };
                match pool {
                    Some(pool) => pool.install(serve),
                    None => serve(),
                }
            })
            .map_err(|e| EngineError::setup(format!("cannot start the compute thread: {e}")))?;
        Ok(Self { commands })
    }

    /// One supervised step: (loss summed over demonstration tokens, their number).
    pub(crate) async fn sft_step(
        &self,
        examples: Vec<Example>,
    ) -> Result<(f64, usize), EngineError> {
        self.ask(|reply| Command::Sft { examples, reply }).await?
    }

    /// The validation loss of `examples`.
    pub(crate) async fn validation_loss(
        &self,
        examples: Arc<Vec<Example>>,
    ) -> Result<f64, EngineError> {
        self.ask(|reply| Command::ValidationLoss { examples, reply })
            .await?
    }

    /// Prepare for RL: the reference copy (if the algorithm asks for one), a fresh optimizer.
    pub(crate) async fn start_rl(&self) -> Result<(), EngineError> {
        self.ask(|reply| Command::StartRl { reply }).await?
    }

    /// Train on a batch generated by weights up to `version`.
    pub(crate) async fn train(
        &self,
        groups: Vec<TrajectoryGroup>,
        version: PolicyVersion,
    ) -> Result<Trained, EngineError> {
        self.ask(|reply| Command::Train {
            groups,
            version,
            reply,
        })
        .await?
    }

    /// The current weights, labelled `version`.
    pub(crate) async fn weights(
        &self,
        version: PolicyVersion,
    ) -> Result<WeightUpdate, EngineError> {
        self.ask(|reply| Command::Weights { version, reply })
            .await?
    }

    /// Save the policy into `dir`.
    pub(crate) async fn save(&self, dir: PathBuf) -> Result<Result<(), PluginError>, EngineError> {
        self.ask(|reply| Command::Save { dir, reply }).await
    }

    /// Load the policy from `dir`; on failure it is left as it was.
    pub(crate) async fn load(&self, dir: PathBuf) -> Result<Result<(), PluginError>, EngineError> {
        self.ask(|reply| Command::Load { dir, reply }).await
    }

    /// Save the policy's parameters, the optimizer's state and the reference policy into
    /// `dir`, for an exact resume.
    pub(crate) async fn save_state(&self, dir: PathBuf) -> Result<TrainerState, EngineError> {
        self.ask(|reply| Command::SaveState { dir, reply }).await?
    }

    /// Restore what [`save_state`](Self::save_state) wrote into `dir` (`saved`: what it held).
    pub(crate) async fn load_state(
        &self,
        dir: PathBuf,
        saved: TrainerState,
    ) -> Result<(), EngineError> {
        self.ask(|reply| Command::LoadState { dir, saved, reply })
            .await?
    }

    async fn ask<T: Send + 'static>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).map_err(|_| gone())?;
        answer_of_thread(answer).await.ok_or_else(gone)
    }
}

/// The answer of work running on a thread outside the runtime, waited for on tokio's blocking
/// pool: while it is awaited, a paused clock (`tokio::time::pause`, current-thread runtime)
/// does not jump to its next timer as if every task were idle, so a run on a virtual clock
/// sees the thread's work take no virtual time instead of all the time until the next timer.
/// `None` when the thread dropped its end.
async fn answer_of_thread<T: Send + 'static>(answer: oneshot::Receiver<T>) -> Option<T> {
    tokio::task::spawn_blocking(move || answer.blocking_recv().ok())
        .await
        .ok()
        .flatten()
}

fn gone() -> EngineError {
    EngineError::internal(
        "the compute worker stopped (a plugin panicked while training; its message is above)",
    )
}

fn max_grad_norm(t: &TrainConfig) -> Option<f64> {
    (t.max_grad_norm > 0.0).then_some(t.max_grad_norm)
}

/// AdamW with the `[train]` section's betas and weight decay (the warm-up's and RL's).
fn adamw(t: &TrainConfig) -> ModuleOptimizer {
    AdamWConfig::new()
        .with_beta_1(t.beta1 as f32)
        .with_beta_2(t.beta2 as f32)
        .with_weight_decay(t.weight_decay as f32)
        .init()
}

/// The policy's current weights as version `version`, with its architecture.
pub(crate) fn weight_update(policy: &dyn Policy, version: PolicyVersion) -> WeightUpdate {
    policy.weight_update(version)
}

impl State {
    /// Do one command and answer it (an answer nobody waits for any more is dropped).
    fn handle(&mut self, command: Command) {
        match command {
            Command::Sft { examples, reply } => {
                let t = &self.train;
                let optimizer = self.optimizer.get_or_insert_with(|| adamw(t));
                let result = sft::sft_step(
                    self.policy.as_mut(),
                    optimizer,
                    &examples,
                    self.warmup_lr,
                    max_grad_norm(t),
                    t.token_budget,
                );
                crate::failpoint::hit("train");
                let _ = reply.send(result);
            }
            Command::ValidationLoss { examples, reply } => {
                let result =
                    sft::validation_loss(self.policy.as_ref(), &examples, self.train.token_budget);
                let _ = reply.send(result);
            }
            Command::StartRl { reply } => {
                let _ = reply.send(self.start_rl());
            }
            Command::Train {
                groups,
                version,
                reply,
            } => {
                let _ = reply.send(self.train(groups, version));
            }
            Command::Weights { version, reply } => {
                let _ = reply.send(Ok(weight_update(self.policy.as_ref(), version)));
            }
            Command::Save { dir, reply } => {
                let _ = reply.send(self.policy.save(&dir));
            }
            Command::Load { dir, reply } => {
                let _ = reply.send(self.policy.load(&dir));
            }
            Command::SaveState { dir, reply } => {
                let _ = reply.send(self.save_state(&dir));
            }
            Command::LoadState { dir, saved, reply } => {
                let _ = reply.send(self.load_state(&dir, saved));
            }
        }
    }

    fn save_state(&self, dir: &Path) -> Result<TrainerState, EngineError> {
        let saving =
            |what: &str, e| EngineError::plugin(format!("saving the {what} for resume"), e);
        let folder = |name: &str| {
            let path = dir.join(name);
            std::fs::create_dir_all(&path).map_err(|e| EngineError::io(&path, e))?;
            Ok::<_, EngineError>(path)
        };
        self.policy
            .save_state(self.optimizer.as_ref(), &folder(POLICY_DIR)?)
            .map_err(|e| saving("policy and optimizer", e))?;
        if let Some(reference) = &self.reference {
            reference
                .save_state(None, &folder(REFERENCE_DIR)?)
                .map_err(|e| saving("reference policy", e))?;
        }
        Ok(TrainerState {
            optimizer: self.optimizer.is_some(),
            reference: self.reference.is_some(),
        })
    }

    /// Restore a saved state; the reference policy, when there is one, must already exist
    /// (`StartRl` made it), and is overwritten.
    fn load_state(&mut self, dir: &Path, saved: TrainerState) -> Result<(), EngineError> {
        let loading = |what: &str, e| EngineError::plugin(format!("restoring the {what}"), e);
        if saved.reference {
            let Some(reference) = self.reference.as_mut() else {
                return Err(EngineError::resume(format!(
                    "{} holds a reference policy, but {} uses none",
                    dir.display(),
                    self.algorithm.name()
                )));
            };
            reference
                .load_state(None, &dir.join(REFERENCE_DIR))
                .map_err(|e| loading("reference policy", e))?;
        }
        let mut optimizer = saved.optimizer.then(|| adamw(&self.train));
        self.policy
            .load_state(optimizer.as_mut(), &dir.join(POLICY_DIR))
            .map_err(|e| loading("policy and optimizer", e))?;
        if optimizer.is_some() {
            self.optimizer = optimizer;
        }
        Ok(())
    }

    fn start_rl(&mut self) -> Result<(), EngineError> {
        self.policy
            .start_rl()
            .map_err(|e| EngineError::plugin("starting reinforcement learning", e))?;
        // The reference policy of a KL penalty: the weights RL starts from.
        if self.algorithm.requirements().reference {
            let reference = self.policy.snapshot().map_err(|e| {
                EngineError::plugin(
                    format!(
                        "copying the policy as the reference of {}",
                        self.algorithm.name()
                    ),
                    e,
                )
            })?;
            self.reference = Some(reference);
        }
        self.optimizer = Some(adamw(&self.train));
        Ok(())
    }

    fn train(
        &mut self,
        groups: Vec<TrajectoryGroup>,
        version: PolicyVersion,
    ) -> Result<Trained, EngineError> {
        let started = Instant::now();
        let t = &self.train;
        let optimizer = self.optimizer.get_or_insert_with(|| adamw(t));
        let report = train_step(
            self.policy.as_mut(),
            self.reference.as_deref(),
            optimizer,
            self.algorithm.as_ref(),
            &groups,
            version,
            &self.settings,
        )?;
        crate::failpoint::hit("train");
        let train_ms = started.elapsed().as_secs_f64() * 1e3;
        let weights = weight_update(self.policy.as_ref(), version + 1);
        Ok(Trained {
            groups,
            report,
            weights,
            train_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;
    use tokio::time::{Instant, sleep};

    use super::answer_of_thread;

    fn paused() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime")
    }

    /// Why the compute worker's answers are awaited on the blocking pool: awaited directly,
    /// a thread's answer lets a paused clock jump to the next timer (here an hour away, and
    /// the thread answers only once that timer has fired); awaited through
    /// `answer_of_thread`, no virtual time passes while the thread works.
    #[test]
    fn a_threads_work_takes_no_virtual_time_on_a_paused_clock() {
        paused().block_on(async {
            let start = Instant::now();
            let (fired, wait) = std::sync::mpsc::channel::<()>();
            let hour = tokio::spawn(async move {
                sleep(Duration::from_secs(3600)).await;
                fired.send(()).ok();
            });
            let (reply, answer) = oneshot::channel();
            std::thread::spawn(move || {
                wait.recv().ok();
                reply.send(7).ok();
            });
            assert_eq!(answer.await.ok(), Some(7));
            assert_eq!(start.elapsed(), Duration::from_secs(3600));
            hour.await.expect("the timer's task");
        });
        paused().block_on(async {
            let start = Instant::now();
            let hour = tokio::spawn(sleep(Duration::from_secs(3600)));
            let (reply, answer) = oneshot::channel();
            std::thread::spawn(move || {
                // real time, in which a directly awaited answer would let the clock jump
                std::thread::sleep(Duration::from_millis(50));
                reply.send(7).ok();
            });
            assert_eq!(answer_of_thread(answer).await, Some(7));
            assert_eq!(start.elapsed(), Duration::ZERO);
            assert!(!hour.is_finished());
            let (reply, answer) = oneshot::channel::<u32>();
            drop(reply);
            assert_eq!(answer_of_thread(answer).await, None);
        });
    }

    /// The compute worker through that path: its real work (here the bigram policy's) costs
    /// no virtual time, so a simulated device's cost is the only time a step takes.
    #[test]
    fn the_compute_workers_answers_take_no_virtual_time() {
        use areal_algo_ppo as _;
        use areal_sdk::{BuildContext, PluginConfig};
        use areal_sdk_train::AlgorithmPlugin;
        use areal_sdk_train::burn::tensor::Device;
        use areal_testkit::{BigramPolicy, BigramPolicyOptions};

        let options = BigramPolicyOptions {
            letters: 8,
            init_std: 0.5,
        };
        let policy = BigramPolicy::new(&options, 3, &Device::flex().autodiff());
        let config = crate::config::Config::default();
        let ppo = PluginConfig::new("algorithm", "ppo");
        let algorithm = AlgorithmPlugin::build_from(&ppo, &BuildContext::new(0, 1)).unwrap();
        paused().block_on(async {
            let worker = super::ComputeWorker::start(&config, Box::new(policy), algorithm).unwrap();
            let start = Instant::now();
            let hour = tokio::spawn(sleep(Duration::from_secs(3600)));
            worker.start_rl().await.unwrap();
            let weights = worker.weights(5).await.unwrap();
            assert_eq!(weights.version, 5);
            assert_eq!(start.elapsed(), Duration::ZERO);
            assert!(!hour.is_finished());
        });
    }
}
