//! A server on a thread and runtime of its own, for the tests of every server kind, and how
//! those tests read errors.

use std::fmt::Debug;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use areal_serve::Listen;

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

/// An error with its causes, on one line, as `areal` prints it.
pub(crate) trait Chained {
    fn chained(&self) -> String;
}

impl<E: std::error::Error> Chained for E {
    fn chained(&self) -> String {
        areal_core::chain(self)
    }
}

/// A client of `kind` (`remote`, `sglang`, `vllm`) to `endpoints` with short timeouts, and
/// `extra` options over them.
#[allow(dead_code, reason = "not every test file is a generator client")]
pub(crate) fn fleet(
    kind: &str,
    endpoints: Vec<String>,
    extra: serde_json::Value,
) -> areal_serve::GeneratorFleet {
    let mut options = serde_json::json!({
        "endpoints": endpoints,
        "connect_timeout_s": 2.0,
        "probe_interval_s": 0.05,
        "grace_s": 10.0,
    });
    options
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let options: areal_serve::GeneratorFleetOptions = serde_json::from_value(options).unwrap();
    areal_serve::GeneratorFleet::new(kind, &options, None).unwrap()
}

/// An option error's key and its message with its causes.
#[allow(dead_code, reason = "not every test file refuses options")]
pub(crate) fn explained(e: areal_serve::OptionError) -> (&'static str, String) {
    (e.key, areal_core::chain(&e))
}

/// Wait (up to 60 s: a guard against never, not a measure of speed) until `check` holds.
#[allow(dead_code, reason = "not every test file waits")]
pub(crate) async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The route where a server of `api` reports the weight version it holds.
#[allow(dead_code, reason = "not every test file asks an inference API")]
pub(crate) fn weight_version_route(api: areal_serve::InferenceApi) -> &'static str {
    match api {
        areal_serve::InferenceApi::Sglang => "get_weight_version",
        areal_serve::InferenceApi::Vllm => "weight_info",
    }
}
