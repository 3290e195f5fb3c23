//! areal-rs over gRPC (the services of `areal-proto`).
//!
//! - [`serve_reward`] serves any reward plugin: `areal serve reward --listen ADDR` builds the
//!   `[reward]` section of a config and answers `Verify` calls on the engine's reward service
//!   (its threads, its deadlines, a failing or hanging verifier costing one sample).
//! - The `remote` reward plugin (`[reward] kind = "remote"`, `endpoints = [...]`) sends each
//!   sample to the least-loaded of its servers and, when one cannot be reached, to the next.
//! - [`serve_generator`] and [`serve_inference_api`] serve any generator plugin over gRPC or
//!   behind SGLang's or vLLM's HTTP API.
//! - [`GeneratorFleet`] generates on servers of any of those kinds (`[generator] kind =
//!   "remote"`, `"sglang"`, `"vllm"`): one fleet over an adapter per wire API.
//! - [`serve_tools`] serves a config's `[[tools]]` (`areal serve tools`), a session per episode
//!   kept on the server; the `remote` tool plugin (`[[tools]] kind = "remote"`) calls them.
//!
//! Servers listen on loopback unless given a shared token ([`Listen`]): on any other address
//! every call must carry it (`AREAL_TOKEN`). Every client call has a timeout.

mod errors;
mod fleet;
mod generator_server;
mod generators;
mod http_client;
pub mod inference_api;
mod inference_server;
mod proxy;
mod remote_reward;
mod remote_tool;
mod reward_server;
mod security;
mod server;
mod tool_server;
mod weights_folder;

pub use errors::OptionError;
pub use fleet::Routing;
pub use generator_server::serve_generator;
pub use generators::{GeneratorFleet, GeneratorFleetOptions};
pub use inference_api::InferenceApi;
pub use inference_server::serve_inference_api;
pub use proxy::{AGENT, Agent, AgentOptions, WithoutReward};
pub use remote_reward::{NAME as REMOTE, RemoteRewardOptions, RemoteVerifier};
pub use remote_tool::{REMOTE_TOOL, RemoteTool, RemoteToolOptions};
pub use reward_server::serve_reward;
pub use security::{Listen, ServeError, ServerTls, TOKEN_ENV, token_from_env};
pub use tool_server::{ToolServerOptions, serve_tools};

pub(crate) use areal_sdk::error_chain;
