//! The agent proxy over real sockets: agent programs (Python, standard library) run by the
//! `agent` episode for each sample of a group, a scripted policy behind it, and every route
//! called as clients call it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use areal_core::{GroupRunner, GroupSpec, RewardService};
use areal_sdk::{
    BuildContext, Completion, Episode, EpisodePlugin, FinishReason, GenerateRequest, Generator,
    PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, SamplingParams, TaskItem,
    Tokenizer, TrajectoryGroup, Verdict, VerifyContext, WeightUpdate,
};
use serde_json::{Value, json};

/// Says the turns of `script` in order, per sample, each ending with the stop token; an
/// input of `context` tokens or more is refused as the real generators refuse it.
struct Scripted {
    script: Vec<String>,
    said: Mutex<HashMap<u64, usize>>,
    tokenizer: Arc<dyn Tokenizer>,
    context: usize,
}

#[areal_sdk::async_trait]
impl Generator for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    async fn generate(&self, request: GenerateRequest) -> Result<Completion, PluginError> {
        if request.input_ids.len() >= self.context {
            return Err(PluginError::context_exceeded(
                "scripted",
                request.input_ids.len(),
                self.context,
            ));
        }
        let turn = {
            let mut said = self.said.lock().unwrap();
            let n = said.entry(request.sample_id).or_default();
            *n += 1;
            self.script[(*n - 1).min(self.script.len() - 1)].clone()
        };
        let mut c = Completion::empty(FinishReason::Stop);
        let stop = self.tokenizer.stop_token_ids()[0];
        for id in self.tokenizer.encode(&turn)?.into_iter().chain([stop]) {
            if c.len() == request.max_new_tokens {
                c.finish_reason = FinishReason::Length;
                break;
            }
            c.push(id, -0.5, 3);
        }
        Ok(c)
    }
    async fn update_weights(&self, _: WeightUpdate) -> Result<(), PluginError> {
        Ok(())
    }
}

/// Accepted when the text graded says 42.
struct SaysFortyTwo;

impl RewardVerifier for SaysFortyTwo {
    fn name(&self) -> &str {
        "says-42"
    }
    fn verify(&self, input: &RewardInput, _: &VerifyContext) -> Result<Reward, PluginError> {
        Ok(if input.completion.contains("42") {
            Reward::new(1.0, Verdict::Accepted)
        } else {
            Reward::new(0.0, Verdict::WrongAnswer)
        })
    }
}

/// ChatML-like markup for a character tokenizer: the tools named in a system turn, tool
/// answers in `<tool_response>` blocks, assistant turns ended by `eos_token`; an assistant
/// message's calls written as the policy writes them.
const TEMPLATE: &str = "{%- if tools %}system: tools{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '\n' }}{% endif %}\
{%- for message in messages %}\
{%- if message.role == 'tool' %}\
{%- if messages[loop.index0 - 1].role != 'tool' %}user:{% endif %}\
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}\
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '\\n' }}{% endif %}\
{%- elif message.role == 'assistant' %}{{- 'assistant:\\n' + message.content }}\
{%- for call in message.tool_calls or [] %}{{ '\\n<tool_call>\\n' + (call.function | tojson) + '\\n</tool_call>' }}{% endfor %}\
{{- eos_token + '\\n' }}\
{%- else %}{{- message.role + ':\\n' + message.content + '\\n' }}\
{%- endif %}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- 'assistant:\\n' }}{% endif %}";

fn tokenizer() -> Arc<dyn Tokenizer> {
    let alphabet: String = (' '..='~').chain(['\n']).collect();
    let mut tokenizer = areal_model::char_tokenizer(&alphabet).unwrap();
    tokenizer.set_chat_template(TEMPLATE).unwrap();
    Arc::new(tokenizer)
}

fn call(a: u32, b: u32) -> String {
    let call = json!({"name": "python", "arguments": {"code": format!("print({a} * {b})")}});
    format!("<tool_call>\n{call}\n</tool_call>")
}

fn agent_file(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/agents")
        .join(name)
        .display()
        .to_string()
}

/// The `agent` episode with `options`.
fn agent(options: Value) -> Arc<dyn Episode> {
    let mut config = PluginConfig::new("episode", "agent");
    for (k, v) in options.as_object().unwrap().clone() {
        config = config.with(&k, v);
    }
    EpisodePlugin::build_from(&config, &BuildContext::new(0, 1)).expect("the agent episode")
}

/// A runner of `episode` on a policy that says `script`.
fn runner(script: &[String], episode: Arc<dyn Episode>) -> Arc<GroupRunner> {
    runner_of(scripted(script, usize::MAX), episode)
}

/// A policy that says `script`, within a context of `context` tokens.
fn scripted(script: &[String], context: usize) -> Arc<dyn Generator> {
    Arc::new(Scripted {
        script: script.to_vec(),
        said: Mutex::new(HashMap::new()),
        tokenizer: tokenizer(),
        context,
    })
}

/// A runner of `episode` on `generator`.
fn runner_of(generator: Arc<dyn Generator>, episode: Arc<dyn Episode>) -> Arc<GroupRunner> {
    let tokenizer = tokenizer();
    let rewards = RewardService::new(Arc::new(SaysFortyTwo), 1, Duration::from_secs(30));
    Arc::new(GroupRunner::new(generator, tokenizer, rewards).with_episode(episode, Vec::new()))
}

fn spec(group_size: usize) -> GroupSpec {
    GroupSpec {
        group_id: 0,
        group_size,
        max_new_tokens: 4096,
        sampling: SamplingParams::greedy(),
        admitted_at: 3,
    }
}

fn item() -> TaskItem {
    TaskItem {
        id: "q".into(),
        prompt: "What is 6 * 7?".into(),
        reference: Value::Null,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `group_size` episodes of `episode` on a policy that says `script`.
fn run(
    script: &[String],
    episode: Arc<dyn Episode>,
    group_size: usize,
) -> (Result<TrajectoryGroup, PluginError>, Arc<GroupRunner>) {
    let runner = runner(script, episode);
    let group = runtime().block_on(runner.run_group(spec(group_size), item()));
    (group, runner)
}

fn counted(runner: &GroupRunner) -> (u64, u64, u64) {
    let c = &runner.counters;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::SeqCst);
    (
        load(&c.retokenization_checked),
        load(&c.retokenization_mismatches),
        load(&c.retokenization_drift),
    )
}

fn program(flags: &[&str]) -> Value {
    let mut command = vec!["python3".to_owned(), agent_file("stdlib_agent.py")];
    command.extend(flags.iter().map(|f| (*f).to_owned()));
    json!(command)
}

/// Every sample is the program's session: its messages rendered with the chat template, the
/// policy's turns sampled in them, nothing rendered twice; the reward the program set.
#[test]
fn an_agent_program_is_trained_on_exactly_what_the_policy_sampled() {
    let tokenizer = tokenizer();
    let script = vec![call(6, 7), "It is 42.".to_owned()];
    for flags in [&[][..], &["--stream"][..]] {
        let episode = agent(json!({"command": program(flags)}));
        let (group, runner) = run(&script, episode, 2);
        let group = group.expect("the group");
        assert!(group.prompt_ids.is_empty(), "the program writes the prompt");
        assert_eq!(group.samples.len(), 2);
        assert_eq!(counted(&runner), (2, 0, 0), "checked, mismatched, drifted");
        for sample in &group.samples {
            assert_eq!(sample.reward.value, 1.0, "{:?}", sample.reward);
            assert_eq!(sample.reward.verdict, Verdict::Accepted);
            assert_eq!(sample.reward.provenance.details["turns"], 2);
            assert_eq!(sample.reward.provenance.details["splits"], 0);
            let c = &sample.completion;
            let text = tokenizer.decode_verbatim(&c.token_ids).unwrap();
            assert_eq!(
                text,
                format!(
                    "system: tools python\nuser:\nWhat is 6 * 7?\nassistant:\n{}<eos>\nuser:\n\
                     <tool_response>\n42\n\n</tool_response>\nassistant:\nIt is 42.<eos>",
                    call(6, 7)
                )
            );
            // exactly the policy's two turns are trained on, with their logprobs and version
            let sampled: String = (0..c.len())
                .filter(|&i| c.is_sampled(i))
                .map(|i| tokenizer.decode_verbatim(&c.token_ids[i..=i]).unwrap())
                .collect();
            assert_eq!(sampled, format!("{}<eos>It is 42.<eos>", call(6, 7)));
            assert!(
                (0..c.len())
                    .filter(|&i| c.is_sampled(i))
                    .all(|i| { c.versions[i] == 3 && c.behaviour_logprobs[i] == -0.5 })
            );
        }
    }
}

/// Without `/rl/set_reward` the run's verifier grades the last answer; with
/// `without_reward = "zero"` it counts 0.
#[test]
fn a_session_without_a_reward_is_graded_by_the_runs_verifier() {
    let script = vec![call(6, 7), "It is 42.".to_owned()];
    let graded = agent(json!({"command": program(&["--no-reward"])}));
    let group = run(&script, graded, 1).0.unwrap();
    assert_eq!(group.samples[0].reward.verdict, Verdict::Accepted);
    assert_eq!(group.samples[0].reward.provenance.verifier, "says-42");
    let zero = agent(json!({"command": program(&["--no-reward"]), "without_reward": "zero"}));
    let group = run(&script, zero, 1).0.unwrap();
    assert_eq!(group.samples[0].reward.value, 0.0);
    assert_eq!(group.samples[0].reward.verdict, Verdict::NoAnswer);
}

/// A client that rewrites the history its next turn reads splits its session: the sample so
/// far is one sample, the rest another, both with the episode's id and reward; no token is
/// rendered twice and the template check still holds for each.
#[test]
fn a_rewritten_history_splits_the_session_into_samples() {
    let tokenizer = tokenizer();
    let script = vec![call(6, 7), "It is 42.".to_owned()];
    let episode = agent(json!({"command": program(&["--rewrite"])}));
    let (group, runner) = run(&script, episode, 1);
    let group = group.unwrap();
    assert_eq!(group.samples.len(), 2, "one episode, split in two");
    assert_eq!(group.samples[0].sample_id, group.samples[1].sample_id);
    let first = tokenizer
        .decode_verbatim(&group.samples[0].completion.token_ids)
        .unwrap();
    let second = tokenizer
        .decode_verbatim(&group.samples[1].completion.token_ids)
        .unwrap();
    assert_eq!(
        first,
        format!(
            "system: tools python\nuser:\nWhat is 6 * 7?\nassistant:\n{}<eos>",
            call(6, 7)
        )
    );
    assert!(
        second
            .starts_with("system: tools python\nuser:\nWhat is 6 * 7? Use the tool.\nassistant:\n"),
        "{second}"
    );
    assert!(second.ends_with("assistant:\nIt is 42.<eos>"), "{second}");
    for sample in &group.samples {
        assert_eq!(sample.reward.value, 1.0);
        assert_eq!(sample.reward.provenance.details["splits"], 1);
    }
    assert_eq!(counted(&runner), (1, 0, 0));
}

/// A program that crashes, hangs, or eats memory costs its own episode, with the reason and
/// the end of its output; the run (here, the group's call) goes on.
#[test]
fn crashing_hanging_and_hoarding_programs_cost_only_their_episode() {
    let script = vec!["It is 42.".to_owned()];
    let cases = [
        (
            json!({"command": ["python3", "-c", "import sys; print('bad things'); sys.exit(3)"]}),
            "exited with status 3",
            Some("bad things"),
        ),
        (
            json!({"command": ["python3", "-c", "import time; time.sleep(600)"], "idle_s": 1.0}),
            "did nothing for 1 s (idle_s) and was killed",
            None,
        ),
        (
            json!({
                "command": ["python3", "-c", "x = bytearray(2 << 30)"],
                "memory_mb": 256,
            }),
            "exited with status 1",
            Some("MemoryError"),
        ),
    ];
    for (options, why, output) in cases {
        let (group, _) = run(&script, agent(options), 1);
        let e = group.expect_err("the episode is lost").to_string();
        assert!(e.contains(why), "{e}");
        if let Some(output) = output {
            let (_, said) = e.split_once("its output ends: ").expect("the output's end");
            assert!(said.contains(output), "{e}");
        }
    }
    // the same episode plugin goes on serving: a good program after a bad one
    let episode = agent(json!({"command": program(&[]), "idle_s": 30.0}));
    let group = run(&[call(6, 7), "It is 42.".to_owned()], episode, 1)
        .0
        .unwrap();
    assert_eq!(group.samples[0].reward.value, 1.0);
}

/// A program that floods (megabytes on its output, requests past its turns) is bounded: the
/// output is drained and cut, the requests past `max_turns` refused, the episode ends.
#[test]
fn a_flooding_program_is_bounded() {
    let flood = r#"
import json, os, sys, urllib.request, urllib.error
sys.stdout.write("x" * (20 << 20)); sys.stdout.flush()
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
codes = []
for _ in range(5):
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(base + "/chat/completions", data=body,
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req).read(); codes.append(200)
    except urllib.error.HTTPError as e:
        codes.append(e.code)
print("codes", codes, file=sys.stderr)
sys.exit(0 if codes == [200, 200, 429, 429, 429] else 9)
"#;
    let episode = agent(json!({"command": ["python3", "-c", flood], "max_turns": 2}));
    let group = run(&["It is 42.".to_owned()], episode, 1).0.unwrap();
    // each request repeated the same history: the second split the sample
    assert_eq!(group.samples.len(), 2);
    assert_eq!(group.samples[1].reward.verdict, Verdict::Accepted);
}

/// A policy that cannot generate.
struct Broken;

#[areal_sdk::async_trait]
impl Generator for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    async fn generate(&self, _: GenerateRequest) -> Result<Completion, PluginError> {
        Err(PluginError::failed("broken", "the device fell off"))
    }
    async fn update_weights(&self, _: WeightUpdate) -> Result<(), PluginError> {
        Ok(())
    }
}

/// A turn the policy cannot generate is answered 503 and ends the session with the
/// generator's error, as a failed generation ends any episode (the messages already appended
/// are answered by no turn: a retry cannot go on from there).
#[test]
fn a_turn_the_policy_cannot_generate_ends_the_session_with_its_error() {
    let probe = r#"
import json, os, sys, urllib.request, urllib.error
body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
try:
    urllib.request.urlopen(req)
except urllib.error.HTTPError as e:
    print(e.code, json.load(e)["error"]["message"])
"#;
    let episode = agent(json!({"command": ["python3", "-c", probe]}));
    let rewards = RewardService::new(Arc::new(SaysFortyTwo), 1, Duration::from_secs(30));
    let runner = Arc::new(
        GroupRunner::new(Arc::new(Broken), tokenizer(), rewards).with_episode(episode, Vec::new()),
    );
    let e = runtime()
        .block_on(runner.run_group(spec(1), item()))
        .expect_err("the session ends with the error")
        .to_string();
    assert!(e.contains("the device fell off"), "{e}");
}

/// A bare HTTP/1.1 call with `key`: the status, the headers and the body.
async fn http(url: &str, key: Option<&str>, body: Option<&str>) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let head = match body {
        Some(b) => format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        ),
        None => format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"),
    };
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    let split = answer.find("\r\n\r\n").unwrap();
    (
        status,
        answer[..split].to_ascii_lowercase(),
        answer[split + 4..].to_owned(),
    )
}

/// An `agent` episode for agents from elsewhere on a policy that says `script`: the proxy's
/// URL and the runner.
fn online(script: &[String]) -> (String, Arc<GroupRunner>) {
    online_on(scripted(script, usize::MAX))
}

/// The same on `generator`.
fn online_on(generator: Arc<dyn Generator>) -> (String, Arc<GroupRunner>) {
    let started = areal_serve::Agent::start(areal_serve::AgentOptions::default(), None).unwrap();
    let proxy = format!("http://{}", started.addr());
    (proxy, runner_of(generator, Arc::new(started)))
}

/// A group of one episode of `runner`, running (inside a runtime).
fn one_episode(
    runner: &Arc<GroupRunner>,
) -> tokio::task::JoinHandle<Result<TrajectoryGroup, PluginError>> {
    let runner = runner.clone();
    tokio::spawn(async move { runner.run_group(spec(1), item()).await })
}

/// A session of the proxy at `proxy`, once the run has admitted an episode: its key.
async fn take_session(proxy: &str) -> String {
    loop {
        let (status, _, body) = http(&format!("{proxy}/rl/start_session"), None, Some("{}")).await;
        if status == 200 {
            return json_of(&body)["api_key"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Agents from elsewhere (no `command`): `/rl/start_session` hands out the episodes the run
/// admitted, 429 with `Retry-After` when none waits; every route as a client calls it; a key
/// opens only its own session; an ended session is refused.
#[test]
fn agents_from_elsewhere_take_the_sessions_the_run_admits() {
    let token = "admin-secret";
    let options = areal_serve::AgentOptions {
        idle_s: 30.0,
        ..Default::default()
    };
    let started = areal_serve::Agent::start(options, Some(token.to_owned())).unwrap();
    let proxy = format!("http://{}", started.addr());
    let episode: Arc<dyn Episode> = Arc::new(started);
    let script = vec![call(6, 7), "It is 42.".to_owned()];
    let runner = runner(&script, episode);
    let rt = runtime();
    rt.block_on(async {
        let start = format!("{proxy}/rl/start_session");
        // nothing admitted yet: 429, Retry-After
        let (status, head, body) = http(&start, Some(token), Some("{\"task_id\": \"t\"}")).await;
        assert_eq!(status, 429, "{body}");
        assert!(head.contains("retry-after: 1"), "{head}");
        assert_eq!(json_of(&body)["error"]["type"], "rate_limit_error");
        // the admin key is needed
        let (status, _, _) = http(&start, None, Some("{}")).await;
        assert_eq!(status, 401);

        let group = tokio::spawn({
            let runner = runner.clone();
            async move { runner.run_group(spec(2), item()).await }
        });
        let mut keys = Vec::new();
        while keys.len() < 2 {
            let (status, _, body) = http(&start, Some(token), Some("{\"task_id\": \"t\"}")).await;
            if status == 200 {
                let answer = json_of(&body);
                assert!(answer["session_id"].as_str().unwrap().starts_with("sess-"));
                keys.push(answer["api_key"].as_str().unwrap().to_owned());
            } else {
                assert_eq!(status, 429);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert!(keys[0].starts_with("sk-sess-") && keys[0] != keys[1]);
        // both admitted episodes are taken: the next is refused
        let (status, _, _) = http(&start, Some(token), Some("{}")).await;
        assert_eq!(status, 429);

        let chat = format!("{proxy}/v1/chat/completions");
        let first = json!({
            "model": "policy",
            "messages": [{"role": "user", "content": "What is 6 * 7?"}],
            "tools": [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}],
        });
        // no key, a wrong key, the admin key: refused
        for key in [None, Some("sk-sess-nope"), Some(token)] {
            let (status, _, body) = http(&chat, key, Some(&first.to_string())).await;
            assert_eq!(status, 401, "{body}");
        }
        // a field that cannot be honoured is named
        let mut bad = first.clone();
        bad["n"] = json!(17);
        let (status, _, body) = http(&chat, Some(&keys[0]), Some(&bad.to_string())).await;
        assert_eq!((status, json_of(&body)["error"]["param"].clone()), (400, json!("n")));
        // a body past the bound
        let huge = format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}", "x".repeat(3 << 20));
        let (status, _, _) = http(&chat, Some(&keys[0]), Some(&huge)).await;
        assert_eq!(status, 413);

        for (k, key) in keys.iter().enumerate() {
            let (status, _, body) = http(&chat, Some(key), Some(&first.to_string())).await;
            assert_eq!(status, 200, "{body}");
            let answer = json_of(&body);
            assert_eq!(answer["object"], "chat.completion");
            let choice = &answer["choices"][0];
            assert_eq!(choice["finish_reason"], "tool_calls");
            let calls = &choice["message"]["tool_calls"];
            assert_eq!(calls[0]["function"]["name"], "python");
            assert_eq!(calls[0]["function"]["arguments"], "{\"code\":\"print(6 * 7)\"}");
            assert_eq!(answer["usage"]["completion_tokens"], call(6, 7).len() + 1);
            let mut next = first.clone();
            let messages = next["messages"].as_array_mut().unwrap();
            messages.push(choice["message"].clone());
            messages.push(json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": "42\n"}));
            next["stream"] = json!(k == 1);
            // (AReaL's proxy serves the route without `/v1` too)
            let route = if k == 1 {
                format!("{proxy}/chat/completions")
            } else {
                chat.clone()
            };
            let (status, head, body) = http(&route, Some(key), Some(&next.to_string())).await;
            assert_eq!(status, 200, "{body}");
            let content = if k == 1 {
                assert!(head.contains("text/event-stream"), "{head}");
                assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
                body.lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter(|d| *d != "[DONE]")
                    .filter_map(|d| json_of(d)["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
                    .collect::<String>()
            } else {
                json_of(&body)["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
            };
            assert_eq!(content, "It is 42.");
        }
        // rewards: a bad value and an unknown interaction are named
        let reward = format!("{proxy}/rl/set_reward");
        let (status, _, body) = http(&reward, Some(&keys[0]), Some("{\"reward\": 1e300}")).await;
        assert_eq!((status, json_of(&body)["error"]["param"].clone()), (400, json!("reward")));
        let (status, _, _) = http(&reward, Some(&keys[0]), Some("{\"reward\": 1, \"interaction_id\": \"chatcmpl-x\"}")).await;
        assert_eq!(status, 404);
        let (status, _, body) = http(&reward, Some(&keys[0]), Some("{\"reward\": 0.5}")).await;
        assert_eq!(status, 200, "{body}");
        // ending one session leaves the other open; an ended one is refused
        let end = format!("{proxy}/rl/end_session");
        let (status, _, _) = http(&end, Some(&keys[0]), Some("{}")).await;
        assert_eq!(status, 200);
        let (status, _, _) = http(&chat, Some(&keys[0]), Some(&first.to_string())).await;
        assert_eq!(status, 410);
        let (status, _, _) = http(&end, Some(&keys[1]), Some("{}")).await;
        assert_eq!(status, 200);
        let group = group.await.unwrap().unwrap();
        let mut values: Vec<f64> = group.samples.iter().map(|s| s.reward.value).collect();
        values.sort_by(f64::total_cmp);
        // one set 0.5; the other had none and was graded by the run's verifier
        assert_eq!(values, [0.5, 1.0]);
        let (status, _, body) = http(&format!("{proxy}/health"), None, None).await;
        assert_eq!((status, json_of(&body)["sessions"].clone()), (200, json!(0)));
        let (status, _, body) = http(&format!("{proxy}/v1/models"), None, None).await;
        assert_eq!((status, json_of(&body)["data"][0]["id"].clone()), (200, json!("policy")));
        let (status, _, body) = http(&format!("{proxy}/v1/embeddings"), None, Some("{}")).await;
        assert_eq!(status, 404, "{body}");
    });
}

/// `n` choices: each is a turn after the same messages, all but the one the session goes on
/// with a sample of its own; the client reads that one first, and continues from it without
/// another split.
#[test]
fn each_of_n_choices_is_a_sample_and_the_first_goes_on() {
    let tokenizer = tokenizer();
    // each call of the episode says the next line, whatever the choice
    let script = vec![
        "one".to_owned(),
        "two".to_owned(),
        "three".to_owned(),
        "four".to_owned(),
    ];
    let (proxy, runner) = online(&script);
    runtime().block_on(async {
        let group = one_episode(&runner);
        let key = take_session(&proxy).await;
        let chat = format!("{proxy}/v1/chat/completions");
        let mut body = json!({"messages": [{"role": "user", "content": "count"}], "n": 3});
        let (status, _, answer) = http(&chat, Some(&key), Some(&body.to_string())).await;
        assert_eq!(status, 200, "{answer}");
        let answer = json_of(&answer);
        let said: Vec<&str> = (0..3)
            .map(|i| answer["choices"][i]["message"]["content"].as_str().unwrap())
            .collect();
        // sampled in order one, two, three; the last stays in the session and comes first
        assert_eq!(said, ["three", "two", "one"]);
        // "one", "two", "three", each with its stop token
        assert_eq!(answer["usage"]["completion_tokens"], 4 + 4 + 6);
        // going on from choice 0 extends the session's sequence
        body["n"] = json!(1);
        let messages = body["messages"].as_array_mut().unwrap();
        messages.push(answer["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": "again"}));
        let (status, _, next) = http(&chat, Some(&key), Some(&body.to_string())).await;
        assert_eq!(status, 200, "{next}");
        assert_eq!(json_of(&next)["choices"][0]["message"]["content"], "four");
        let (status, _, _) = http(&format!("{proxy}/rl/end_session"), Some(&key), Some("{}")).await;
        assert_eq!(status, 200);
        let group = group.await.unwrap().unwrap();
        let texts: Vec<String> = group
            .samples
            .iter()
            .map(|s| tokenizer.decode_verbatim(&s.completion.token_ids).unwrap())
            .collect();
        assert_eq!(texts.len(), 3, "{texts:?}");
        assert_eq!(texts[0], "user:\ncount\nassistant:\none<eos>");
        assert_eq!(texts[1], "user:\ncount\nassistant:\ntwo<eos>");
        assert_eq!(
            texts[2],
            "user:\ncount\nassistant:\nthree<eos>\nuser:\nagain\nassistant:\nfour<eos>"
        );
        assert!(
            group
                .samples
                .iter()
                .all(|s| s.sample_id == group.samples[0].sample_id)
        );
        assert_eq!(group.samples[0].reward.provenance.details["splits"], 2);
        // each sample names its session and the interactions it holds (what the agent saw,
        // what /rl/set_reward names): the first request's in all three, the second's in the
        // last
        let details = &group.samples[0].reward.provenance.details;
        let session = details["session_id"].as_str().unwrap();
        assert!(session.starts_with("sess-"), "{session}");
        let first = answer["id"].as_str().unwrap();
        let second = json_of(&next)["id"].as_str().unwrap().to_owned();
        assert!(first.starts_with(&format!("chatcmpl-{session}")), "{first}");
        assert_eq!(
            details["interactions"],
            json!([[first], [first], [first, second]])
        );
    });
}

/// Streamed, `n` choices with `include_usage` and `logprobs` come as OpenAI streams them: per
/// choice the role first and the finish last, every chunk's usage null but the last one's,
/// which has no choices and the sum of the choices' tokens; and each choice's logprobs, a
/// call's included, one per token it was charged for.
#[test]
fn a_streamed_answer_of_n_choices_carries_every_tokens_logprob_and_the_usage_last() {
    let script = vec![call(6, 7), "two".to_owned(), "three".to_owned()];
    let (proxy, runner) = online(&script);
    runtime().block_on(async {
        let group = one_episode(&runner);
        let key = take_session(&proxy).await;
        let body = json!({
            "messages": [{"role": "user", "content": "What is 6 * 7?"}],
            "tools": [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}],
            "n": 3, "stream": true, "logprobs": true,
            "stream_options": {"include_usage": true},
        });
        let chat = format!("{proxy}/v1/chat/completions");
        let (status, _, events) = http(&chat, Some(&key), Some(&body.to_string())).await;
        assert_eq!(status, 200, "{events}");
        let data: Vec<&str> = events.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        assert_eq!(data.last(), Some(&"[DONE]"));
        let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| json_of(d)).collect();
        let (usage, chunks) = chunks.split_last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert!(chunks.iter().all(|c| c["usage"].is_null()), "{chunks:?}");
        // each choice: its role first, its finish last, its logprobs once
        let mut roles = [0; 3];
        let mut finished = [false; 3];
        let mut logprobs = [0; 3];
        let mut content = [String::new(), String::new(), String::new()];
        let mut calls = [0; 3];
        for c in chunks {
            let choice = &c["choices"][0];
            let i = usize::try_from(choice["index"].as_u64().unwrap()).unwrap();
            assert!(!finished[i], "a chunk after choice {i}'s finish: {c}");
            if choice["delta"]["role"] == "assistant" {
                roles[i] += 1;
            } else {
                assert_eq!(roles[i], 1, "choice {i}'s role comes first: {c}");
            }
            content[i] += choice["delta"]["content"].as_str().unwrap_or("");
            calls[i] += choice["delta"]["tool_calls"].as_array().map_or(0, Vec::len);
            logprobs[i] += choice["logprobs"]["content"].as_array().map_or(0, Vec::len);
            finished[i] = !choice["finish_reason"].is_null();
        }
        assert_eq!(finished, [true; 3]);
        assert_eq!(roles, [1; 3]);
        assert_eq!(content, ["three", "two", ""]);
        assert_eq!(calls, [0, 0, 1]);
        // "three", "two", the call, each with its stop token
        let tokens = [6, 4, call(6, 7).len() + 1];
        assert_eq!(logprobs, tokens);
        assert_eq!(usage["usage"]["completion_tokens"], tokens.iter().sum::<usize>());
        let (status, _, _) = http(&format!("{proxy}/rl/end_session"), Some(&key), Some("{}")).await;
        assert_eq!(status, 200);
        group.await.unwrap().unwrap();
    });
}

/// `stop` ends a turn where its text first holds a stop text: the turn's tokens end with the
/// one that completes it (what was sampled after it is dropped), the answer leaves the stop
/// text out, and the session goes on in the template's markup, its check intact.
#[test]
fn a_stop_text_ends_the_turn_and_what_follows_it_is_dropped() {
    let tokenizer = tokenizer();
    let script = vec!["one\ntwo\nthree".to_owned(), "four".to_owned()];
    let (proxy, runner) = online(&script);
    runtime().block_on(async {
        let group = one_episode(&runner);
        let key = take_session(&proxy).await;
        let chat = format!("{proxy}/v1/chat/completions");
        let mut body = json!({"messages": [{"role": "user", "content": "count"}], "stop": "\n"});
        let (status, _, answer) = http(&chat, Some(&key), Some(&body.to_string())).await;
        assert_eq!(status, 200, "{answer}");
        let answer = json_of(&answer);
        let choice = &answer["choices"][0];
        assert_eq!(choice["message"]["content"], "one");
        assert_eq!(choice["finish_reason"], "stop");
        assert_eq!(
            answer["usage"]["completion_tokens"], 4,
            "one and the newline"
        );
        let messages = body["messages"].as_array_mut().unwrap();
        messages.push(choice["message"].clone());
        messages.push(json!({"role": "user", "content": "again"}));
        let (status, _, next) = http(&chat, Some(&key), Some(&body.to_string())).await;
        assert_eq!(status, 200, "{next}");
        assert_eq!(json_of(&next)["choices"][0]["message"]["content"], "four");
        let (status, _, _) = http(&format!("{proxy}/rl/end_session"), Some(&key), Some("{}")).await;
        assert_eq!(status, 200);
        let group = group.await.unwrap().unwrap();
        assert_eq!(group.samples.len(), 1);
        let c = &group.samples[0].completion;
        assert_eq!(
            tokenizer.decode_verbatim(&c.token_ids).unwrap(),
            "user:\ncount\nassistant:\none\n<eos>\nuser:\nagain\nassistant:\nfour<eos>"
        );
        // trained: "one\n" and "four<eos>"; the template's <eos> after the cut turn is the
        // environment's
        let sampled: String = (0..c.len())
            .filter(|&i| c.is_sampled(i))
            .map(|i| tokenizer.decode_verbatim(&c.token_ids[i..=i]).unwrap())
            .collect();
        assert_eq!(sampled, "one\nfour<eos>");
    });
    assert_eq!(counted(&runner), (1, 0, 0));
}

/// An agent service that exits fails the episodes waiting for it with its status and output
/// (a run then stops on its failures, naming it, instead of waiting for agents that will
/// not come).
#[test]
fn a_service_that_exits_fails_the_episodes_waiting_for_it() {
    let episode = agent(json!({
        "service": ["python3", "-c", "import sys; print('no agents today'); sys.exit(2)"],
    }));
    let (group, _) = run(&["It is 42.".to_owned()], episode, 2);
    let e = group.expect_err("no agent came").to_string();
    assert!(
        e.contains("the agent service exited with status 2; its output ends: no agents today"),
        "{e}"
    );
}

/// A turn names a tool only when the request offered it: without `tools`, with
/// `tool_choice: "none"`, or calling a name not offered, the policy's text is the answer's
/// content (as OpenAI and vLLM answer), and the client is never handed a call it cannot run.
#[test]
fn a_call_is_a_call_only_to_a_tool_the_request_offered() {
    let script = vec![call(6, 7)];
    let (proxy, runner) = online(&script);
    runtime().block_on(async {
        let group = one_episode(&runner);
        let key = take_session(&proxy).await;
        let chat = format!("{proxy}/v1/chat/completions");
        let tool = |name: &str| json!([{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]);
        let user = json!([{"role": "user", "content": "What is 6 * 7?"}]);
        for (tools, choice, called) in [
            (None, None, false),
            (Some(tool("search")), None, false),
            (Some(tool("python")), Some("none"), false),
            (Some(tool("python")), Some("auto"), true),
        ] {
            let mut body = json!({"messages": user});
            if let Some(tools) = &tools {
                body["tools"] = tools.clone();
            }
            if let Some(choice) = choice {
                body["tool_choice"] = json!(choice);
            }
            let (status, _, answer) = http(&chat, Some(&key), Some(&body.to_string())).await;
            assert_eq!(status, 200, "{answer}");
            let answer = json_of(&answer);
            let choice0 = &answer["choices"][0];
            let case = format!("tools {tools:?}, tool_choice {choice:?}");
            if called {
                assert_eq!(choice0["finish_reason"], "tool_calls", "{case}");
                assert_eq!(choice0["message"]["tool_calls"][0]["function"]["name"], "python");
            } else {
                assert_eq!(choice0["finish_reason"], "stop", "{case}");
                assert!(choice0["message"].get("tool_calls").is_none(), "{case}: {answer}");
                assert_eq!(choice0["message"]["content"], call(6, 7), "{case}");
            }
        }
        // a field the proxy would ignore is refused by name, the session untouched
        for (field, value) in [
            ("response_format", json!({"type": "json_object"})),
            ("logit_bias", json!({"5": 100})),
            ("top_k", json!(1)),
        ] {
            let mut body = json!({"messages": user});
            body[field] = value;
            let (status, _, answer) = http(&chat, Some(&key), Some(&body.to_string())).await;
            assert_eq!(status, 400, "{answer}");
            assert_eq!(json_of(&answer)["error"]["param"], field);
        }
        let (status, _, _) = http(&format!("{proxy}/rl/end_session"), Some(&key), Some("{}")).await;
        assert_eq!(status, 200);
        let group = group.await.unwrap().unwrap();
        // four requests, none extending the last: four samples
        assert_eq!(group.samples.len(), 4);
    });
}

/// Echoes the seed each token is drawn with (the real generators draw from it, the sample's
/// id and the position): what tells one draw from another.
struct SeedEcho {
    tokenizer: Arc<dyn Tokenizer>,
}

#[areal_sdk::async_trait]
impl Generator for SeedEcho {
    fn name(&self) -> &str {
        "seed-echo"
    }
    async fn generate(&self, request: GenerateRequest) -> Result<Completion, PluginError> {
        let seed = areal_sdk::mix_seed(
            areal_sdk::mix_seed(request.sampling.seed, request.sample_id),
            request.input_ids.len() as u64,
        );
        let mut c = Completion::empty(FinishReason::Stop);
        let stop = self.tokenizer.stop_token_ids()[0];
        for id in self
            .tokenizer
            .encode(&format!("{seed:016x}"))?
            .into_iter()
            .chain([stop])
        {
            c.push(id, -0.5, 3);
        }
        Ok(c)
    }
    async fn update_weights(&self, _: WeightUpdate) -> Result<(), PluginError> {
        Ok(())
    }
}

/// Every choice of `n` and every retry of a request draws its own tokens: n = 16 choices are
/// 16 draws, the same request sent 5 times 5 more; a client's `seed` draws the same again.
#[test]
fn every_choice_and_every_retry_draws_its_own_tokens() {
    let (proxy, runner) = online_on(Arc::new(SeedEcho {
        tokenizer: tokenizer(),
    }));
    runtime().block_on(async {
        let group = one_episode(&runner);
        let key = take_session(&proxy).await;
        let chat = format!("{proxy}/v1/chat/completions");
        let ask = |extra: Value| {
            let mut body =
                json!({"messages": [{"role": "user", "content": "roll"}], "temperature": 1.0});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            body.to_string()
        };
        let texts = |answer: &str| -> Vec<String> {
            json_of(answer)["choices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["message"]["content"].as_str().unwrap().to_owned())
                .collect()
        };
        let mut drawn = std::collections::BTreeSet::new();
        let (status, _, answer) = http(&chat, Some(&key), Some(&ask(json!({"n": 16})))).await;
        assert_eq!(status, 200, "{answer}");
        drawn.extend(texts(&answer));
        assert_eq!(drawn.len(), 16, "16 choices, 16 draws");
        for _ in 0..5 {
            let (status, _, answer) = http(&chat, Some(&key), Some(&ask(json!({})))).await;
            assert_eq!(status, 200, "{answer}");
            drawn.extend(texts(&answer));
        }
        assert_eq!(drawn.len(), 21, "each retry its own draw");
        // a client's seed: the same seed the same draws, another seed others
        let mut seeded = Vec::new();
        for seed in [7, 7, 8] {
            let (status, _, answer) =
                http(&chat, Some(&key), Some(&ask(json!({"n": 2, "seed": seed})))).await;
            assert_eq!(status, 200, "{answer}");
            seeded.push(texts(&answer));
        }
        assert_eq!(seeded[0], seeded[1]);
        assert_ne!(seeded[0][0], seeded[0][1], "each choice its own draw");
        assert!(seeded[2].iter().all(|t| !seeded[0].contains(t)));
        assert!(seeded.iter().flatten().all(|t| !drawn.contains(t)));
        let (status, _, _) = http(&format!("{proxy}/rl/end_session"), Some(&key), Some("{}")).await;
        assert_eq!(status, 200);
        group.await.unwrap().unwrap();
    });
}

/// Messages past the model's context are the client's fault: 400 with OpenAI's
/// `context_length_exceeded`, naming the tokens and the limit, and the session goes on as if
/// they had never been sent (nothing of them in the samples trained on).
#[test]
fn messages_past_the_context_are_refused_and_the_session_goes_on() {
    let tokenizer = tokenizer();
    let script = vec!["one".to_owned(), "two".to_owned(), "three".to_owned()];
    let (proxy, runner) = online_on(scripted(&script, 64));
    runtime().block_on(async {
        let group = one_episode(&runner);
        let key = take_session(&proxy).await;
        let chat = format!("{proxy}/v1/chat/completions");
        let long = "x".repeat(100);
        let (chat_at, key_of) = (&chat, &key);
        let too_long = |messages: Value| async move {
            let body = json!({"messages": messages});
            let (status, _, answer) = http(chat_at, Some(key_of), Some(&body.to_string())).await;
            assert_eq!(status, 400, "{answer}");
            let error = json_of(&answer)["error"].clone();
            assert_eq!(error["code"], "context_length_exceeded", "{error}");
            assert_eq!(error["type"], "invalid_request_error");
            assert_eq!(error["param"], "messages");
            let message = error["message"].as_str().unwrap().to_owned();
            assert!(
                message.contains("maximum context length is 64 tokens"),
                "{message}"
            );
            message
        };
        // the first request too long: the session has not started
        let first = too_long(json!([{"role": "user", "content": long}])).await;
        assert!(first.contains("resulted in 118 tokens"), "{first}");
        let fits = |messages: Value| async move {
            let body = json!({"messages": messages});
            let (status, _, answer) = http(chat_at, Some(key_of), Some(&body.to_string())).await;
            assert_eq!(status, 200, "{answer}");
            json_of(&answer)
        };
        let mut messages = json!([{"role": "user", "content": "count"}]);
        let answer = fits(messages.clone()).await;
        assert_eq!(answer["choices"][0]["message"]["content"], "one");
        // an extension too long, twice: refused, the session as it was
        let m = messages.as_array_mut().unwrap();
        m.push(answer["choices"][0]["message"].clone());
        let mut longer = m.clone();
        longer.push(json!({"role": "user", "content": long}));
        too_long(json!(longer)).await;
        too_long(json!(longer)).await;
        m.push(json!({"role": "user", "content": "again"}));
        let answer = fits(messages).await;
        assert_eq!(answer["choices"][0]["message"]["content"], "two");
        let (status, _, _) = http(&format!("{proxy}/rl/end_session"), Some(&key), Some("{}")).await;
        assert_eq!(status, 200);
        let group = group.await.unwrap().unwrap();
        assert_eq!(group.samples.len(), 1, "no split: the session went on");
        let sample = &group.samples[0];
        assert_eq!(
            tokenizer
                .decode_verbatim(&sample.completion.token_ids)
                .unwrap(),
            "user:\ncount\nassistant:\none<eos>\nuser:\nagain\nassistant:\ntwo<eos>"
        );
        assert_eq!(sample.reward.provenance.details["turns"], 2);
    });
    assert_eq!(counted(&runner), (1, 0, 0));
}

/// The live processes whose command line holds `mark`.
fn alive_with(mark: &str) -> Vec<u32> {
    let mut alive = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat.rfind(')').is_some_and(|at| {
            matches!(stat[at + 1..].trim_start().chars().next(), Some('Z' | 'X'))
        });
        if !zombie && String::from_utf8_lossy(&cmdline).contains(mark) {
            alive.push(pid);
        }
    }
    alive
}

/// An agent program's episode ends with every process it started, however it tried to
/// outlive it: a process in a session of its own, a daemon (fork, setsid, fork), a child
/// holding its pipes; a fork bomb is killed past `max_processes`, and a tree of children
/// within their own address spaces but past `memory_mb` together is killed too, each naming
/// the bound it passed.
#[test]
fn no_process_of_an_agent_program_outlives_its_episode() {
    let mut survivors = Vec::new();
    for (case, options, failure) in [
        ("setsid", json!({}), None),
        ("daemon", json!({}), None),
        ("pipes", json!({}), None),
        (
            "bomb",
            json!({"max_processes": 32}),
            Some("ran more than 32 processes at once (max_processes) and was killed"),
        ),
        (
            "hoard",
            json!({"memory_mb": 256}),
            Some("more than memory_mb = 256 in all and was killed"),
        ),
    ] {
        let mark = format!("areal-escape-{}-{case}", std::process::id());
        let mut options = options;
        options["command"] = json!(["python3", agent_file("escaping_agent.py"), case, mark]);
        // (a backstop: the episode must end long before)
        options["idle_s"] = json!(120);
        let (group, _) = run(&[], agent(options), 1);
        let left = alive_with(&mark);
        for pid in &left {
            // leave nothing on the machine whatever the verdict
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        survivors.push((case, left.len()));
        match (failure, group) {
            (None, Ok(group)) => {
                let reward = &group.samples[0].reward;
                assert_eq!(reward.verdict, Verdict::NoAnswer, "{case}: {reward:?}");
            }
            // (a sample whose episode failed is lost, the failure named)
            (Some(why), Err(e)) => assert!(e.to_string().contains(why), "{case}: {e}"),
            (_, other) => panic!("{case}: {other:?}"),
        }
    }
    assert!(
        survivors.iter().all(|(_, n)| *n == 0),
        "processes left: {survivors:?}"
    );
}
