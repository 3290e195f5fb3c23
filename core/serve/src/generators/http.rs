//! The HTTP APIs of inference servers (SGLang, vLLM): one [`ServerApi`] over a [`Dialect`],
//! what each of them says its own way (its routes and bodies). What they share is here: JSON
//! calls to a base URL per server, `/health`, `/tokenize`, the weight version read back from
//! a route after each load, weights handed over as a checkpoint folder under `weights_dir`,
//! pauses in `abort` mode, answers that name at most one version (the fleet works out the
//! rest).
//!
//! LoRA: the base is loaded once as a checkpoint folder (its version reported as its tag,
//! `base-<sha256 prefix>`), each version's adapter under the name `areal-v<version>`, checked
//! in the server's `/v1/models` (an adapter that never arrives stops the run naming the
//! server), the oldest unloaded past `keep_adapters`; every request names the adapter of the
//! version the server held when it was sent, so that is the version its tokens carry.

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
use crate::inference_api::{ModelList, TokenizeRequest, TokenizeResponse, WeightVersion, routes};

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
    /// Have the server load the checkpoint folder `folder`, reporting `version` for it.
    async fn load(at: At<'_>, folder: String, version: &str) -> Result<(), CallError>;

    /// Have the server load the PEFT adapter folder `folder` under the name `name`.
    async fn load_adapter(at: At<'_>, name: &str, folder: String) -> Result<(), CallError>;

    /// Have the server unload the adapter `name`.
    async fn unload_adapter(at: At<'_>, name: &str) -> Result<(), CallError>;

    /// Pause the server in `abort` mode: what runs comes back at once, cut.
    async fn pause(at: At<'_>) -> Result<(), CallError>;

    /// Sample `request` (see [`At::generate`]), with the adapter `adapter` if given.
    async fn generate(
        at: At<'_>,
        request: &GenerateRequest,
        adapter: Option<&str>,
    ) -> Result<Sampled, CallError>;
}

/// The name an adapter of `version` is loaded under.
fn adapter_name(version: PolicyVersion) -> String {
    format!("{ADAPTER_PREFIX}{version}")
}

const ADAPTER_PREFIX: &str = "areal-v";

/// What one server holds of a run that trains an adapter.
#[derive(Debug, Default)]
struct Adapters {
    /// The tag of the base it holds, as far as this client knows.
    base: Option<String>,
    /// The versions whose adapters it holds, oldest first.
    loaded: Vec<PolicyVersion>,
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
    /// Per server: the adapters it holds.
    adapters: Vec<std::sync::Mutex<Adapters>>,
    /// Whether the weights are adapters (requests then name one).
    lora: std::sync::atomic::AtomicBool,
    keep_adapters: usize,
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
    if setup.options.keep_adapters == 0 {
        return Err(OptionError::new(
            "keep_adapters",
            "must be at least 1 (the adapter of the current version)",
        ));
    }
    let n = setup.options.endpoints.len();
    Ok(Box::new(Http::<D> {
        servers,
        adapters: (0..n).map(|_| Default::default()).collect(),
        lora: Default::default(),
        keep_adapters: setup.options.keep_adapters,
        dialect: std::marker::PhantomData,
    }))
}

impl<D: Dialect> Http<D> {
    fn at(&self, server: usize) -> At<'_> {
        At {
            servers: &self.servers,
            server,
        }
    }

    /// Bring a server to the adapter of `published` (over its base), check that it lists it,
    /// and unload those past `keep_adapters`.
    async fn load_adapter(
        &self,
        server: usize,
        published: &Published,
        folder: String,
    ) -> Result<Option<PolicyVersion>, CallError> {
        let (base_folder, tag) = published.base.as_ref().ok_or_else(|| {
            CallError::Refused("an adapter was published without its base".into())
        })?;
        let at = self.at(server);
        let known = self.adapters[server]
            .lock()
            .expect("adapters lock")
            .base
            .clone();
        if known.as_deref() != Some(tag.as_str()) {
            let held = self.servers.version_text(server, D::ROUTES.version).await?;
            if held.as_deref() != Some(tag.as_str()) {
                D::load(at, base_folder.to_string_lossy().into_owned(), tag).await?;
            }
            let mut adapters = self.adapters[server].lock().expect("adapters lock");
            adapters.base = Some(tag.clone());
            adapters.loaded.clear();
        }
        let version = published.version;
        let name = adapter_name(version);
        D::load_adapter(at, &name, folder).await?;
        let listed = self.servers.adapters(server).await?;
        if !listed.contains(&version) {
            return Err(CallError::Refused(format!(
                "says it loaded adapter {name}, but does not list it in {} (it lists {})",
                routes::MODELS,
                if listed.is_empty() {
                    "none of this run's".to_owned()
                } else {
                    listed
                        .iter()
                        .map(|&v| adapter_name(v))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )));
        }
        let old: Vec<PolicyVersion> = {
            let mut adapters = self.adapters[server].lock().expect("adapters lock");
            adapters.loaded = listed;
            let keep_from = adapters.loaded.len().saturating_sub(self.keep_adapters);
            adapters.loaded.drain(..keep_from).collect()
        };
        for v in old {
            // a failure costs the server's memory, not the run
            if let Err(e) = D::unload_adapter(at, &adapter_name(v)).await {
                let endpoint = crate::fleet::redacted(&self.servers.bases[server]);
                tracing::warn!(target: "areal::remote", %endpoint, adapter = %adapter_name(v), error = %e, "cannot unload an old adapter");
            }
        }
        Ok(Some(version))
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

    /// `/health`, then the version it reports: of the newest of this run's adapters it lists,
    /// if the run trains one, else of its weights. Whether it is paused is not asked: it is
    /// resumed to be sure.
    async fn joining(&self, server: usize) -> Result<Joining, CallError> {
        self.servers.health(server).await?;
        let version = if self.lora.load(std::sync::atomic::Ordering::SeqCst) {
            let listed = self.servers.adapters(server).await?;
            let mut adapters = self.adapters[server].lock().expect("adapters lock");
            // what it holds is found out again at the next load
            adapters.base = None;
            listed.last().copied()
        } else {
            self.servers.version(server, D::ROUTES.version).await?
        };
        Ok(Joining {
            version,
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
        let lora = published.base_sha256.is_some();
        self.lora.store(lora, std::sync::atomic::Ordering::SeqCst);
        if lora {
            return self.load_adapter(server, published, folder).await;
        }
        let version = published.version.to_string();
        D::load(self.at(server), folder, &version).await?;
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
    /// With adapters, the request names the adapter of the version held, which is then the
    /// version of every token it brings back.
    async fn generate(
        &self,
        server: usize,
        request: &GenerateRequest,
        held: Option<PolicyVersion>,
    ) -> Result<Sampled, CallError> {
        let held = held.ok_or_else(unloaded)?;
        if !self.lora.load(std::sync::atomic::Ordering::SeqCst) {
            return D::generate(self.at(server), request, None).await;
        }
        let name = adapter_name(held);
        match D::generate(self.at(server), request, Some(&name)).await? {
            Sampled::Untagged(mut answer) => {
                answer.weight_version = Some(held.to_string());
                Ok(Sampled::Untagged(answer))
            }
            tagged => Ok(tagged),
        }
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
        Ok(self
            .version_text(server, route)
            .await?
            .and_then(|v| v.parse().ok()))
    }

    /// The weight version a server reports at `route`, as it says it.
    async fn version_text(&self, server: usize, route: &str) -> Result<Option<String>, CallError> {
        let url = self.url(server, route);
        let answer: WeightVersion = self
            .http
            .call(Method::GET, &url, None::<&()>, self.timeouts.probe)
            .await?;
        Ok(answer.weight_version)
    }

    /// The versions of this run's adapters a server lists in `/v1/models`, oldest first.
    async fn adapters(&self, server: usize) -> Result<Vec<PolicyVersion>, CallError> {
        let url = self.url(server, routes::MODELS);
        let answer: ModelList = self
            .http
            .call(Method::GET, &url, None::<&()>, self.timeouts.probe)
            .await?;
        let mut versions: Vec<PolicyVersion> = answer
            .data
            .iter()
            .filter(|m| m.parent.is_some())
            .filter_map(|m| m.id.strip_prefix(ADAPTER_PREFIX)?.parse().ok())
            .collect();
        versions.sort_unstable();
        Ok(versions)
    }
}

/// The id of a request on the server: the sample and how far it got, so that a resubmitted
/// sample is a new request.
pub(super) fn request_id(request: &GenerateRequest) -> String {
    format!("areal-{}-{}", request.sample_id, request.input_ids.len())
}

/// The seed a request names: the run's seed mixed with the sample's id. A server gives the
/// same tokens to the same input and seed (SGLang's `sampling_seed`, vLLM's `seed`), so each
/// sample of a group needs its own to draw its own tokens, and the same one every time to
/// draw them again.
pub(super) fn request_seed(request: &GenerateRequest) -> u64 {
    areal_sdk::mix_seed(request.sampling.seed, request.sample_id)
}
