//! What a wire API does for the generator fleet: the few calls each kind of server answers
//! in its own way. Everything else (which servers take work, the pause across them, weight
//! publishing and catch-up, routing, re-issues, the checks on what servers answer) is the
//! fleet's, written once in [`super`].
//!
//! An adapter is one file: a type implementing [`ServerApi`], a `connect` function that makes
//! it from a [`Setup`], and one `wire_api!` line that registers both the API
//! and the `[generator] kind` plugin of that name.

use std::path::PathBuf;
use std::time::Duration;

use areal_sdk::{GenerateRequest, GeneratorStats, PolicyVersion, WeightUpdate};

use crate::fleet::Connect;
pub(crate) use crate::fleet::{CallError, OptionError};
pub(crate) use crate::inference_api::GenerationAnswer;

use super::GeneratorFleetOptions;

/// What an adapter is made from: the options, how to reach the servers, the run's token.
pub(crate) struct Setup<'a> {
    pub(crate) options: &'a GeneratorFleetOptions,
    pub(crate) connect: &'a Connect,
    pub(crate) token: Option<&'a str>,
    pub(crate) timeouts: Timeouts,
}

/// How long each kind of call may take on a server (the fleet bounds them too).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    /// One sample, and a pause or resume.
    pub(crate) call: Duration,
    /// Receiving and loading one version of the weights.
    pub(crate) weights: Duration,
    /// A health check, a version or tokenizer query.
    pub(crate) probe: Duration,
}

/// A registered wire API: its name (the `[generator] kind`) and how to make its adapter.
pub(crate) struct WireApi {
    pub(crate) name: &'static str,
    pub(crate) connect: fn(&Setup<'_>) -> Result<Box<dyn ServerApi>, OptionError>,
}

inventory::collect!(WireApi);

/// Register an adapter: the wire API `$name` made by `$connect`, and the generator plugin of
/// that name (a [`GeneratorFleet`](super::GeneratorFleet) over it).
macro_rules! wire_api {
    ($name:expr, $description:expr, $connect:expr $(,)?) => {
        ::inventory::submit! {
            $crate::generators::api::WireApi { name: $name, connect: $connect }
        }
        ::areal_sdk::register_generator!($name, $description, $crate::generators::build);
    };
}
pub(crate) use wire_api;

/// What a server says of itself when it joins (or comes back).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Joining {
    /// The version of this run's weights it holds (`None`: none, or not one of ours).
    pub(crate) version: Option<PolicyVersion>,
    /// Whether it is paused; `None` where the API cannot say (it is then resumed to be sure).
    pub(crate) paused: Option<bool>,
}

/// One version of the weights as the fleet publishes it.
#[derive(Clone, Debug)]
pub(crate) struct Published {
    pub(crate) version: PolicyVersion,
    /// Its checkpoint folder under `weights_dir`, when the run hands weights over on disk
    /// (with an adapter: PEFT's adapter files).
    pub(crate) folder: Option<PathBuf>,
    /// With an adapter: the sha256 of its base.
    pub(crate) base_sha256: Option<String>,
    /// With an adapter on disk: its base's folder under `weights_dir`, and its tag (the
    /// weight version a server holding it reports).
    pub(crate) base: Option<(PathBuf, String)>,
}

/// What a server sampled for one request.
#[derive(Debug)]
pub(crate) enum Sampled {
    /// Each token with the version that sampled it, as the server kept them (areal's own
    /// servers), interruptions included.
    Tagged(areal_sdk::Completion),
    /// Tokens and logprobs with the finish reason and, at most, one version for all of them
    /// (SGLang and vLLM): the fleet works out which weights sampled them.
    Untagged(GenerationAnswer),
}

/// The calls a kind of server answers. `server` is the index of an endpoint, in the order of
/// the options.
#[areal_sdk::async_trait]
pub(crate) trait ServerApi: Send + Sync + 'static {
    /// Health of a server taking work. `paused`: the fleet has the servers paused (an API
    /// whose health check waits for a resume checks nothing then). Its statistics, if the
    /// API reports them.
    async fn alive(&self, server: usize, paused: bool)
    -> Result<Option<GeneratorStats>, CallError>;

    /// What a server that takes no work yet says of itself, once reachable.
    async fn joining(&self, server: usize) -> Result<Joining, CallError>;

    /// `text` in token ids by the server's tokenizer; `None` where it has no way to say.
    async fn tokenize(&self, server: usize, text: &str) -> Result<Option<Vec<u32>>, CallError> {
        let _ = (server, text);
        Ok(None)
    }

    /// Make `update` ready to send (encoded once for every server), published as
    /// `published`; nothing by default (the servers read the folder).
    async fn prepare(&self, update: WeightUpdate, published: &Published) -> Result<(), String> {
        let _ = (update, published);
        Ok(())
    }

    /// Have a server load `published`; the version it then holds.
    async fn load(
        &self,
        server: usize,
        published: &Published,
    ) -> Result<Option<PolicyVersion>, CallError>;

    /// Pause a server: running samples come back interrupted, or are held there until
    /// [`resume`](Self::resume). [`CallError::Unsupported`] if it cannot.
    async fn pause(&self, server: usize) -> Result<(), CallError>;

    /// Resume a paused server.
    async fn resume(&self, server: usize) -> Result<(), CallError>;

    /// Whether a pause sends the running samples back at once (SGLang's and vLLM's `abort`
    /// mode): the fleet's `pause` then waits for them to come back.
    fn pause_returns_samples(&self) -> bool;

    /// Sample `request` on a server holding `held` (as it last reported).
    async fn generate(
        &self,
        server: usize,
        request: &GenerateRequest,
        held: Option<PolicyVersion>,
    ) -> Result<Sampled, CallError>;
}

/// The refusal of a sample for a server that holds none of this run's weights: which weights
/// would sample it cannot be said.
pub(crate) fn unloaded() -> CallError {
    CallError::Refused("holds no weights of this run: generate after update_weights".into())
}
