//! What every server shares: the token guard, TLS, the HTTP/2 settings, the socket, and the
//! bounds on connections.
//!
//! A peer gets no resource for free and keeps none for ever:
//! - a connection that sends nothing within [`FIRST_BYTES`] is closed before any protocol
//!   handles it (under a limit of 256 descriptors, silent sockets would lock every other
//!   client out);
//! - gRPC connections are pinged every [`KEEPALIVE`] and closed when a ping goes unanswered;
//!   HTTP connections serve one request each, whose headers must arrive within
//!   [`HEADER_READ`] and whose body within [`BODY_READ`];
//! - on SIGTERM or SIGINT the server stops accepting, lets the calls in progress finish for
//!   [`SHUTDOWN_GRACE`], then closes whatever is left (a silent socket, a stalled weight
//!   stream, a half-sent body): shutdown ends within a bound, whatever clients do.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::Router;

use crate::fleet::{CONNECTION_WINDOW, PENDING_ACCEPT_RESETS, STREAM_WINDOW};
use crate::security::{Listen, RequireToken, ServeError, bind};

/// How long a new connection may stay silent before it is closed unread.
pub(crate) const FIRST_BYTES: Duration = Duration::from_secs(10);
/// How often an idle gRPC connection is pinged (and how long the answer may take).
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(20);
/// How long the headers of an HTTP request may take to arrive.
pub(crate) const HEADER_READ: Duration = Duration::from_secs(10);
/// How long the body of an HTTP request may take to arrive.
pub(crate) const BODY_READ: Duration = Duration::from_secs(10);
/// How long calls in progress may go on after a shutdown signal.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// `service`, refusing calls without `listen`'s token (when it has one).
pub(crate) fn guarded<S>(service: S, listen: &Listen) -> InterceptedService<S, RequireToken> {
    InterceptedService::new(service, RequireToken(listen.token.clone()))
}

/// The connections `listener` accepts that send something within [`FIRST_BYTES`], without
/// Nagle's delay; the silent ones are closed. Accepting stops when the stream is dropped.
fn speaking(
    listener: TcpListener,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<TcpStream>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // out of descriptors, say: wait a little rather than spin
                    tracing::warn!(target: "areal::serve", error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                if let Ok(Ok(1)) = tokio::time::timeout(FIRST_BYTES, stream.peek(&mut first)).await
                {
                    let _ = stream.set_nodelay(true);
                    let _ = tx.send(Ok(stream)).await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Run `serve` until it ends or `shutdown` completes; then `drain` tells it to stop taking
/// calls, and it has [`SHUTDOWN_GRACE`] to finish those in progress before it is dropped with
/// whatever connections are left.
async fn bounded<T>(
    serve: impl Future<Output = T>,
    shutdown: impl Future<Output = ()>,
    drain: tokio::sync::watch::Sender<bool>,
    what: &str,
) -> Option<T> {
    tokio::pin!(serve);
    tokio::select! {
        done = &mut serve => return Some(done),
        () = shutdown => {}
    }
    let _ = drain.send(true);
    match tokio::time::timeout(SHUTDOWN_GRACE, serve).await {
        Ok(done) => Some(done),
        Err(_) => {
            tracing::warn!(target: "areal::serve", "{what}: connections still open {} s after the shutdown signal: closed", SHUTDOWN_GRACE.as_secs());
            None
        }
    }
}

/// Wait until `drain` says stop.
async fn drained(mut drain: tokio::sync::watch::Receiver<bool>) {
    let _ = drain.wait_for(|&stop| stop).await;
}

/// Check `listen`, bind it and serve what `add` puts on a server until `shutdown` completes:
/// `listen`'s TLS if any, wide HTTP/2 windows, no Nagle delay, the bounds of this module.
/// `on_bound` is told the address actually bound (port 0 picks one) once the server accepts
/// calls.
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
        .initial_connection_window_size(CONNECTION_WINDOW)
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE))
        .http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS));
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
    let (drain, stop) = tokio::sync::watch::channel(false);
    let serve = router.serve_with_incoming_shutdown(speaking(listener), drained(stop));
    match bounded(serve, shutdown, drain, kind).await {
        Some(done) => done.map_err(|source| ServeError::Transport { addr, source }),
        None => Ok(()),
    }
}

/// Serve `app` over HTTP/1.1 on `listener` until `shutdown` completes, over TLS with `tls` if
/// given, with the bounds of this module: the TLS handshake and then the request's headers
/// each within [`HEADER_READ`], one request per connection (its body is bounded by
/// [`bounded_body`], which `app` must have as a layer).
pub(crate) async fn serve_http(
    listener: TcpListener,
    app: axum::Router,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) {
    use hyper_util::rt::TokioIo;
    let (drain, stop) = tokio::sync::watch::channel(false);
    let accept = async {
        let mut connections = tokio::task::JoinSet::new();
        let mut incoming = speaking(listener);
        loop {
            let stream = tokio::select! {
                next = tokio_stream::StreamExt::next(&mut incoming) => match next {
                    Some(Ok(stream)) => stream,
                    _ => break,
                },
                () = drained(stop.clone()) => break,
            };
            // reap what has ended
            while connections.try_join_next().is_some() {}
            let service = hyper_util::service::TowerToHyperService::new(app.clone());
            let stop = stop.clone();
            let tls = tls.clone();
            connections.spawn(async move {
                match tls {
                    None => serve_connection(TokioIo::new(stream), service, stop).await,
                    Some(tls) => {
                        let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
                        match tokio::time::timeout(HEADER_READ, handshake).await {
                            Ok(Ok(stream)) => {
                                serve_connection(TokioIo::new(stream), service, stop).await;
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(target: "areal::serve", error = %e, "TLS handshake failed");
                            }
                            Err(_) => {}
                        }
                    }
                }
            });
        }
        // stop accepting; the calls in progress finish (bounded by the caller)
        while connections.join_next().await.is_some() {}
    };
    bounded(accept, shutdown, drain, "HTTP").await;
}

/// Serve one HTTP/1.1 request on `io`, its headers within [`HEADER_READ`]; when `stop` says,
/// finish it and close.
async fn serve_connection<I, S>(io: I, service: S, stop: tokio::sync::watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming> + Send,
    S::Future: Send + 'static,
    S::ResBody: Send + 'static,
    <S::ResBody as hyper::body::Body>::Data: Send,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ)
        .keep_alive(false);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        () = drained(stop) => {}
    }
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}

/// An error answer of the HTTP servers: its status, and a body in the shape SGLang's and
/// vLLM's servers both use (`{"object": "error", "message", "type", "code"}`).
pub(crate) struct ErrorBody(
    pub(crate) axum::http::StatusCode,
    pub(crate) serde_json::Value,
);

impl axum::response::IntoResponse for ErrorBody {
    fn into_response(self) -> axum::response::Response {
        (self.0, axum::Json(self.1)).into_response()
    }
}

/// The error answer `status` with `message`.
pub(crate) fn refuse(status: axum::http::StatusCode, message: impl Into<String>) -> ErrorBody {
    ErrorBody(
        status,
        serde_json::json!({
            "object": "error",
            "message": message.into(),
            "type": status.canonical_reason().unwrap_or("error"),
            "code": status.as_u16(),
        }),
    )
}

/// The most an HTTP request's body may hold: 2 MiB, axum's own default for the handlers'
/// `Bytes` (a prompt of some 300 000 token ids as JSON).
pub(crate) const MAX_BODY: usize = 2 << 20;

/// Middleware: the request's body read whole before the handler runs, within [`MAX_BODY`]
/// (413 past it) and [`BODY_READ`] (408 after it): a half-sent body is given up on, not
/// waited for, and no handler ever waits on the client.
pub(crate) async fn bounded_body(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(BODY_READ, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => {
            let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
            next.run(request).await
        }
        Ok(Err(e)) => refuse(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request's body cannot be read within {} MiB: {e}",
                MAX_BODY >> 20
            ),
        )
        .into_response(),
        Err(_) => refuse(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request's body did not arrive within {} s",
                BODY_READ.as_secs()
            ),
        )
        .into_response(),
    }
}
