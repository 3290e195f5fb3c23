//! `[[tools]] kind = "remote"`: a tool served by tool servers (`areal serve tools`). Each
//! episode's session is opened on one server (chosen by the episode's seed, so an episode's
//! calls all go where its state is), called there, and closed when the episode ends.
//!
//! ```toml
//! [[tools]]
//! kind = "remote"
//! endpoints = ["http://127.0.0.1:50071"]
//! tool = "python"            # the name the server serves it under
//! ```
//!
//! The tool's schema is the server's, read when the run starts (every server must serve the
//! tool, with the same schema). A call that fails on the wire, or to a session the server
//! dropped, fails the session: the model reads that the tool failed, and its next call opens
//! a new session.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use areal_proto::pb::tools_client::ToolsClient;
use areal_proto::{MAX_MESSAGE_BYTES, header, pb};
use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Tool, ToolOutput, ToolSchema, ToolSession,
    register_tool,
};
use serde::Deserialize;
use serde_json::{Map, Value};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::errors::OptionError;
use crate::fleet::{ClientRuntime, Connect, check_options, connect_all};
use crate::security::{SendToken, client_token};

/// The name the plugin is registered under (`[[tools]] kind = "remote"`).
pub const REMOTE_TOOL: &str = "remote";

/// `[[tools]] kind = "remote"`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteToolOptions {
    /// The tool servers (`areal serve tools`), e.g. `["http://127.0.0.1:50071"]`.
    pub endpoints: Vec<String>,
    /// The tool's name on the servers (its schema's).
    pub tool: String,
    /// Seconds to wait for a connection. By default 5.
    #[serde(default = "default_connect_timeout_s")]
    pub connect_timeout_s: f64,
    /// Seconds one call may take on the wire and the server (the tool's own limits come
    /// first). By default 120.
    #[serde(default = "default_call_timeout_s")]
    pub call_timeout_s: f64,
    /// A PEM file of the certificate authority that signed the servers' certificates, for
    /// `https://` endpoints.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// A file holding the servers' shared token; by default `AREAL_TOKEN`.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

fn default_connect_timeout_s() -> f64 {
    5.0
}

fn default_call_timeout_s() -> f64 {
    120.0
}

type Client = ToolsClient<InterceptedService<Channel, SendToken>>;

/// A tool on tool servers (see the module's documentation).
pub struct RemoteTool {
    schema: ToolSchema,
    servers: Arc<Vec<(String, Client)>>,
    runtime: Arc<ClientRuntime>,
    call_timeout: Duration,
}

impl std::fmt::Debug for RemoteTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTool")
            .field("schema", &self.schema)
            .field(
                "servers",
                &self.servers.iter().map(|(url, _)| url).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl RemoteTool {
    /// The tool `options.tool` of the servers `options.endpoints`, sending `token` with every
    /// call; its schema read from every server. The error names the option at fault.
    pub fn new(options: &RemoteToolOptions, token: Option<&str>) -> Result<Self, OptionError> {
        check_options(
            &options.endpoints,
            &[
                ("connect_timeout_s", options.connect_timeout_s),
                ("call_timeout_s", options.call_timeout_s),
            ],
        )?;
        let connect_timeout = Duration::from_secs_f64(options.connect_timeout_s);
        let connect = Connect::new(connect_timeout, options.tls_ca_file.as_deref())?;
        let (runtime, servers) = connect_all(
            "areal-remote-tool",
            1,
            &options.endpoints,
            &connect,
            token,
            |guarded| {
                ToolsClient::new(guarded)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES)
            },
        )?;
        let mut schema: Option<ToolSchema> = None;
        for (url, client) in &servers {
            let mut client = client.clone();
            let described = runtime.get().block_on(async {
                tokio::time::timeout(
                    connect_timeout * 2,
                    client.describe(pb::Ping {
                        header: Some(header()),
                    }),
                )
                .await
            });
            let list = match described {
                Err(_) => {
                    return Err(OptionError::new(
                        "endpoints",
                        format!("{url} did not answer within {:?}", connect_timeout * 2),
                    ));
                }
                Ok(Err(status)) => {
                    return Err(OptionError::new(
                        "endpoints",
                        format!("{url} refused to describe its tools: {}", status.message()),
                    ));
                }
                Ok(Ok(list)) => list.into_inner(),
            };
            let names: Vec<&str> = list.tools.iter().map(|t| t.name.as_str()).collect();
            let Some(found) = list.tools.iter().find(|t| t.name == options.tool) else {
                return Err(OptionError::new(
                    "tool",
                    format!(
                        "{url} serves no tool named {:?} (it serves: {})",
                        options.tool,
                        names.join(", ")
                    ),
                ));
            };
            let parameters: Value = serde_json::from_str(&found.parameters_json).map_err(|e| {
                OptionError::new(
                    "endpoints",
                    format!("{url} sent parameters that are not JSON: {e}"),
                )
            })?;
            let this = ToolSchema {
                name: found.name.clone(),
                description: found.description.clone(),
                parameters,
            };
            match &schema {
                None => schema = Some(this),
                Some(first) if *first != this => {
                    return Err(OptionError::new(
                        "endpoints",
                        format!(
                            "{url} serves {:?} with another schema than {}: the servers must \
                             serve the same tool",
                            options.tool, servers[0].0
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(Self {
            schema: schema.expect("at least one endpoint"),
            servers: Arc::new(servers),
            runtime: Arc::new(runtime),
            call_timeout: Duration::from_secs_f64(options.call_timeout_s),
        })
    }
}

/// A failure of the wire or the server, for the engine to turn into the model's answer.
fn failed(url: &str, what: &str, status: tonic::Status) -> PluginError {
    PluginError::failed(
        REMOTE_TOOL,
        format!("{url}: {what}: {} ({:?})", status.message(), status.code()),
    )
}

#[areal_sdk::async_trait]
impl Tool for RemoteTool {
    fn name(&self) -> &str {
        REMOTE_TOOL
    }

    fn schema(&self) -> ToolSchema {
        self.schema.clone()
    }

    async fn open(&self, seed: u64) -> Result<Box<dyn ToolSession>, PluginError> {
        let index = (seed % self.servers.len() as u64) as usize;
        let (url, client) = &self.servers[index];
        let (mut client, tool, timeout) =
            (client.clone(), self.schema.name.clone(), self.call_timeout);
        let opened = self
            .runtime
            .get()
            .spawn(async move {
                let open = pb::OpenSession {
                    header: Some(header()),
                    tool,
                    seed,
                };
                tokio::time::timeout(timeout, client.open(open)).await
            })
            .await
            .map_err(|e| PluginError::failed(REMOTE_TOOL, format!("opening a session: {e}")))?;
        let session_id = match opened {
            Err(_) => {
                return Err(PluginError::failed(
                    REMOTE_TOOL,
                    format!("{url}: opening a session took more than {timeout:?}"),
                ));
            }
            Ok(Err(status)) => return Err(failed(url, "opening a session", status)),
            Ok(Ok(opened)) => opened.into_inner().session_id,
        };
        Ok(Box::new(RemoteSession {
            url: url.clone(),
            client: self.servers[index].1.clone(),
            runtime: self.runtime.clone(),
            session_id,
            timeout,
        }))
    }
}

/// One episode's session on a server; closed there when dropped.
struct RemoteSession {
    url: String,
    client: Client,
    runtime: Arc<ClientRuntime>,
    session_id: u64,
    timeout: Duration,
}

#[areal_sdk::async_trait]
impl ToolSession for RemoteSession {
    async fn call(&mut self, arguments: &Map<String, Value>) -> Result<ToolOutput, PluginError> {
        let call = pb::ToolCall {
            header: Some(header()),
            session_id: self.session_id,
            arguments_json: Value::Object(arguments.clone()).to_string(),
        };
        let (mut client, timeout) = (self.client.clone(), self.timeout);
        let answered = self
            .runtime
            .get()
            .spawn(async move { tokio::time::timeout(timeout, client.call(call)).await })
            .await
            .map_err(|e| PluginError::failed(REMOTE_TOOL, format!("a call: {e}")))?;
        match answered {
            Err(_) => Err(PluginError::failed(
                REMOTE_TOOL,
                format!("{}: the call took more than {timeout:?}", self.url),
            )),
            Ok(Err(status)) => Err(failed(&self.url, "a call", status)),
            Ok(Ok(answer)) => {
                let answer = answer.into_inner();
                Ok(ToolOutput {
                    text: answer.text,
                    error: answer.error,
                })
            }
        }
    }
}

impl Drop for RemoteSession {
    fn drop(&mut self) {
        let mut client = self.client.clone();
        let close = pb::CloseSession {
            header: Some(header()),
            session_id: self.session_id,
        };
        // best effort: a session not closed is dropped by the server once idle
        self.runtime.get().spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), client.close(close)).await;
        });
    }
}

fn build(config: &PluginConfig, _: &BuildContext) -> Result<Arc<dyn Tool>, PluginError> {
    let options: RemoteToolOptions = config.parse()?;
    let token = client_token(config, options.token_file.as_deref())?;
    let tool = RemoteTool::new(&options, token.as_deref())
        .map_err(|e| config.invalid(e.key, e.explained()))?;
    Ok(Arc::new(tool))
}

register_tool!(
    REMOTE_TOOL,
    "a tool on tool servers (`areal serve tools`): `endpoints = [\"http://HOST:PORT\", ...]`, `tool = NAME`",
    build
);
