//! The reward service: verifiers run on their own threads, off the generation path, each
//! sample under a deadline. A verifier that fails, panics or hangs costs that one sample.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use areal_sdk::{Reward, RewardInput, RewardVerifier, Verdict, VerifyContext};
use crossbeam_channel::{Receiver, Sender};
use tokio::sync::oneshot;

use crate::config::RewardServiceConfig;
use crate::reward_cache::{Flight, RewardCache};

/// A verified sample with how long it waited in the queue and ran.
#[derive(Clone, Debug)]
pub struct Verified {
    /// The reward; failures of the verifier have a failure verdict (see
    /// [`Verdict::is_failure`]).
    pub reward: Reward,
    /// Time from submission to result (queueing included).
    pub latency: Duration,
    /// Whether the reward came from the reward cache.
    pub cached: bool,
}

/// A reward, or the failure verdict and what went wrong (with the verification's wall time).
type JobResult = Result<Reward, Failure>;

/// A verification that gave no reward.
struct Failure {
    verdict: Verdict,
    message: String,
    wall_ms: f64,
}

impl Failure {
    /// The reward this failure gives, as `verifier`'s: zero, its verdict, the message.
    fn reward(self, verifier: &str) -> Reward {
        let mut reward = Reward::new(0.0, self.verdict).with_detail("error", self.message);
        reward.provenance.verifier = verifier.to_owned();
        reward.provenance.wall_ms = self.wall_ms;
        reward
    }
}

/// Who finished first: the verifier or the deadline.
const RUNNING: u8 = 0;
const DONE: u8 = 1;
const ABANDONED: u8 = 2;

struct Job {
    input: RewardInput,
    deadline: Duration,
    started: oneshot::Sender<()>,
    done: oneshot::Sender<JobResult>,
    state: Arc<AtomicU8>,
}

/// What the verifier threads share: the verifier, the queue of jobs, and the count of threads
/// alive and abandoned (a thread stuck past its deadline is abandoned and replaced).
struct ThreadPool {
    verifier: Arc<dyn RewardVerifier>,
    jobs: Receiver<Job>,
    deadline: Duration,
    live: AtomicUsize,
    abandoned: AtomicUsize,
}

/// A pool of verifier threads, with an optional reward cache in front.
pub struct RewardService {
    pool: Arc<ThreadPool>,
    submit: Sender<Job>,
    cache: Option<Arc<RewardCache>>,
}

impl RewardService {
    /// Start `threads` threads running `verifier` with a per-sample `deadline`.
    pub fn new(verifier: Arc<dyn RewardVerifier>, threads: usize, deadline: Duration) -> Self {
        let (submit, jobs) = crossbeam_channel::unbounded();
        let pool = Arc::new(ThreadPool {
            verifier,
            jobs,
            deadline,
            live: AtomicUsize::new(0),
            abandoned: AtomicUsize::new(0),
        });
        for _ in 0..threads.max(1) {
            spawn_worker(&pool);
        }
        Self {
            pool,
            submit,
            cache: None,
        }
    }

    /// The service `config` asks for: its threads (for a verifier without an async path), its
    /// deadline and, with `cache = true`, a
    /// reward cache for a verifier that has a
    /// [`cache_identity`](RewardVerifier::cache_identity), kept in `cache_dir` across runs
    /// when that is set. A cache folder that cannot be used is a warning and the cache then
    /// lasts the run: the cache saves time, it never stops a run.
    pub fn from_config(verifier: Arc<dyn RewardVerifier>, config: &RewardServiceConfig) -> Self {
        let cache = match (config.cache, verifier.cache_identity()) {
            (true, Some(identity)) => {
                let dir = (!config.cache_dir.is_empty())
                    .then(|| crate::config::cache_path(&config.cache_dir));
                let cache = RewardCache::new(verifier.name(), &identity, dir.as_deref()).or_else(|e| {
                    tracing::warn!(
                        target: "areal::reward",
                        "reward_service.cache_dir {:?}: {e}; rewards are cached for this run only",
                        config.cache_dir
                    );
                    RewardCache::new(verifier.name(), &identity, None)
                });
                cache.ok().map(Arc::new)
            }
            (true, None) => {
                tracing::warn!(
                    target: "areal::reward",
                    verifier = verifier.name(),
                    "reward_service.cache is set, but this verifier names no cache identity: nothing is cached"
                );
                None
            }
            (false, _) => None,
        };
        let mut service = Self::new(
            verifier,
            config.threads,
            Duration::from_millis(config.deadline_ms),
        );
        service.cache = cache;
        service
    }

    /// The reward cache, when there is one.
    pub fn cache(&self) -> Option<&Arc<RewardCache>> {
        self.cache.as_ref()
    }

    /// The verifier the threads run.
    pub fn verifier(&self) -> &Arc<dyn RewardVerifier> {
        &self.pool.verifier
    }

    /// Threads alive now: the configured number plus those still stuck in abandoned
    /// verifications.
    pub fn live_threads(&self) -> usize {
        self.pool.live.load(Ordering::SeqCst)
    }

    /// Verifications abandoned at their deadline so far.
    pub fn abandoned(&self) -> usize {
        self.pool.abandoned.load(Ordering::SeqCst)
    }

    /// Verify one sample. Never fails: a failed, crashed or late verifier yields a reward
    /// with verdict `error`, `verifier_crashed` or `verifier_timeout`.
    pub async fn verify(&self, input: RewardInput) -> Verified {
        self.verify_within(input, self.pool.deadline).await
    }

    /// [`RewardService::verify`] with a deadline of its own (a remote client's, say).
    pub async fn verify_within(&self, input: RewardInput, deadline: Duration) -> Verified {
        let submitted = Instant::now();
        let Some(cache) = &self.cache else {
            return self.verify_uncached(input, deadline, submitted).await;
        };
        let key = cache.key(&input);
        if let Some(reward) = cache.get(&key) {
            return Verified {
                reward,
                latency: submitted.elapsed(),
                cached: true,
            };
        }
        let lead = match cache.join(key) {
            Flight::Lead(lead) => lead,
            Flight::Follow(rx) => match rx.await {
                Ok(reward) => {
                    cache.count_hit();
                    return Verified {
                        reward,
                        latency: submitted.elapsed(),
                        cached: true,
                    };
                }
                // The leader failed: this sample is verified on its own.
                Err(_) => return self.verify_uncached(input, deadline, submitted).await,
            },
        };
        let verified = self.verify_uncached(input, deadline, submitted).await;
        lead.finish(&verified.reward);
        verified
    }

    async fn verify_uncached(
        &self,
        input: RewardInput,
        deadline: Duration,
        submitted: Instant,
    ) -> Verified {
        if let Some(verifier) = self.pool.verifier.as_async() {
            return self
                .verify_awaited(verifier, input, deadline, submitted)
                .await;
        }
        let (started_tx, started_rx) = oneshot::channel();
        let (done_tx, mut done_rx) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(RUNNING));
        let job = Job {
            input,
            deadline,
            started: started_tx,
            done: done_tx,
            state: state.clone(),
        };
        let name = self.pool.verifier.name().to_owned();
        let failure = |verdict: Verdict, message: String| {
            let wall_ms = 0.0;
            Failure {
                verdict,
                message,
                wall_ms,
            }
            .reward(&name)
        };
        if self.submit.send(job).is_err() {
            return Verified {
                reward: failure(Verdict::Error, "reward service is shut down".into()),
                latency: submitted.elapsed(),
                cached: false,
            };
        }
        // Queueing does not count against the deadline; running does.
        if started_rx.await.is_err() {
            return Verified {
                reward: failure(Verdict::Error, "reward worker exited".into()),
                latency: submitted.elapsed(),
                cached: false,
            };
        }
        let outcome =
            match tokio::time::timeout(deadline + abandon_grace(deadline), &mut done_rx).await {
                Ok(received) => Some(received),
                // The verifier may have finished just now; only one side wins the job.
                Err(_)
                    if state
                        .compare_exchange(RUNNING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst)
                        .is_err() =>
                {
                    Some(done_rx.await)
                }
                Err(_) => None,
            };
        let reward = match outcome {
            Some(Ok(Ok(reward))) => reward,
            Some(Ok(Err(f))) => f.reward(&name),
            Some(Err(_)) => failure(Verdict::VerifierCrashed, "reward worker died".into()),
            None => {
                self.pool.abandoned.fetch_add(1, Ordering::SeqCst);
                // The stuck thread cannot be stopped: a replacement keeps the pool at strength,
                // and the stuck one exits if it ever returns.
                spawn_worker(&self.pool);
                tracing::warn!(
                    target: "areal::reward",
                    verifier = %name,
                    deadline_ms = deadline.as_millis() as u64,
                    "verifier missed its deadline; sample dropped"
                );
                failure(
                    Verdict::VerifierTimeout,
                    format!("no answer within {} ms", deadline.as_millis()),
                )
            }
        };
        Verified {
            reward,
            latency: submitted.elapsed(),
            cached: false,
        }
    }
}

impl RewardService {
    /// Verify `input` on the verifier's async path: awaited here, holding no thread, any
    /// number in flight; it bounds its own time.
    async fn verify_awaited(
        &self,
        verifier: &dyn areal_sdk::AsyncVerifier,
        input: RewardInput,
        deadline: Duration,
        submitted: Instant,
    ) -> Verified {
        use futures_util::FutureExt;
        let ctx = VerifyContext::with_timeout(deadline);
        let start = Instant::now();
        let outcome = AssertUnwindSafe(verifier.verify(&input, &ctx))
            .catch_unwind()
            .await;
        let reward = match judge(self.pool.verifier.as_ref(), outcome, start.elapsed()) {
            Ok(reward) => reward,
            Err(f) => f.reward(self.pool.verifier.name()),
        };
        Verified {
            reward,
            latency: submitted.elapsed(),
            cached: false,
        }
    }
}

/// How long past a sample's deadline the service still waits for its verifier before it
/// abandons it: a quarter of the deadline, at most a second. The verifier is told the
/// deadline itself (`VerifyContext`), so one that stops there (the `lcb` reward ends a
/// program's test at it, with that program's `time_limit`) always answers first, and what
/// a program does can never turn into a `verifier_timeout`, which training drops unpenalised.
fn abandon_grace(deadline: Duration) -> Duration {
    (deadline / 4).min(Duration::from_secs(1))
}

fn spawn_worker(pool: &Arc<ThreadPool>) {
    pool.live.fetch_add(1, Ordering::SeqCst);
    let pool = pool.clone();
    std::thread::Builder::new()
        .name("areal-reward".into())
        .spawn(move || worker(&pool))
        .expect("spawn a reward thread");
}

fn worker(pool: &ThreadPool) {
    while let Ok(job) = pool.jobs.recv() {
        if job.started.send(()).is_err() {
            continue; // the caller is gone
        }
        let ctx = VerifyContext::with_timeout(job.deadline);
        let start = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| pool.verifier.verify(&job.input, &ctx)));
        let result = judge(pool.verifier.as_ref(), outcome, start.elapsed());
        let _ = job.done.send(result);
        if job
            .state
            .compare_exchange(RUNNING, DONE, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            // This verification was abandoned at its deadline and a replacement took this
            // thread's place.
            break;
        }
    }
    pool.live.fetch_sub(1, Ordering::SeqCst);
}

/// What a verification that returned `outcome` (or panicked) after `took` gives: the reward
/// with its provenance, or the failure verdict.
fn judge(
    verifier: &dyn RewardVerifier,
    outcome: std::thread::Result<Result<Reward, areal_sdk::PluginError>>,
    took: Duration,
) -> JobResult {
    let wall_ms = took.as_secs_f64() * 1e3;
    match outcome {
        Ok(Ok(mut reward)) => {
            reward.provenance.verifier = verifier.name().to_owned();
            reward.provenance.wall_ms = wall_ms;
            match Reward::check_value(reward.value) {
                Ok(()) => Ok(reward),
                Err(why) => Err(Failure {
                    verdict: Verdict::Error,
                    message: format!("verifier {} returned {why}", verifier.name()),
                    wall_ms,
                }),
            }
        }
        Ok(Err(e)) => Err(Failure {
            verdict: Verdict::Error,
            message: crate::error::chain(&e),
            wall_ms,
        }),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panic".into());
            Err(Failure {
                verdict: Verdict::VerifierCrashed,
                message: format!("verifier panicked: {message}"),
                wall_ms,
            })
        }
    }
}
