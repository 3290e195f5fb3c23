//! The agent proxy: any program written against OpenAI's API trains through `areal train`.
//!
//! `[episode] kind = "agent"` makes every sample a session of the proxy, an HTTP server the
//! episode plugin starts with the run. With `command`, each episode starts the user's program
//! with `OPENAI_BASE_URL` (the proxy) and `OPENAI_API_KEY` (its session's key), the task item
//! as JSON on its standard input; without, episodes wait for agents that run elsewhere to
//! take them with `POST /rl/start_session` (AReaL's online mode; 429 with `Retry-After` when
//! none waits, which is when the run's staleness bound admits no more).
//!
//! Each `/v1/chat/completions` request is one turn of the episode: its messages rendered with
//! the model's chat template, the policy's answer sampled token in, token out, with its
//! behaviour logprobs and versions, and written back in OpenAI's shape (tool calls read out of
//! the text in the model's format). Messages that extend what the client saw add only the
//! new ones after the tokens so far; a rewritten history splits the sample (see
//! [`session`]). `/rl/set_reward` rewards the session's last interaction; without one, the
//! run's `[reward]` grades the last answer (or it counts 0, by `without_reward`).
//!
//! A program is contained with every process it starts (a subreaper's tree, [`warden`]),
//! bounded in processes (`max_processes`), memory (`memory_mb`) and the time it takes between
//! answers (`idle_s`: the policy's own time does not count); one that crashes, hangs or sends more
//! than its turns costs its episode (verdict `error`, the sample is not trained on), never the
//! run. The proxy listens on loopback unless given a token; a session key opens only its
//! session, an ended session is refused, bodies are bounded.

mod http;
mod hub;
mod openai;
mod program;
mod session;
mod warden;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use areal_sdk::tool_calls::ToolCallFormat;
use areal_sdk::{
    BuildContext, Episode, EpisodeContext, EpisodeTraits, PluginConfig, PluginError, Reward,
    Verdict, register_episode,
};
use serde::Deserialize;

use crate::fleet::ClientRuntime;
use crate::security::{Listen, client_token};
use hub::{Call, Hub, Opened};
use program::{Exit, Launch, Program};
use session::Session;

/// The name the episode is registered under (`[episode] kind = "agent"`).
pub const AGENT: &str = "agent";

/// What a session without a reward counts as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WithoutReward {
    /// The run's `[reward]` grades the last answer's content (the default).
    #[default]
    Grade,
    /// A reward of 0.
    Zero,
}

/// `[episode] kind = "agent"`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentOptions {
    /// The program to start for each episode (`["python3", "my_agent.py"]`); none (or an
    /// empty list): agents take sessions with `/rl/start_session` (AReaL's online mode).
    pub command: Option<Vec<String>>,
    /// A program started once with the run that takes sessions itself with
    /// `/rl/start_session` (an agent service: one process serving many episodes, without a
    /// program's start-up per episode). It gets `AREAL_PROXY_URL`, `AREAL_PROXY_KEY` (the
    /// admin key, empty when there is none) and `OPENAI_BASE_URL`; if it exits, the episodes
    /// waiting for it fail with its status and output. Not with `command`.
    pub service: Option<Vec<String>>,
    /// Where the proxy listens: `127.0.0.1:0` (loopback, a free port) by default; any other
    /// address needs a token.
    pub listen: String,
    /// The proxy's token (its admin key for `/rl/start_session`), read from this file; else
    /// `AREAL_TOKEN`. Needed to listen off loopback.
    pub token_file: Option<PathBuf>,
    /// The most seconds a program may take between answers (from its start to its first
    /// request, between an answer and its next request, from the last to its exit); the
    /// policy's time generating does not count. For agents from elsewhere, how long a
    /// session may sit without a call. By default 300.
    pub idle_s: f64,
    /// The program's memory in MiB: each of its processes' address space (`ulimit -v`), and
    /// the resident memory of all the processes it runs together; 0: no bound. By default
    /// 4096.
    pub memory_mb: u64,
    /// The most processes a program may run at once, itself and all it started (a program
    /// past it is killed with them). By default 256.
    pub max_processes: usize,
    /// A session that ends without `/rl/set_reward`: `grade` (the run's `[reward]` grades
    /// the last answer, the default) or `zero`.
    pub without_reward: WithoutReward,
    /// How the model writes tool calls, to read them out of its answers: `hermes` (default),
    /// `llama3-json`, `code-block`.
    pub tool_call_format: ToolCallFormat,
    /// Turns a session may have at most; more are refused (429). By default 64.
    pub max_turns: usize,
    /// The program's working folder (by default the run's).
    pub workdir: Option<PathBuf>,
    /// More environment variables for the program.
    pub env: BTreeMap<String, String>,
    /// Threads of the proxy's HTTP server. By default 2.
    pub threads: usize,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            command: None,
            service: None,
            listen: "127.0.0.1:0".into(),
            token_file: None,
            idle_s: 300.0,
            memory_mb: 4096,
            max_processes: 256,
            without_reward: WithoutReward::Grade,
            tool_call_format: ToolCallFormat::Hermes,
            max_turns: 64,
            workdir: None,
            env: BTreeMap::new(),
            threads: 2,
        }
    }
}

/// The agent episode: the proxy's server, and each episode a session of it.
pub struct Agent {
    options: AgentOptions,
    hub: Arc<Hub>,
    addr: SocketAddr,
    /// The agent service, if any (killed with the plugin).
    _service: Option<Program>,
    /// The server's runtime (the server stops with it).
    _runtime: ClientRuntime,
}

impl Agent {
    /// Start the proxy as `options` say, with `token` as its admin key.
    pub fn start(
        mut options: AgentOptions,
        token: Option<String>,
    ) -> Result<Self, (String, String)> {
        let bad = |key: &str, message: String| (key.to_owned(), message);
        // (an empty list says none, as `--set 'episode.service=[]'` does)
        options.command = options.command.filter(|c| !c.is_empty());
        options.service = options.service.filter(|c| !c.is_empty());
        for (key, command) in [("command", &options.command), ("service", &options.service)] {
            let Some(first) = command.as_ref().and_then(|c| c.first()) else {
                continue;
            };
            if !found(first) {
                return Err(bad(
                    key,
                    format!("{first} is not a file here nor a program on PATH"),
                ));
            }
        }
        if options.command.is_some() && options.service.is_some() {
            return Err(bad(
                "service",
                "either a program per episode (command) or one for the run (service), not both"
                    .into(),
            ));
        }
        if !(options.idle_s.is_finite() && options.idle_s > 0.0) {
            return Err(bad(
                "idle_s",
                format!("{} must be positive", options.idle_s),
            ));
        }
        if options.max_turns == 0 {
            return Err(bad("max_turns", "must be at least 1".into()));
        }
        let addr: SocketAddr = options
            .listen
            .parse()
            .map_err(|e| bad("listen", format!("{}: {e}", options.listen)))?;
        let listen = Listen::new(addr, token.clone());
        let runtime = ClientRuntime::new("areal-proxy", options.threads.max(1))
            .map_err(|e| bad(e.key, e.explained()))?;
        let hub = Arc::new(Hub::default());
        let (listener, addr) = runtime
            .get()
            .block_on(crate::security::bind(&listen))
            .map_err(|e| bad("listen", e.to_string()))?;
        let admin = token.filter(|t| !t.is_empty());
        let served = Arc::new(http::Served {
            hub: hub.clone(),
            admin: admin.clone(),
            retry_after: Duration::from_secs(1),
        });
        runtime.get().spawn(crate::server::serve_http(
            listener,
            http::router(served),
            None,
            std::future::pending(),
        ));
        tracing::info!(target: "areal::proxy", %addr, "agent proxy listening (OpenAI's API at /v1, AReaL's at /rl)");
        let service = match &options.service {
            None => None,
            Some(command) => {
                let mut env = vec![
                    ("AREAL_PROXY_URL".to_owned(), format!("http://{addr}")),
                    ("AREAL_PROXY_KEY".to_owned(), admin.unwrap_or_default()),
                    ("OPENAI_BASE_URL".to_owned(), format!("http://{addr}/v1")),
                ];
                env.extend(options.env.iter().map(|(k, v)| (k.clone(), v.clone())));
                let (service, exit) = Program::start(Launch {
                    command,
                    env,
                    stdin: Vec::new(),
                    memory_mb: Some(options.memory_mb).filter(|&m| m > 0),
                    max_processes: options.max_processes,
                    workdir: options.workdir.as_deref(),
                })
                .map_err(|e| bad("service", format!("cannot start {}: {e}", command[0])))?;
                let (hub, output) = (hub.clone(), service.output_handle());
                let breaches = service.breaches();
                runtime.get().spawn(async move {
                    let exit = exit.await;
                    let how = match (breaches.get(), exit) {
                        (Some(breach), _) => format!("{breach} and was killed"),
                        (None, Ok(Ok(status))) => program::describe(&status),
                        (None, Ok(Err(e))) => format!("could not be waited for: {e}"),
                        (None, Err(_)) => "is gone".into(),
                    };
                    let output = program::final_output(&output);
                    let why = with_output(format!("the agent service {how}"), &output);
                    // (not when the proxy stopped it)
                    if hub.shut(why.clone()) {
                        tracing::error!(target: "areal::proxy", "{why}");
                    }
                });
                Some(service)
            }
        };
        Ok(Self {
            options,
            hub,
            addr,
            _service: service,
            _runtime: runtime,
        })
    }

    /// Where the proxy listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serve session `opened`'s calls with `ctx` until its program exits (or goes quiet for
    /// `idle_s`), or for an agent from elsewhere, until it ends the session (or goes quiet).
    async fn serve(
        &self,
        ctx: &mut dyn EpisodeContext,
        mut opened: Opened,
        program: Option<(Program, Exit)>,
    ) -> Result<Reward, PluginError> {
        let mut session = Session::new(
            &opened.id,
            self.options.tool_call_format,
            self.options.max_turns,
        );
        let idle = Duration::from_secs_f64(self.options.idle_s);
        let online = program.is_none();
        let (program, mut exit) = program.unzip();
        // (once the session is closed, only the program's exit is waited for)
        let mut closed = false;
        let status = loop {
            let exited = async {
                match exit.as_mut() {
                    Some(exit) => Some(exit.await.unwrap_or_else(|_| {
                        Err(std::io::Error::other("the waiting thread is gone"))
                    })),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                status = exited => break Ended::Exited(status),
                call = opened.calls.recv(), if !closed => match call {
                    Some(Call::Chat { asked, reply }) => {
                        let answer = session.chat(ctx, asked).await;
                        let _ = reply.send(answer);
                        if session.broken.is_some() {
                            break Ended::Broken;
                        }
                    }
                    Some(Call::SetReward { reward, interaction_id, reply }) => {
                        let _ = reply.send(session.set_reward(reward, interaction_id.as_deref()));
                    }
                    Some(Call::End { reply }) => {
                        self.hub.close(&opened.key);
                        let _ = reply.send(());
                        if online {
                            break Ended::Closed;
                        }
                        closed = true;
                    }
                    None if online => break Ended::Closed,
                    None => closed = true,
                },
                () = tokio::time::sleep(idle) => break Ended::Idle,
            }
        };
        self.hub.close(&opened.key);
        // (what the warden killed the program for, if it did)
        let breach = program.as_ref().and_then(Program::breach);
        let failure = match status {
            Ended::Broken => {
                if let Some(p) = &program {
                    p.kill();
                }
                return Err(session.broken.take().expect("broken sessions say why"));
            }
            Ended::Exited(None) | Ended::Closed => None,
            Ended::Exited(Some(_)) if breach.is_some() => {
                breach.map(|why| format!("the agent program {why} and was killed"))
            }
            Ended::Exited(Some(Ok(s))) if s.success() => None,
            Ended::Exited(Some(Ok(s))) => {
                Some(format!("the agent program {}", program::describe(&s)))
            }
            Ended::Exited(Some(Err(e))) => Some(format!("waiting for the agent program: {e}")),
            Ended::Idle => {
                if let Some(p) = &program {
                    p.kill();
                }
                let who = if online {
                    "the agent"
                } else {
                    "the agent program"
                };
                Some(format!(
                    "{who} did nothing for {} s (idle_s) and was {}",
                    self.options.idle_s,
                    if online { "dropped" } else { "killed" }
                ))
            }
        };
        let reward = match (failure, session.final_reward(), self.options.without_reward) {
            (Some(what), _, _) => {
                let output = program.as_ref().map(Program::output).unwrap_or_default();
                let reward =
                    by_agent(0.0, Verdict::Error).with_detail("error", with_output(what, &output));
                if output.is_empty() {
                    reward
                } else {
                    reward.with_detail("output", output)
                }
            }
            (None, Some(value), _) => {
                let verdict = if value >= 1.0 {
                    Verdict::Accepted
                } else if value > 0.0 {
                    Verdict::Partial
                } else {
                    Verdict::WrongAnswer
                };
                by_agent(value, verdict)
            }
            (None, None, WithoutReward::Zero) => by_agent(0.0, Verdict::NoAnswer),
            (None, None, WithoutReward::Grade) if session.tally.turns == 0 => {
                by_agent(0.0, Verdict::NoAnswer)
                    .with_detail("message", "the agent asked for no completion")
            }
            (None, None, WithoutReward::Grade) => ctx.verify(session.last_content()).await?,
        };
        Ok(reward
            .with_detail("turns", session.tally.turns)
            .with_detail("splits", session.tally.splits)
            .with_detail("session_id", session.id())
            .with_detail("interactions", session.interactions()))
    }
}

/// A reward of `value` with `verdict` that the agent episode itself gives.
fn by_agent(value: f64, verdict: Verdict) -> Reward {
    let mut reward = Reward::new(value, verdict);
    reward.provenance.verifier = AGENT.into();
    reward
}

impl Drop for Agent {
    fn drop(&mut self) {
        // the service is stopped with the proxy, not gone wrong
        self.hub.shut("the proxy stopped".into());
    }
}

/// How a session ended.
enum Ended {
    /// Its program exited (`None`: there was none).
    Exited(Option<std::io::Result<std::process::ExitStatus>>),
    /// It was ended (`/rl/end_session` from an agent elsewhere).
    Closed,
    /// Nothing came for `idle_s`.
    Idle,
    /// The policy failed to generate a turn ([`Session::broken`]).
    Broken,
}

/// `what` happened, with the end of the program's `output` (its last 400 characters).
fn with_output(what: String, output: &str) -> String {
    match output.char_indices().rev().nth(400) {
        _ if output.is_empty() => what,
        Some((at, _)) => format!("{what}; its output ends: …{}", &output[at..]),
        None => format!("{what}; its output ends: {output}"),
    }
}

/// Whether `program` names a file, or a program on `PATH`.
fn found(program: &str) -> bool {
    if program.contains('/') {
        return std::path::Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Closes a session when its episode ends, however it ends (a run that stops drops it).
struct Closing<'a>(&'a Hub, String);

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.0.close(&self.1);
    }
}

#[areal_sdk::async_trait]
impl Episode for Agent {
    fn name(&self) -> &str {
        AGENT
    }

    fn traits(&self) -> EpisodeTraits {
        EpisodeTraits::OUTSIDE_PROGRAM
    }

    async fn run(&self, ctx: &mut dyn EpisodeContext) -> Result<Reward, PluginError> {
        let opened = self.hub.open(4);
        let _closing = Closing(&self.hub, opened.key.clone());
        let Some(command) = &self.options.command else {
            let item = serde_json::to_value(ctx.item())
                .map_err(|e| PluginError::failed(AGENT, format!("the item as JSON: {e}")))?;
            let task_id = self
                .hub
                .wait_for_agent(&opened, item)
                .await
                .map_err(|why| PluginError::failed(AGENT, why))?;
            tracing::debug!(target: "areal::proxy", session = opened.id, task_id, "an agent took a session");
            return self.serve(ctx, opened, None).await;
        };
        let item = serde_json::to_vec(ctx.item())
            .map_err(|e| PluginError::failed(AGENT, format!("the item as JSON: {e}")))?;
        let mut env = vec![
            (
                "OPENAI_BASE_URL".to_owned(),
                format!("http://{}/v1", self.addr),
            ),
            ("OPENAI_API_KEY".to_owned(), opened.key.clone()),
            (
                "AREAL_PROXY_URL".to_owned(),
                format!("http://{}", self.addr),
            ),
            ("AREAL_SESSION_ID".to_owned(), opened.id.clone()),
        ];
        env.extend(self.options.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let started = Program::start(Launch {
            command,
            env,
            stdin: item,
            memory_mb: Some(self.options.memory_mb).filter(|&m| m > 0),
            max_processes: self.options.max_processes,
            workdir: self.options.workdir.as_deref(),
        })
        .map_err(|e| PluginError::failed(AGENT, format!("cannot start {}: {e}", command[0])))?;
        self.serve(ctx, opened, Some(started)).await
    }
}

fn build(config: &PluginConfig, _: &BuildContext) -> Result<Arc<dyn Episode>, PluginError> {
    let options: AgentOptions = config.parse()?;
    let token = client_token(config, options.token_file.as_deref())?;
    let agent = Agent::start(options, token).map_err(|(key, why)| config.invalid(&key, why))?;
    Ok(Arc::new(agent))
}

register_episode!(
    AGENT,
    "each sample a session of an OpenAI-compatible proxy: `command = [\"python3\", \"agent.py\"]` runs a program per episode, or agents elsewhere take sessions with /rl/start_session",
    build
);
