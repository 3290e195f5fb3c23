//! The sandbox's blocking entry points, on a tokio runtime of the calling thread's own.

/// Run `future` to completion on the current thread, on a tokio runtime of the thread's own
/// (the blocking entry points of the sandbox; not for use inside an async context).
pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("building a current-thread tokio runtime");
    }
    RUNTIME.with(|rt| rt.block_on(future))
}
