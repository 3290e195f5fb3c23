//! What the generator-server tests share: a server on a thread and runtime of its own, the
//! testkit policy whose weights they load, a request, and a wait.

use std::fmt::Debug;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use areal_sdk::{GenerateRequest, SamplingParams};
use areal_sdk_train::burn::tensor::Device;
use areal_serve::Listen;
use areal_testkit::{BigramPolicy, BigramPolicyOptions};

/// The bigram policy (8 letters) whose weights the servers load.
pub(crate) fn policy() -> BigramPolicy {
    let options = BigramPolicyOptions {
        letters: 8,
        init_std: 1.0,
    };
    BigramPolicy::new(&options, 11, &Device::flex().autodiff())
}

/// A sampled request of `max_new_tokens` after the prompt `[2]`, without stop tokens.
pub(crate) fn request(sample_id: u64, max_new_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        sample_id,
        input_ids: vec![2],
        max_new_tokens,
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            seed: 5,
        },
        stop_token_ids: vec![],
    }
}

/// Wait (up to 10 s) until `check` holds.
pub(crate) async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server on its own thread and runtime (one worker). Dropped, it is killed: its runtime
/// goes at once, connections and work in flight with it (as SIGKILL would).
pub(crate) struct ServerThread {
    pub(crate) addr: SocketAddr,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Where a server says it is bound.
pub(crate) type OnBound = Box<dyn FnOnce(SocketAddr) + Send>;

impl ServerThread {
    /// Run `serve(listen, on_bound)` on a thread of its own; returns once it is bound.
    pub(crate) fn start<F, Fut, E>(listen: Listen, serve: F) -> Self
    where
        F: FnOnce(Listen, OnBound) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>>,
        E: Debug,
    {
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let on_bound: OnBound = Box::new(move |addr| bound_tx.send(addr).unwrap());
            runtime.block_on(async move {
                tokio::select! {
                    served = serve(listen, on_bound) => served.unwrap(),
                    _ = killed => {}
                }
            });
            runtime.shutdown_background();
        });
        let addr = bound_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the server binds");
        Self {
            addr,
            kill: Some(kill),
            thread: Some(thread),
        }
    }

    /// Its `http://` address.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
