//! The tool server: the tools of a config's `[[tools]]` served to episodes run elsewhere
//! (`areal serve tools`). Each episode opens a session of a tool, calls it, and closes it; the
//! session's state stays on the server between its calls.
//!
//! Sessions are bounded: at most [`ToolServerOptions::max_sessions`] at once (more are refused
//! with `RESOURCE_EXHAUSTED`), and one idle for [`ToolServerOptions::idle`] is dropped, so a
//! client that dies without closing its sessions does not keep them for ever. A call to a
//! session that is gone is `NOT_FOUND`: the client opens another.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use areal_proto::pb::tools_server::{Tools, ToolsServer};
use areal_proto::{MAX_MESSAGE_BYTES, PROTOCOL_VERSION, check_header, pb};
use areal_sdk::{Tool, ToolSession};
use serde_json::{Map, Value};
use tonic::{Request, Response, Status};

use crate::security::{Listen, ServeError};
use crate::server::{guarded, serve_on};

/// How the server keeps sessions.
#[derive(Clone, Debug)]
pub struct ToolServerOptions {
    /// Sessions kept at once, all tools together.
    pub max_sessions: usize,
    /// How long a session may go uncalled before it is dropped.
    pub idle: Duration,
}

impl Default for ToolServerOptions {
    fn default() -> Self {
        Self {
            max_sessions: 1024,
            idle: Duration::from_secs(600),
        }
    }
}

struct Live {
    session: Arc<tokio::sync::Mutex<Box<dyn ToolSession>>>,
    last_used: Instant,
}

struct ToolServer {
    tools: Vec<Arc<dyn Tool>>,
    sessions: Arc<Mutex<HashMap<u64, Live>>>,
    options: ToolServerOptions,
}

impl ToolServer {
    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Live>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[tonic::async_trait]
impl Tools for ToolServer {
    async fn describe(&self, request: Request<pb::Ping>) -> Result<Response<pb::ToolList>, Status> {
        check_header(request.get_ref().header.as_ref())?;
        Ok(Response::new(pb::ToolList {
            tools: self
                .tools
                .iter()
                .map(|t| {
                    let schema = t.schema();
                    pb::ToolDescription {
                        name: schema.name,
                        description: schema.description,
                        parameters_json: schema.parameters.to_string(),
                    }
                })
                .collect(),
            protocol: PROTOCOL_VERSION,
            max_sessions: u32::try_from(self.options.max_sessions).unwrap_or(u32::MAX),
        }))
    }

    async fn open(
        &self,
        request: Request<pb::OpenSession>,
    ) -> Result<Response<pb::SessionOpened>, Status> {
        let open = request.into_inner();
        check_header(open.header.as_ref())?;
        let tool = self
            .tools
            .iter()
            .find(|t| t.schema().name == open.tool)
            .ok_or_else(|| Status::not_found(format!("no tool named {:?} here", open.tool)))?;
        if self.sessions().len() >= self.options.max_sessions {
            return Err(Status::resource_exhausted(format!(
                "{} sessions are open, the most this server keeps",
                self.options.max_sessions
            )));
        }
        let session = tool
            .open(open.seed)
            .await
            .map_err(|e| Status::internal(format!("opening a session of {}: {e}", open.tool)))?;
        // ids drawn from the system's generator: a client (even one with the server's token)
        // cannot guess another episode's session to call or close it
        let live = Live {
            session: Arc::new(tokio::sync::Mutex::new(session)),
            last_used: Instant::now(),
        };
        let id = {
            let mut sessions = self.sessions();
            let id = loop {
                let id = u64::from_le_bytes(crate::security::random_bytes());
                if id != 0 && !sessions.contains_key(&id) {
                    break id;
                }
            };
            sessions.insert(id, live);
            id
        };
        Ok(Response::new(pb::SessionOpened { session_id: id }))
    }

    async fn call(
        &self,
        request: Request<pb::ToolCall>,
    ) -> Result<Response<pb::ToolAnswer>, Status> {
        let call = request.into_inner();
        check_header(call.header.as_ref())?;
        let arguments: Map<String, Value> = match serde_json::from_str(&call.arguments_json) {
            Ok(Value::Object(arguments)) => arguments,
            _ => {
                return Err(Status::invalid_argument(
                    "the arguments are not a JSON object",
                ));
            }
        };
        let session = {
            let mut sessions = self.sessions();
            let live = sessions
                .get_mut(&call.session_id)
                .ok_or_else(|| Status::not_found("no such session (closed, or idle too long)"))?;
            live.last_used = Instant::now();
            live.session.clone()
        };
        let answer = session.lock().await.call(&arguments).await;
        match answer {
            Ok(output) => Ok(Response::new(pb::ToolAnswer {
                text: output.text,
                error: output.error,
            })),
            Err(e) => {
                // the tool's host failed: the session is gone
                self.sessions().remove(&call.session_id);
                Err(Status::internal(e.to_string()))
            }
        }
    }

    async fn close(
        &self,
        request: Request<pb::CloseSession>,
    ) -> Result<Response<pb::SessionClosed>, Status> {
        let close = request.into_inner();
        check_header(close.header.as_ref())?;
        self.sessions().remove(&close.session_id);
        Ok(Response::new(pb::SessionClosed {}))
    }
}

/// Serve `tools` until `shutdown` completes, keeping sessions as `options` says. `on_bound`
/// gets the address actually bound (port 0 picks one) once the server accepts calls.
pub async fn serve_tools(
    tools: Vec<Arc<dyn Tool>>,
    options: ToolServerOptions,
    listen: Listen,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let sessions = Arc::new(Mutex::new(HashMap::<u64, Live>::new()));
    // drop the sessions idle for too long
    let sweeper = {
        let (sessions, idle) = (Arc::downgrade(&sessions), options.idle);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(
                idle.min(Duration::from_secs(60))
                    .max(Duration::from_millis(10)),
            );
            loop {
                every.tick().await;
                let Some(sessions) = sessions.upgrade() else {
                    return;
                };
                let mut sessions = sessions.lock().unwrap_or_else(|p| p.into_inner());
                sessions.retain(|_, live| live.last_used.elapsed() < idle);
            }
        })
    };
    let server = ToolServer {
        tools,
        sessions,
        options,
    };
    let service = ToolsServer::new(server)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let service = guarded(service, &listen);
    let served = serve_on(&listen, "tools", on_bound, shutdown, |server| {
        server.add_service(service)
    })
    .await;
    sweeper.abort();
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Session ids are drawn from the system's generator: ids of the old scheme (a seeded
    /// counter another client could run forward) name nothing, and no two ids are related.
    #[tokio::test]
    async fn session_ids_cannot_be_guessed_from_another_sessions() {
        let server = ToolServer {
            tools: vec![Arc::new(areal_testkit::Shift::new(
                areal_testkit::ShiftOptions::default(),
            ))],
            sessions: Arc::default(),
            options: ToolServerOptions::default(),
        };
        let mut ids = Vec::new();
        for seed in 0..64 {
            let open = pb::OpenSession {
                header: Some(areal_proto::header()),
                tool: "testkit-shift".into(),
                seed,
            };
            ids.push(
                server
                    .open(Request::new(open))
                    .await
                    .unwrap()
                    .into_inner()
                    .session_id,
            );
        }
        let distinct: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), ids.len());
        // what the counter would have given, and each id's neighbours: nothing there
        let guesses = (1..=64).map(|k| areal_sdk::mix_seed(0x746f_6f6c, k)).chain(
            ids.iter()
                .flat_map(|&id| [id.wrapping_add(1), id.wrapping_sub(1)]),
        );
        for guess in guesses {
            assert!(!distinct.contains(&guess), "{guess} was guessable");
            let call = pb::ToolCall {
                header: Some(areal_proto::header()),
                session_id: guess,
                arguments_json: "{\"text\": \"a\"}".into(),
            };
            let refused = server.call(Request::new(call)).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::NotFound);
        }
        // the ids spread over all 64 bits
        let high = ids.iter().filter(|&&id| id >> 63 == 1).count();
        assert!(
            (8..=56).contains(&high),
            "{high} of 64 with the top bit set"
        );
    }
}
