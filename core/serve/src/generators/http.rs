//! The HTTP APIs of inference servers (SGLang, vLLM): one [`ServerApi`] over a [`Dialect`],
//! what each of them says its own way (its routes and bodies). What they share is here: JSON
//! calls to a base URL per server, `/health`, `/tokenize`, the weight version read back from
//! a route after each load, weights handed over as a checkpoint folder under `weights_dir`,
//! pauses in `abort` mode, answers that name at most one version (the fleet works out the
//! rest).

use std::time::Duration;

use areal_sdk::{GenerateRequest, GeneratorStats, PolicyVersion};
use hyper::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::api::{
    CallError, GenerationAnswer, Joining, OptionError, Published, Sampled, ServerApi, Setup,
    Timeouts, unloaded,
};
use crate::http_client::HttpClient;
use crate::inference_api::{TokenizeRequest, TokenizeResponse, WeightVersion, routes};

/// Register the HTTP API `$name` spoken in the dialect `$dialect` (a unit struct it defines,
/// whose [`Dialect`] the file implements), with the routes that take no body of its own.
macro_rules! http_api {
    (
        $dialect:ident, $name:literal,
        version: $version:expr, resume: $resume:expr,
        $description:literal $(,)?
    ) => {
        struct $dialect;
        impl $crate::generators::http::Named for $dialect {
            const ROUTES: $crate::generators::http::Routes = $crate::generators::http::Routes {
                version: $version,
                resume: $resume,
            };
        }
        $crate::generators::api::wire_api!($name, $description, |setup| {
            $crate::generators::http::connect::<$dialect>(setup, $name)
        });
    };
}
pub(super) use http_api;

/// What [`http_api!`] declares of a dialect.
pub(super) trait Named {
    const ROUTES: Routes;
}

/// The routes of a dialect that take no body of its own.
pub(super) struct Routes {
    /// Reports the weight version a server holds.
    pub(super) version: &'static str,
    /// Resumes a paused server (body `{}`).
    pub(super) resume: &'static str,
}

/// What one HTTP API says its own way.
#[areal_sdk::async_trait]
pub(super) trait Dialect: Named + Send + Sync + 'static {
    /// Have the server load the checkpoint folder `folder` as `version`.
    async fn load(at: At<'_>, folder: String, version: PolicyVersion) -> Result<(), CallError>;

    /// Pause the server in `abort` mode: what runs comes back at once, cut.
    async fn pause(at: At<'_>) -> Result<(), CallError>;

    /// Sample `request` (see [`At::generate`]).
    async fn generate(at: At<'_>, request: &GenerateRequest) -> Result<Sampled, CallError>;
}

/// One server of an HTTP API, as a dialect calls it.
#[derive(Clone, Copy)]
pub(super) struct At<'a> {
    servers: &'a HttpServers,
    server: usize,
}

impl At<'_> {
    /// How long calls may take.
    pub(super) fn timeouts(&self) -> Timeouts {
        self.servers.timeouts
    }

    /// The URL of `route` on this server.
    pub(super) fn url(&self, route: &str) -> String {
        self.servers.url(self.server, route)
    }

    /// `POST route` with `body` within `timeout`, the answer read as `T`.
    pub(super) async fn post<T: DeserializeOwned>(
        &self,
        route: &str,
        body: &(impl Serialize + Sync),
        timeout: Duration,
    ) -> Result<T, CallError> {
        let url = self.url(route);
        self.servers
            .http
            .call(Method::POST, &url, Some(body), timeout)
            .await
    }

    /// `POST url` with `body` within `timeout`, whatever it answers.
    pub(super) async fn post_to(
        &self,
        url: &str,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<(), CallError> {
        self.servers
            .http
            .call_raw(Method::POST, url, Some(body), timeout)
            .await
            .map(drop)
    }

    /// `POST url` with `{}` within the time of a call.
    pub(super) async fn post_empty(&self, url: &str) -> Result<(), CallError> {
        self.post_to(url, &serde_json::json!({}), self.timeouts().call)
            .await
    }

    /// `POST route` with the generation request `body`, the answer read by `read`.
    pub(super) async fn generate<T: DeserializeOwned>(
        &self,
        route: &str,
        body: &(impl Serialize + Sync),
        read: fn(T) -> Result<GenerationAnswer, String>,
    ) -> Result<Sampled, CallError> {
        let answer: T = self.post(route, body, self.timeouts().call).await?;
        let answer = read(answer)
            .map_err(|e| CallError::Refused(format!("sent a malformed answer: {e}")))?;
        Ok(Sampled::Untagged(answer))
    }
}

/// The servers of one HTTP API.
pub(super) struct HttpServers {
    http: HttpClient,
    /// Each server's URL, without a trailing `/`.
    bases: Vec<String>,
    timeouts: Timeouts,
}

/// The adapter of an HTTP API spoken in dialect `D`.
struct Http<D> {
    servers: HttpServers,
    dialect: std::marker::PhantomData<fn() -> D>,
}

/// The adapter of `setup`'s servers for the API `name`, spoken in dialect `D`.
pub(super) fn connect<D: Dialect>(
    setup: &Setup<'_>,
    name: &str,
) -> Result<Box<dyn ServerApi>, OptionError> {
    if setup.options.weights_dir.is_none() {
        return Err(OptionError::new(
            "weights_dir",
            format!(
                "{name} servers load weights from disk: give a folder the trainer writes and every server reads, as both see it"
            ),
        ));
    }
    let servers = HttpServers {
        http: HttpClient::new(setup.connect, setup.token),
        bases: setup
            .options
            .endpoints
            .iter()
            .map(|url| url.trim_end_matches('/').to_owned())
            .collect(),
        timeouts: setup.timeouts,
    };
    Ok(Box::new(Http::<D> {
        servers,
        dialect: std::marker::PhantomData,
    }))
}

impl<D> Http<D> {
    fn at(&self, server: usize) -> At<'_> {
        At {
            servers: &self.servers,
            server,
        }
    }
}

#[areal_sdk::async_trait]
impl<D: Dialect> ServerApi for Http<D> {
    /// `/health`, except while `paused`: SGLang answers it by generating a token, which
    /// waits for the resume (the pause and the weight load find a dead server on their own).
    /// These APIs report no statistics.
    async fn alive(
        &self,
        server: usize,
        paused: bool,
    ) -> Result<Option<GeneratorStats>, CallError> {
        if !paused {
            self.servers.health(server).await?;
        }
        Ok(None)
    }

    /// `/health`, then the version it reports. Whether it is paused is not asked: it is
    /// resumed to be sure.
    async fn joining(&self, server: usize) -> Result<Joining, CallError> {
        self.servers.health(server).await?;
        Ok(Joining {
            version: self.servers.version(server, D::ROUTES.version).await?,
            paused: None,
        })
    }

    /// `POST /tokenize`; `None` if the server has no such route.
    async fn tokenize(&self, server: usize, text: &str) -> Result<Option<Vec<u32>>, CallError> {
        let request = TokenizeRequest {
            prompt: text.to_owned(),
            add_special_tokens: false,
            model: None,
        };
        let timeout = self.servers.timeouts.probe;
        let answer: Result<TokenizeResponse, _> = self
            .at(server)
            .post(routes::TOKENIZE, &request, timeout)
            .await;
        match answer {
            Ok(answer) => Ok(Some(answer.tokens)),
            Err(CallError::Refused(said)) if said.starts_with("HTTP 404") => {
                let endpoint = crate::fleet::redacted(&self.servers.bases[server]);
                tracing::warn!(target: "areal::remote", %endpoint, "the server has no /tokenize route: its tokenizer cannot be checked");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    async fn load(
        &self,
        server: usize,
        published: &Published,
    ) -> Result<Option<PolicyVersion>, CallError> {
        let folder = published
            .folder
            .as_ref()
            .map(|f| f.to_string_lossy().into_owned())
            .ok_or_else(|| CallError::Refused("weights were published without a folder".into()))?;
        D::load(self.at(server), folder, published.version).await?;
        self.servers.version(server, D::ROUTES.version).await
    }

    async fn pause(&self, server: usize) -> Result<(), CallError> {
        D::pause(self.at(server)).await
    }

    async fn resume(&self, server: usize) -> Result<(), CallError> {
        let at = self.at(server);
        at.post_empty(&at.url(D::ROUTES.resume)).await
    }

    fn pause_returns_samples(&self) -> bool {
        true
    }

    /// No sample goes to a server that holds none of this run's weights: which weights
    /// sampled it could not be said.
    async fn generate(
        &self,
        server: usize,
        request: &GenerateRequest,
        held: Option<PolicyVersion>,
    ) -> Result<Sampled, CallError> {
        held.ok_or_else(unloaded)?;
        D::generate(self.at(server), request).await
    }
}

impl HttpServers {
    fn url(&self, server: usize, route: &str) -> String {
        format!("{}{route}", self.bases[server])
    }

    /// `GET /health`.
    async fn health(&self, server: usize) -> Result<(), CallError> {
        let url = self.url(server, routes::HEALTH);
        self.http
            .call_raw(Method::GET, &url, None::<&()>, self.timeouts.probe)
            .await
            .map(drop)
    }

    /// The version a server reports at `route` (`None`: none set, or not one of ours).
    async fn version(
        &self,
        server: usize,
        route: &str,
    ) -> Result<Option<PolicyVersion>, CallError> {
        let url = self.url(server, route);
        let answer: WeightVersion = self
            .http
            .call(Method::GET, &url, None::<&()>, self.timeouts.probe)
            .await?;
        Ok(answer.weight_version.and_then(|v| v.parse().ok()))
    }
}

/// The id of a request on the server: the sample and how far it got, so that a resubmitted
/// sample is a new request.
pub(super) fn request_id(request: &GenerateRequest) -> String {
    format!("areal-{}-{}", request.sample_id, request.input_ids.len())
}
