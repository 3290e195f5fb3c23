//! JSON over HTTP/1.1 for the clients of inference servers: hyper's pooled client, over
//! rustls for `https://` endpoints (trusting the `tls_ca_file` authority, as gRPC clients do),
//! a time limit on every call, and each failure sorted as the fleet takes it (the server is
//! gone or broken: [`CallError::Fault`]; it answered no: [`CallError::Refused`]).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::fleet::{CallError, Connect};
use crate::inference_api::error_message;

/// The most of one answer this client reads (64 MiB): a generation of 100 000 tokens with
/// its logprobs is a few MiB.
pub(crate) const MAX_ANSWER_BYTES: usize = 64 << 20;

/// A client of JSON APIs.
#[derive(Clone)]
pub(crate) struct HttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `Authorization: Bearer ...` on every call, when set.
    bearer: Option<String>,
}

impl HttpClient {
    /// A client connecting as `connect` says; must be built inside a runtime.
    pub(crate) fn new(connect: &Connect, api_key: Option<&str>) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.set_connect_timeout(Some(connect.timeout));
        tcp.set_nodelay(true);
        tcp.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(connect.http_tls())
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self {
            client,
            bearer: api_key.map(|k| format!("Bearer {k}")),
        }
    }

    /// `method url` with `body` as JSON, within `timeout`; the answer's body parsed as `T`.
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: &str,
        body: Option<&(impl Serialize + Sync)>,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let bytes = self.call_raw(method, url, body, timeout).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            CallError::Refused(format!(
                "{} answered what this client cannot read ({e}): {}",
                crate::fleet::redacted(url),
                String::from_utf8_lossy(&bytes)
                    .chars()
                    .take(300)
                    .collect::<String>()
            ))
        })
    }

    /// [`call`](Self::call) for an answer whose body does not matter.
    pub(crate) async fn call_raw(
        &self,
        method: Method,
        url: &str,
        body: Option<&(impl Serialize + Sync)>,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        let payload = match body {
            Some(body) => Bytes::from(serde_json::to_vec(body).expect("requests serialise")),
            None => Bytes::new(),
        };
        let mut request = Request::builder().method(method).uri(url);
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if let Some(bearer) = &self.bearer {
            request = request.header(hyper::header::AUTHORIZATION, bearer);
        }
        let request = request.body(Full::new(payload)).map_err(|e| {
            CallError::Refused(format!(
                "cannot make a request for {}: {e}",
                crate::fleet::redacted(url)
            ))
        })?;
        let call = async {
            let answer = self.client.request(request).await.map_err(|e| {
                CallError::Fault(format!("unreachable ({})", crate::error_chain(&e)))
            })?;
            let status = answer.status();
            // A server's answer is read up to a bound: one that never ends (a chunked body
            // that goes on) is cut there, not held whole.
            let body = http_body_util::Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        CallError::Fault(format!(
                            "the answer passed {} MiB, the most this client reads",
                            MAX_ANSWER_BYTES >> 20
                        ))
                    } else {
                        CallError::Fault(format!("the answer broke off ({e})"))
                    }
                })?
                .to_bytes();
            Ok::<_, CallError>((status, body))
        };
        let (status, body) = tokio::time::timeout(timeout, call).await.map_err(|_| {
            CallError::Fault(format!("no answer in {:.0} s", timeout.as_secs_f64()))
        })??;
        if status.is_success() {
            return Ok(body);
        }
        let said = format!("HTTP {}: {}", status.as_u16(), error_message(&body));
        Err(classify(status, said))
    }
}

/// A server error or an overload is the server's state (another server may do); anything
/// else it answered is a refusal of this request.
fn classify(status: StatusCode, said: String) -> CallError {
    if status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
    {
        CallError::Fault(said)
    } else {
        CallError::Refused(said)
    }
}
