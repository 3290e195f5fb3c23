//! Many sandboxes on parallel threads.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::sandbox::Sandbox;

type Job = Box<dyn FnOnce(&Sandbox) + Send>;

/// A fixed set of worker threads sharing one [`Sandbox`]. Each job runs on one worker, so at
/// most `threads` guests run at once; guests never share a store.
pub struct Pool {
    sandbox: Arc<Sandbox>,
    jobs: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.workers.len())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool of `threads` workers, at least one and at most the sandbox's 64 instance slots.
    pub fn new(sandbox: Arc<Sandbox>, threads: usize) -> Self {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let threads = threads.clamp(1, crate::run::MAX_CONCURRENT_RUNS as usize);
        let workers = (0..threads)
            .map(|i| {
                let rx = rx.clone();
                let sandbox = Arc::clone(&sandbox);
                std::thread::Builder::new()
                    .name(format!("areal-sandbox-{i}"))
                    .spawn(move || {
                        for job in rx {
                            job(&sandbox);
                        }
                    })
                    .expect("spawning a sandbox worker")
            })
            .collect();
        Self {
            sandbox,
            jobs: Some(tx),
            workers,
        }
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// The shared sandbox.
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// Queue `job` for the next free worker; its result arrives on the returned channel (which
    /// disconnects without a value if the job panicked).
    pub fn submit<R, F>(&self, job: F) -> Receiver<R>
    where
        R: Send + 'static,
        F: FnOnce(&Sandbox) -> R + Send + 'static,
    {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let job: Job = Box::new(move |sandbox| {
            let _ = tx.send(job(sandbox));
        });
        self.jobs
            .as_ref()
            .expect("pool is open until dropped")
            .send(job)
            .expect("sandbox workers live as long as the pool");
        rx
    }

    /// Run `jobs` on the pool and return their results in the same order.
    pub fn map<T, R, F>(&self, items: Vec<T>, job: F) -> Vec<Option<R>>
    where
        T: Send + 'static,
        R: Send + 'static,
        F: Fn(&Sandbox, T) -> R + Send + Sync + 'static,
    {
        let job = Arc::new(job);
        let pending: Vec<_> = items
            .into_iter()
            .map(|item| {
                let job = Arc::clone(&job);
                self.submit(move |sb| job(sb, item))
            })
            .collect();
        pending.into_iter().map(|rx| rx.recv().ok()).collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.jobs.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
