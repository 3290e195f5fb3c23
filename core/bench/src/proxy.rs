//! `areal bench proxy`: what the agent proxy costs. Agents are threads of this process
//! speaking HTTP/1.1 over loopback as an OpenAI client does (one connection per request, as
//! the proxy serves them); the policy is a canned generator that answers at once (a tool call,
//! then the answer), so what is measured is the proxy's own part of a turn: HTTP, JSON, the
//! chat template, tokenizing, the episode's queue. Three tables:
//!
//! 1. a turn's latency through the proxy, one agent at a time and with 64 at once, against
//!    the same generator called directly;
//! 2. sessions per second (start, two turns, end) at each number of concurrent agents;
//! 3. a burst of `/rl/start_session` calls past what the run admits: how many get a session,
//!    how many a 429, and whether each 429 says when to come back.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use areal_core::{GroupRunner, GroupSpec, RewardService};
use areal_sdk::{
    Completion, FinishReason, GenerateRequest, Generator, PluginError, Reward, RewardInput,
    RewardVerifier, SamplingParams, TaskItem, Tokenizer, Verdict, VerifyContext, WeightUpdate,
};
use clap::Args;
use serde_json::{Value, json};

use crate::stats::{mean, percentile};

#[derive(Debug, Args)]
pub(crate) struct BenchProxyArgs {
    /// Sessions per measurement.
    #[arg(long, default_value_t = 2000)]
    sessions: usize,
    /// Numbers of concurrent agents.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    agents: Vec<usize>,
    /// `/rl/start_session` calls of the burst, at once, against 64 admitted episodes.
    #[arg(long, default_value_t = 256)]
    burst: usize,
    /// Also write the report (markdown) to this file.
    #[arg(long)]
    markdown: Option<std::path::PathBuf>,
}

/// A chat format of the ChatML kind for a character tokenizer.
const TEMPLATE: &str = "{%- if tools %}system: tools{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '\n' }}{% endif %}\
{%- for message in messages %}\
{%- if message.role == 'tool' %}{{- 'tool:\\n' + message.content + '\\n' }}\
{%- elif message.role == 'assistant' %}{{- 'assistant:\\n' + message.content + eos_token + '\\n' }}\
{%- else %}{{- message.role + ':\\n' + message.content + '\\n' }}\
{%- endif %}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- 'assistant:\\n' }}{% endif %}";

const CALL: &str = "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(6 * 7)\"}}\n</tool_call>";
const ANSWER: &str = "It is 42.";

/// Answers a session's first turn with a tool call and the next with the answer, at once.
struct Canned {
    tokenizer: Arc<dyn Tokenizer>,
    turns: Mutex<std::collections::HashMap<u64, usize>>,
}

#[areal_sdk::async_trait]
impl Generator for Canned {
    fn name(&self) -> &str {
        "canned"
    }
    async fn generate(&self, request: GenerateRequest) -> Result<Completion, PluginError> {
        let n = {
            let mut turns = self.turns.lock().expect("turns lock");
            let n = turns.entry(request.sample_id).or_default();
            *n += 1;
            *n
        };
        let text = if n % 2 == 1 { CALL } else { ANSWER };
        let mut c = Completion::empty(FinishReason::Stop);
        let stop = self.tokenizer.stop_token_ids()[0];
        for id in self.tokenizer.encode(text)?.into_iter().chain([stop]) {
            c.push(id, -0.1, 1);
        }
        Ok(c)
    }
    async fn update_weights(&self, _: WeightUpdate) -> Result<(), PluginError> {
        Ok(())
    }
}

/// Every answer right.
struct Right;

impl RewardVerifier for Right {
    fn name(&self) -> &str {
        "right"
    }
    fn verify(&self, _: &RewardInput, _: &VerifyContext) -> Result<Reward, PluginError> {
        Ok(Reward::new(1.0, Verdict::Accepted))
    }
}

/// One HTTP/1.1 call, a POST of `body` (a GET without one): the status, whether a
/// `Retry-After` came, the JSON body.
fn http(
    addr: SocketAddr,
    path: &str,
    key: &str,
    body: Option<&Value>,
) -> anyhow::Result<(u16, bool, Value)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    match body {
        Some(body) => {
            let body = body.to_string();
            write!(
                stream,
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )?;
        }
        None => write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?,
    }
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    let status: u16 = answer.get(9..12).context("no status")?.parse()?;
    let split = answer.find("\r\n\r\n").context("no body")?;
    let retry_after = answer[..split]
        .to_ascii_lowercase()
        .contains("\r\nretry-after:");
    let json = serde_json::from_str(&answer[split + 4..]).unwrap_or(Value::Null);
    Ok((status, retry_after, json))
}

/// The proxy, and episodes kept open for agents (`open` at a time) until stopped.
struct Rig {
    addr: SocketAddr,
    runner: Arc<GroupRunner>,
    runtime: tokio::runtime::Runtime,
}

impl Rig {
    fn new() -> anyhow::Result<Self> {
        let alphabet: String = (' '..='~').chain(['\n']).collect();
        let mut tokenizer = areal_model::char_tokenizer(&alphabet)?;
        tokenizer.set_chat_template(TEMPLATE)?;
        let tokenizer: Arc<dyn Tokenizer> = Arc::new(tokenizer);
        let options = areal_serve::AgentOptions {
            idle_s: 60.0,
            threads: 1,
            ..Default::default()
        };
        let agent = areal_serve::Agent::start(options, None)
            .map_err(|(key, why)| anyhow::anyhow!("episode.{key}: {why}"))?;
        let addr = agent.addr();
        let generator = Arc::new(Canned {
            tokenizer: tokenizer.clone(),
            turns: Mutex::new(Default::default()),
        });
        let rewards = RewardService::new(Arc::new(Right), 1, Duration::from_secs(30));
        let runner = Arc::new(
            GroupRunner::new(generator, tokenizer, rewards).with_episode(Arc::new(agent), vec![]),
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        Ok(Self {
            addr,
            runner,
            runtime,
        })
    }

    /// Keep `open` episodes waiting for agents until `stop`; counts those that ended.
    fn feed(&self, open: usize, stop: Arc<AtomicBool>, first_id: u64) -> Arc<AtomicU64> {
        let ended = Arc::new(AtomicU64::new(0));
        let (runner, counted) = (self.runner.clone(), ended.clone());
        self.runtime.spawn(async move {
            let permits = Arc::new(tokio::sync::Semaphore::new(open));
            let mut group_id = first_id;
            while !stop.load(Ordering::Relaxed) {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let (runner, counted) = (runner.clone(), counted.clone());
                let spec = GroupSpec {
                    group_id,
                    group_size: 1,
                    max_new_tokens: 4096,
                    sampling: SamplingParams::greedy(),
                    admitted_at: 1,
                };
                group_id += 1;
                tokio::spawn(async move {
                    let item = TaskItem {
                        id: format!("q{}", spec.group_id),
                        prompt: "What is 6 * 7?".into(),
                        reference: Value::Null,
                    };
                    if runner.run_group(spec, item).await.is_ok() {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(permit);
                });
            }
        });
        ended
    }
}

/// One agent's session: start (retrying a 429 after `retry`), two turns, end; each turn's
/// latency in ms.
fn session(addr: SocketAddr, retry: Duration) -> anyhow::Result<Vec<f64>> {
    let key = loop {
        let (status, _, answer) = http(
            addr,
            "/rl/start_session",
            "",
            Some(&json!({"task_id": "bench"})),
        )?;
        match status {
            200 => break answer["api_key"].as_str().context("a key")?.to_owned(),
            429 => std::thread::sleep(retry),
            other => anyhow::bail!("start_session answered {other}: {answer}"),
        }
    };
    let tools = json!([{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]);
    let mut messages = vec![json!({"role": "user", "content": "What is 6 * 7?"})];
    let mut latencies = Vec::with_capacity(2);
    for _ in 0..2 {
        let body = json!({"model": "policy", "messages": messages, "tools": tools});
        let start = Instant::now();
        let (status, _, answer) = http(addr, "/v1/chat/completions", &key, Some(&body))?;
        latencies.push(start.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(status == 200, "a turn answered {status}: {answer}");
        let message = answer["choices"][0]["message"].clone();
        let id = message["tool_calls"][0]["id"].clone();
        messages.push(message);
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "42\n"}));
    }
    let (status, _, answer) = http(addr, "/rl/end_session", &key, Some(&json!({})))?;
    anyhow::ensure!(status == 200, "end_session answered {status}: {answer}");
    Ok(latencies)
}

struct Measured {
    agents: usize,
    sessions: usize,
    seconds: f64,
    turns_ms: Vec<f64>,
}

/// `sessions` sessions by `agents` concurrent agents against episodes kept open for them.
fn measure(rig: &Rig, agents: usize, sessions: usize, first_id: u64) -> anyhow::Result<Measured> {
    let stop = Arc::new(AtomicBool::new(false));
    let _ended = rig.feed(agents, stop.clone(), first_id);
    let left = Arc::new(AtomicU64::new(sessions as u64));
    let turns = Arc::new(Mutex::new(Vec::with_capacity(sessions * 2)));
    let start = Instant::now();
    let threads: Vec<_> = (0..agents)
        .map(|_| {
            let (left, turns, addr) = (left.clone(), turns.clone(), rig.addr);
            std::thread::spawn(move || -> anyhow::Result<()> {
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let ms = session(addr, Duration::from_millis(1))?;
                    turns.lock().expect("turns lock").extend(ms);
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("an agent thread panicked"))??;
    }
    let seconds = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let turns_ms = std::mem::take(&mut *turns.lock().expect("turns lock"));
    // let the episodes kept open for more agents end
    Ok(Measured {
        agents,
        sessions,
        seconds,
        turns_ms,
    })
}

#[allow(clippy::print_stderr, reason = "progress on stderr")]
pub(super) fn run(args: BenchProxyArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.sessions > 0, "--sessions: at least 1");
    anyhow::ensure!(
        args.agents.iter().all(|&a| a > 0),
        "--agents: at least 1 each"
    );
    let rig = Rig::new()?;
    let mut report = String::from("## Agent proxy (`areal bench proxy`)\n\n");

    // the generator alone, on the same inputs as a turn
    let direct_ms: Vec<f64> = rig.runtime.block_on(async {
        let tokenizer = rig.runner.tokenizer().clone();
        let input = tokenizer
            .encode("system: tools python\nuser:\nWhat is 6 * 7?\nassistant:\n")
            .unwrap_or_default();
        let stop_token_ids = tokenizer.stop_token_ids();
        let mut out = Vec::with_capacity(2000);
        for k in 0..2000u64 {
            let request = GenerateRequest {
                sample_id: u64::MAX - k,
                input_ids: input.clone(),
                max_new_tokens: 4096,
                sampling: SamplingParams::greedy(),
                stop_token_ids: stop_token_ids.clone(),
            };
            let start = Instant::now();
            let _ = rig.runner.generator().generate(request).await;
            out.push(start.elapsed().as_secs_f64() * 1e3);
        }
        out
    });

    let mut first_id = 0;
    let mut rows = Vec::new();
    for &agents in &args.agents {
        eprintln!("{agents} agents, {} sessions...", args.sessions);
        let m = measure(&rig, agents, args.sessions, first_id)?;
        first_id += 1 << 32;
        rows.push(m);
    }
    report.push_str(
        "A turn is one `/v1/chat/completions` request and answer over loopback (a new connection \
         each); the policy answers at once, so a turn's latency is the proxy's own cost.\n\n\
         | agents at once | turn p50 ms | turn p99 ms | generator alone p50 / p99 ms | sessions/s |\n\
         |---:|---:|---:|---:|---:|\n",
    );
    for m in &rows {
        report.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.4} / {:.4} | {:.0} |\n",
            m.agents,
            percentile(&m.turns_ms, 50.0),
            percentile(&m.turns_ms, 99.0),
            percentile(&direct_ms, 50.0),
            percentile(&direct_ms, 99.0),
            m.sessions as f64 / m.seconds,
        ));
    }
    report.push_str(&format!(
        "\n(a session: start, two turns, end; {} sessions a row; mean turn {:.2} ms at 1 agent)\n",
        args.sessions,
        rows.first().map_or(0.0, |m| mean(&m.turns_ms))
    ));

    // a burst: 64 episodes admitted, `burst` agents ask at once
    eprintln!(
        "a burst of {} start_session calls against 64 admitted episodes...",
        args.burst
    );
    // the episodes left waiting by the last measurement are ended first
    loop {
        let (status, _, answer) = http(rig.addr, "/rl/start_session", "", Some(&json!({})))?;
        if status != 200 {
            break;
        }
        let key = answer["api_key"].as_str().unwrap_or_default();
        http(rig.addr, "/rl/end_session", key, Some(&json!({})))?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let _ended = rig.feed(64, stop.clone(), first_id);
    // let the 64 reach the proxy's queue of waiting episodes
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig_waiting(&rig)? < 64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let admitted = rig_waiting(&rig)?;
    let gate = Arc::new(std::sync::Barrier::new(args.burst));
    let started = Instant::now();
    let threads: Vec<_> = (0..args.burst)
        .map(|_| {
            let (gate, addr) = (gate.clone(), rig.addr);
            std::thread::spawn(move || {
                gate.wait();
                http(
                    addr,
                    "/rl/start_session",
                    "",
                    Some(&json!({"task_id": "burst"})),
                )
            })
        })
        .collect();
    let (mut ok, mut refused, mut with_retry_after, mut other) = (0, 0, 0, 0);
    let mut keys = Vec::new();
    for t in threads {
        let (status, retry_after, answer) = t
            .join()
            .map_err(|_| anyhow::anyhow!("a burst thread panicked"))??;
        match status {
            200 => {
                ok += 1;
                keys.push(answer["api_key"].as_str().unwrap_or_default().to_owned());
            }
            429 => {
                refused += 1;
                with_retry_after += usize::from(retry_after);
            }
            _ => other += 1,
        }
    }
    let burst_ms = started.elapsed().as_secs_f64() * 1e3;
    for key in keys {
        let _ = http(rig.addr, "/rl/end_session", &key, Some(&json!({})));
    }
    report.push_str(&format!(
        "\n| episodes admitted | start_session calls at once | sessions given | 429 | 429 with Retry-After | other | all answered in ms |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n| {admitted} | {} | {ok} | {refused} | {with_retry_after} | {other} | {burst_ms:.1} |\n",
        args.burst
    ));
    crate::publish(&report, args.markdown.as_deref())
}

/// Episodes waiting for an agent now (the proxy's `/health`).
fn rig_waiting(rig: &Rig) -> anyhow::Result<u64> {
    let (status, _, health) = http(rig.addr, "/health", "", None)?;
    anyhow::ensure!(status == 200, "/health answered {status}: {health}");
    Ok(health["waiting"].as_u64().unwrap_or(0))
}
