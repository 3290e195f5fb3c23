//! The reward service: verifiers run on their own threads, off the generation path, each
//! sample under a deadline. A verifier that fails, panics or hangs costs that one sample.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use areal_sdk::{Reward, RewardInput, RewardVerifier, Verdict, VerifyContext};
use crossbeam_channel::{Receiver, Sender};
use tokio::sync::oneshot;

/// A verified sample with how long it waited in the queue and ran.
#[derive(Clone, Debug)]
pub struct Verified {
    /// The reward; failures of the verifier have a failure verdict (see
    /// [`Verdict::is_failure`]).
    pub reward: Reward,
    /// Time from submission to result (queueing included).
    pub latency: Duration,
}

/// A reward, or the failure verdict and what went wrong.
type JobResult = Result<Reward, (Verdict, String)>;

struct Job {
    input: RewardInput,
    started: oneshot::Sender<()>,
    done: oneshot::Sender<JobResult>,
}

struct Shared {
    verifier: Arc<dyn RewardVerifier>,
    jobs: Receiver<Job>,
    deadline: Duration,
    target: usize,
    live: AtomicUsize,
    abandoned: AtomicUsize,
}

/// A pool of verifier threads.
pub struct RewardService {
    shared: Arc<Shared>,
    submit: Sender<Job>,
}

impl RewardService {
    /// Start `threads` threads running `verifier` with a per-sample `deadline`.
    pub fn new(verifier: Arc<dyn RewardVerifier>, threads: usize, deadline: Duration) -> Self {
        let (submit, jobs) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared {
            verifier,
            jobs,
            deadline,
            target: threads.max(1),
            live: AtomicUsize::new(0),
            abandoned: AtomicUsize::new(0),
        });
        for _ in 0..shared.target {
            spawn_worker(&shared);
        }
        Self { shared, submit }
    }

    /// Threads alive now (more than configured while abandoned ones are still stuck).
    pub fn live_threads(&self) -> usize {
        self.shared.live.load(Ordering::SeqCst)
    }

    /// Verifications abandoned at their deadline so far.
    pub fn abandoned(&self) -> usize {
        self.shared.abandoned.load(Ordering::SeqCst)
    }

    /// Verify one sample. Never fails: a failed, crashed or late verifier yields a reward
    /// with verdict `error`, `verifier_crashed` or `verifier_timeout`.
    pub async fn verify(&self, input: RewardInput) -> Verified {
        let submitted = Instant::now();
        let (started_tx, started_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let job = Job {
            input,
            started: started_tx,
            done: done_tx,
        };
        let name = self.shared.verifier.name().to_owned();
        let failure = |verdict: Verdict, message: String| {
            let mut reward = Reward::new(0.0, verdict).with_detail("error", message);
            reward.provenance.verifier = name.clone();
            reward
        };
        if self.submit.send(job).is_err() {
            return Verified {
                reward: failure(Verdict::Error, "reward service is shut down".into()),
                latency: submitted.elapsed(),
            };
        }
        // Queueing does not count against the deadline; running does.
        if started_rx.await.is_err() {
            return Verified {
                reward: failure(Verdict::Error, "reward worker exited".into()),
                latency: submitted.elapsed(),
            };
        }
        let reward = match tokio::time::timeout(self.shared.deadline, done_rx).await {
            Ok(Ok(Ok(reward))) => reward,
            Ok(Ok(Err((verdict, message)))) => failure(verdict, message),
            Ok(Err(_)) => failure(Verdict::VerifierCrashed, "reward worker died".into()),
            Err(_) => {
                self.shared.abandoned.fetch_add(1, Ordering::SeqCst);
                // The stuck thread cannot be stopped; keep the pool at strength beside it.
                spawn_worker(&self.shared);
                tracing::warn!(
                    target: "areal::reward",
                    verifier = %name,
                    deadline_ms = self.shared.deadline.as_millis() as u64,
                    "verifier missed its deadline; sample dropped"
                );
                failure(
                    Verdict::VerifierTimeout,
                    format!("no answer within {} ms", self.shared.deadline.as_millis()),
                )
            }
        };
        Verified {
            reward,
            latency: submitted.elapsed(),
        }
    }
}

fn spawn_worker(shared: &Arc<Shared>) {
    shared.live.fetch_add(1, Ordering::SeqCst);
    let shared = shared.clone();
    std::thread::Builder::new()
        .name("areal-reward".into())
        .spawn(move || worker(&shared))
        .expect("spawn a reward thread");
}

fn worker(shared: &Shared) {
    while let Ok(job) = shared.jobs.recv() {
        if job.started.send(()).is_err() {
            continue; // the caller is gone
        }
        let ctx = VerifyContext::with_timeout(shared.deadline);
        let start = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            shared.verifier.verify(&job.input, &ctx)
        }));
        let wall_ms = start.elapsed().as_secs_f64() * 1e3;
        let result = match outcome {
            Ok(Ok(mut reward)) => {
                reward.provenance.verifier = shared.verifier.name().to_owned();
                reward.provenance.wall_ms = wall_ms;
                if reward.value.is_finite() {
                    Ok(reward)
                } else {
                    Err((
                        Verdict::Error,
                        format!("verifier returned reward {}", reward.value),
                    ))
                }
            }
            Ok(Err(e)) => Err((Verdict::Error, e.to_string())),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panic".into());
                Err((
                    Verdict::VerifierCrashed,
                    format!("verifier panicked: {message}"),
                ))
            }
        };
        let _ = job.done.send(result);
        // Retire if replacements made the pool larger than configured.
        let mut live = shared.live.load(Ordering::SeqCst);
        while live > shared.target {
            match shared
                .live
                .compare_exchange(live, live - 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return,
                Err(now) => live = now,
            }
        }
    }
    shared.live.fetch_sub(1, Ordering::SeqCst);
}
