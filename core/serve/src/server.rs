//! What every server shares: the token guard, TLS, the HTTP/2 settings, the socket.

use std::net::SocketAddr;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::{Router, TcpIncoming};

use crate::fleet::{CONNECTION_WINDOW, STREAM_WINDOW};
use crate::security::{Listen, RequireToken, ServeError, bind};

/// `service`, refusing calls without `listen`'s token (when it has one).
pub(crate) fn guarded<S>(service: S, listen: &Listen) -> InterceptedService<S, RequireToken> {
    InterceptedService::new(service, RequireToken(listen.token.clone()))
}

/// Check `listen`, bind it and serve what `add` puts on a server until `shutdown` completes:
/// `listen`'s TLS if any, wide HTTP/2 windows, no Nagle delay. `on_bound` is told the address
/// actually bound (port 0 picks one) once the server accepts calls.
pub(crate) async fn serve_on(
    listen: &Listen,
    kind: &str,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
    add: impl FnOnce(&mut Server) -> Router,
) -> Result<(), ServeError> {
    let (listener, addr) = bind(listen).await?;
    let mut server = Server::builder()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    if let Some(tls) = &listen.tls {
        server = server
            .tls_config(tls.config())
            .map_err(|e| ServeError::Tls {
                message: format!("the certificate and key do not make a TLS identity: {e}"),
                source: None,
            })?;
    }
    let router = add(&mut server);
    tracing::info!(target: "areal::serve", %addr, "{kind} server listening");
    on_bound(addr);
    router
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
        .map_err(|source| ServeError::Transport { addr, source })
}
