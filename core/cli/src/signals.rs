//! What SIGINT and SIGTERM do to a run: stop it cleanly, or at once the second time.

/// SIGINT or SIGTERM stop the run cleanly (the step in progress finishes, the checkpoint and
/// summary are written); a second one exits at once. The handlers are installed when this is
/// called (inside the runtime), not when the returned future first runs, so a signal sent as
/// soon as the run starts is already caught.
#[cfg(unix)]
pub(crate) fn stop_on_signals(
    stop: areal_core::StopRequest,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        let (Ok(mut interrupt), Ok(mut terminate)) = handlers else {
            return;
        };
        let mut received = 0;
        loop {
            let name = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            received += 1;
            #[allow(clippy::print_stderr, reason = "messages for the user, on stderr")]
            if received == 1 {
                eprintln!(
                    "{name}: stopping after the step in progress, then saving the checkpoint and summary (again to quit at once)"
                );
                stop.request();
            } else {
                eprintln!("{name} again: quitting at once");
                std::process::exit(130);
            }
        }
    }
}

/// Ctrl-C stops the run cleanly; a second one exits at once.
#[cfg(not(unix))]
pub(crate) fn stop_on_signals(
    stop: areal_core::StopRequest,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.request();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    }
}
