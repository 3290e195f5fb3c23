//! The proxy's HTTP routes: AReaL's, and OpenAI's chat completions.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use super::hub::{Call, Hub, Refusal};
use super::openai::{ChatRequest, error_body};
use crate::security::constant_time_eq;

/// The routes.
pub(crate) mod routes {
    /// AReaL: a session for an agent that runs elsewhere (admin key).
    pub(crate) const START_SESSION: &str = "/rl/start_session";
    /// AReaL: the reward of an interaction (session key).
    pub(crate) const SET_REWARD: &str = "/rl/set_reward";
    /// AReaL: the session is over (session key).
    pub(crate) const END_SESSION: &str = "/rl/end_session";
    /// OpenAI: a turn (session key).
    pub(crate) const CHAT: &str = "/v1/chat/completions";
    /// OpenAI, without the version prefix (AReaL's proxy serves both).
    pub(crate) const CHAT_BARE: &str = "/chat/completions";
    /// OpenAI: the models (the policy).
    pub(crate) const MODELS: &str = "/v1/models";
    /// Liveness.
    pub(crate) const HEALTH: &str = "/health";
}

/// What the routes share.
pub(crate) struct Served {
    pub(crate) hub: Arc<Hub>,
    /// The admin key (`/rl/start_session`); none on loopback without a token.
    pub(crate) admin: Option<String>,
    /// What a 429 tells the client to wait.
    pub(crate) retry_after: Duration,
}

fn refuse(status: u16, message: &str, param: Option<&str>) -> Response {
    refused(Refusal {
        param: param.map(str::to_owned),
        ..Refusal::new(status, message)
    })
}

fn refused(r: Refusal) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let kind = match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        404 => "not_found_error",
        409 | 410 => "invalid_request_error",
        429 => "rate_limit_error",
        _ => "server_error",
    };
    let body = error_body(&r.message, kind, r.param.as_deref(), r.code);
    (status, axum::Json(body)).into_response()
}

/// Middleware: every 429 says when to come back (`Retry-After`), whichever route refused.
async fn retry_after(
    State(s): State<Arc<Served>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut response = next.run(request).await;
    if response.status() == StatusCode::TOO_MANY_REQUESTS
        && !response.headers().contains_key(header::RETRY_AFTER)
    {
        let wait = s.retry_after.as_secs().max(1);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(wait));
    }
    response
}

/// The deepest a request's JSON may nest (within serde_json's own bound on what it reads as
/// values, 128; which it does not apply to what it skips).
const MAX_DEPTH: usize = 64;

/// How deep `body`'s JSON nests (its arrays and objects), read as bytes: past `MAX_DEPTH` the
/// body is refused before it is parsed.
fn depth(body: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The bearer key of a request.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The body as `T`, or a 400 naming the field.
fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Refusal> {
    let deepest = depth(body);
    if deepest > MAX_DEPTH {
        return Err(Refusal::new(
            400,
            format!("the request's body nests {deepest} deep: at most {MAX_DEPTH}"),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        Refusal {
            param: (path != ".").then_some(path),
            ..Refusal::new(
                400,
                format!("the request's body cannot be read: {}", e.inner()),
            )
        }
    })
}

/// The session queue for the request's key.
fn session(s: &Served, headers: &HeaderMap) -> Result<(String, mpsc::Sender<Call>), Refusal> {
    let Some(key) = bearer(headers) else {
        return Err(Refusal::new(
            401,
            "send the session's key: `Authorization: Bearer sk-sess-...` (OPENAI_API_KEY)",
        ));
    };
    s.hub.calls(key)
}

/// Queue `call` for the session, or say it is busy or gone.
fn queue(calls: &mpsc::Sender<Call>, call: Call) -> Result<(), Refusal> {
    calls.try_send(call).map_err(|e| match e {
        mpsc::error::TrySendError::Full(_) => Refusal::new(
            429,
            "this session already has calls waiting: send one at a time",
        ),
        mpsc::error::TrySendError::Closed(_) => Refusal::new(410, "this session has ended"),
    })
}

async fn chat(State(s): State<Arc<Served>>, headers: HeaderMap, body: Bytes) -> Response {
    let (_, calls) = match session(&s, &headers) {
        Ok(found) => found,
        Err(r) => return refused(r),
    };
    let request: ChatRequest = match parse(&body) {
        Ok(r) => r,
        Err(r) => return refused(r),
    };
    let asked = match request.check() {
        Ok(a) => a,
        Err(bad) => return refuse(400, &bad.message, Some(&bad.param)),
    };
    let (stream, include_usage) = (asked.stream, asked.include_usage);
    let (reply, answer) = oneshot::channel();
    if let Err(r) = queue(&calls, Call::Chat { asked, reply }) {
        return refused(r);
    }
    let answer = match answer.await {
        Ok(Ok(answer)) => answer,
        Ok(Err(refusal)) => return refused(refusal),
        Err(_) => return refuse(410, "this session ended before the turn did", None),
    };
    if !stream {
        return axum::Json(answer.completion()).into_response();
    }
    let mut events = String::new();
    for chunk in answer.chunks(include_usage) {
        events.push_str("data: ");
        events.push_str(&chunk.to_string());
        events.push_str("\n\n");
    }
    events.push_str("data: [DONE]\n\n");
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        events,
    )
        .into_response()
}

#[derive(Deserialize)]
struct StartSession {
    #[serde(default)]
    task_id: Option<String>,
}

async fn start_session(State(s): State<Arc<Served>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(admin) = &s.admin
        && !bearer(&headers).is_some_and(|k| constant_time_eq(k.as_bytes(), admin.as_bytes()))
    {
        return refuse(
            401,
            "start_session needs the proxy's admin key: `Authorization: Bearer <token>`",
            None,
        );
    }
    let request: StartSession = if body.is_empty() {
        StartSession { task_id: None }
    } else {
        match parse(&body) {
            Ok(r) => r,
            Err(r) => return refused(r),
        }
    };
    match s.hub.attach(request.task_id) {
        Some(attached) => axum::Json(json!({
            "session_id": attached.session_id,
            "api_key": attached.api_key,
            "item": attached.item,
        }))
        .into_response(),
        None => refuse(
            429,
            "the run admits no more sessions now (its staleness bound): retry later",
            None,
        ),
    }
}

#[derive(Deserialize)]
struct SetReward {
    reward: f64,
    #[serde(default)]
    interaction_id: Option<String>,
}

async fn set_reward(State(s): State<Arc<Served>>, headers: HeaderMap, body: Bytes) -> Response {
    let (session_id, calls) = match session(&s, &headers) {
        Ok(found) => found,
        Err(r) => return refused(r),
    };
    let request: SetReward = match parse(&body) {
        Ok(r) => r,
        Err(r) => return refused(r),
    };
    let (reply, done) = oneshot::channel();
    let call = Call::SetReward {
        reward: request.reward,
        interaction_id: request.interaction_id,
        reply,
    };
    if let Err(r) = queue(&calls, call) {
        return refused(r);
    }
    match done.await {
        Ok(Ok(())) => {
            axum::Json(json!({ "session_id": session_id, "status": "ok" })).into_response()
        }
        Ok(Err(refusal)) => refused(refusal),
        Err(_) => refuse(410, "this session has ended", None),
    }
}

async fn end_session(State(s): State<Arc<Served>>, headers: HeaderMap) -> Response {
    let (session_id, calls) = match session(&s, &headers) {
        Ok(found) => found,
        Err(r) => return refused(r),
    };
    let (reply, done) = oneshot::channel();
    if let Err(r) = queue(&calls, Call::End { reply }) {
        return refused(r);
    }
    match done.await {
        Ok(()) => {
            axum::Json(json!({ "session_id": session_id, "status": "ended" })).into_response()
        }
        Err(_) => refuse(410, "this session has ended", None),
    }
}

async fn models() -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{"id": "policy", "object": "model", "created": 0, "owned_by": "areal"}],
    }))
    .into_response()
}

async fn health(State(s): State<Arc<Served>>) -> Response {
    let (sessions, waiting) = s.hub.counts();
    axum::Json(json!({ "status": "ok", "sessions": sessions, "waiting": waiting })).into_response()
}

async fn not_found() -> Response {
    refuse(404, "no such route on the areal proxy", None)
}

pub(crate) fn router(served: Arc<Served>) -> Router {
    Router::new()
        .route(routes::CHAT, post(chat))
        .route(routes::CHAT_BARE, post(chat))
        .route(routes::START_SESSION, post(start_session))
        .route(routes::SET_REWARD, post(set_reward))
        .route(routes::END_SESSION, post(end_session))
        .route(routes::MODELS, get(models))
        .route(routes::HEALTH, get(health))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            served.clone(),
            retry_after,
        ))
        .layer(axum::middleware::from_fn(crate::server::bounded_body))
        .with_state(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_nested_too_deep_is_refused_before_it_is_read() {
        assert_eq!(depth(br#"{"a": [1, {"b": "[[[{{{"}], "c": "\"]]"}"#), 3);
        let deep = format!(
            "{{\"messages\": [], \"x\": {}{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        let refused = parse::<serde_json::Value>(&Bytes::from(deep)).unwrap_err();
        assert_eq!(refused.status, 400);
        assert!(
            refused.message.contains("10001 deep"),
            "{}",
            refused.message
        );
        let fine = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse::<serde_json::Value>(&Bytes::from(fine)).is_ok());
    }
}
