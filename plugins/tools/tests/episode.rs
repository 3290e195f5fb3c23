//! The `tool-calls` episode run by the engine's group runner with the real `python` tool, on a
//! generator that says scripted turns: a malformed call, a call that loops, one that hoards
//! memory and one that prints a megabyte each cost one turn, never the episode.
//!
//! Needs the WASI interpreter (`make python-wasi`); `make test` builds it first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use areal_core::{GroupRunner, GroupSpec, RewardService};
use areal_sdk::{
    BuildContext, Completion, Episode, EpisodePlugin, FinishReason, GenerateRequest, Generator,
    PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, SamplingParams, TaskItem,
    Tokenizer, Tool, ToolPlugin, TrajectoryGroup, Verdict, VerifyContext, WeightUpdate,
};
use serde_json::{Value, json};

use areal_tools as _;

/// Bytes are tokens 0..=255; 256 stops a turn.
struct Bytes;

const STOP: u32 = 256;

impl Tokenizer for Bytes {
    fn encode(&self, text: &str) -> Result<Vec<u32>, PluginError> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, PluginError> {
        let bytes: Vec<u8> = ids
            .iter()
            .filter(|&&id| id < STOP)
            .map(|&id| id as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
    fn stop_token_ids(&self) -> Vec<u32> {
        vec![STOP]
    }
    fn vocab_size(&self) -> usize {
        257
    }
}

/// Says the turns of `script` in order, per sample, each ending with the stop token.
struct Scripted {
    script: Vec<String>,
    said: Mutex<HashMap<u64, usize>>,
}

#[areal_sdk::async_trait]
impl Generator for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    async fn generate(&self, request: GenerateRequest) -> Result<Completion, PluginError> {
        let turn = {
            let mut said = self.said.lock().unwrap();
            let n = said.entry(request.sample_id).or_default();
            *n += 1;
            self.script[(*n - 1).min(self.script.len() - 1)].clone()
        };
        let mut c = Completion::empty(FinishReason::Stop);
        for id in turn.bytes().map(u32::from).chain([STOP]) {
            if c.len() == request.max_new_tokens {
                c.finish_reason = FinishReason::Length;
                break;
            }
            c.push(id, -0.5, 0);
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

fn call(code: &str) -> String {
    let call = json!({"name": "python", "arguments": {"code": code}});
    format!("Let me run it.\n<tool_call>\n{call}\n</tool_call>")
}

fn plugin(section: &str, kind: &str, options: Value) -> PluginConfig {
    let mut config = PluginConfig::new(section, kind);
    for (k, v) in options.as_object().unwrap().clone() {
        config = config.with(&k, v);
    }
    config
}

/// The episode plugin `kind` with `options`.
fn episode(kind: &str, options: Value) -> Arc<dyn Episode> {
    EpisodePlugin::build_from(&plugin("episode", kind, options), &BuildContext::new(0, 1))
        .expect("the episode")
}

/// The tool plugin `kind` with `options`, the run's first.
fn tool(kind: &str, options: Value) -> Arc<dyn Tool> {
    ToolPlugin::build_from(&plugin("tools[0]", kind, options), &BuildContext::new(0, 1))
        .expect("the tool")
}

/// `group_size` episodes of `episode` with `tools` on a generator that says `script`, each
/// with a budget of `max_new_tokens`, graded by [`SaysFortyTwo`]: the group, and the runner
/// that counted them.
fn run_scripted(
    script: Vec<String>,
    episode: Arc<dyn Episode>,
    tools: Vec<Arc<dyn Tool>>,
    group_size: usize,
    max_new_tokens: usize,
) -> (TrajectoryGroup, Arc<GroupRunner>) {
    let generator = Arc::new(Scripted {
        script,
        said: Mutex::new(HashMap::new()),
    });
    let rewards = RewardService::new(Arc::new(SaysFortyTwo), 1, Duration::from_secs(30));
    let runner = Arc::new(
        GroupRunner::new(generator, Arc::new(Bytes), rewards).with_episode(episode, tools),
    );
    let spec = GroupSpec {
        group_id: 0,
        group_size,
        max_new_tokens,
        sampling: SamplingParams::greedy(),
        admitted_at: 0,
    };
    let item = TaskItem {
        id: "q".into(),
        prompt: "What is 6 * 7?".into(),
        reference: Value::Null,
    };
    let group = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(runner.run_group(spec, item))
        .expect("the episode ends");
    (group, runner)
}

#[test]
fn every_bad_call_costs_one_turn_and_the_episode_goes_on() {
    let script = vec![
        call("x = 6 * 7"),
        call("x"),
        "<tool_call>{\"name\": \"python\", \"arguments\": \"{not json\"}</tool_call>".to_owned(),
        call("while True:\n    pass"),
        call("x"),
        call("print('y' * 1_000_000)"),
        call("blocks = [bytearray(1 << 20) for _ in range(500)]"),
        "The answer is 42.".to_owned(),
    ];
    let python = tool(
        "python",
        json!({"timeout_s": 0.5, "memory_mb": 128, "output_bytes": 512}),
    );
    let tool_calls = episode("tool-calls", json!({"max_turns": 10}));
    let (group, runner) = run_scripted(script, tool_calls, vec![python], 2, 8192);
    assert_eq!(group.samples.len(), 2);
    let answers: Vec<String> = {
        let text = Bytes
            .decode(&group.samples[0].completion.token_ids)
            .unwrap();
        text.split("<tool_response>\n")
            .skip(1)
            .map(|a| a.split("\n</tool_response>").next().unwrap().to_owned())
            .collect()
    };
    assert_eq!(answers.len(), 7, "{answers:#?}");
    assert_eq!(answers[0], "", "an assignment prints nothing");
    assert_eq!(answers[1], "42\n", "the session kept x");
    assert!(answers[2].contains("tool call 1"), "{}", answers[2]);
    assert!(
        answers[3].contains("past its limit of 0.5 s"),
        "{}",
        answers[3]
    );
    assert!(
        answers[4].contains("NameError"),
        "a new interpreter: {}",
        answers[4]
    );
    assert!(
        answers[5].ends_with("[output cut at 512 bytes]"),
        "{}",
        &answers[5][500..]
    );
    assert!(answers[6].contains("more than 128 MB"), "{}", answers[6]);
    for sample in &group.samples {
        assert_eq!(
            sample.reward.verdict,
            Verdict::Accepted,
            "the last turn was graded"
        );
        let c = &sample.completion;
        assert!(
            c.len() > c.sampled_len(),
            "the answers are environment tokens"
        );
    }
    let counters = &runner.counters;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(load(&counters.episodes), 2);
    assert_eq!(load(&counters.turns), 2 * 8);
    assert_eq!(
        load(&counters.tool_calls),
        2 * 6,
        "the malformed call is not made"
    );
    assert_eq!(
        load(&counters.tool_errors),
        2 * 4,
        "malformed, loop, NameError, memory"
    );
}

/// AReaL's multi-turn workflow: a wrong answer is told so and answered again; a right answer
/// at the second turn earns 0.9 (`turn_discount`), and an episode never right earns 0 after
/// `max_turns` answers.
#[test]
fn retry_answers_again_after_a_wrong_answer_and_discounts_the_right_one() {
    let retry = episode(
        "retry",
        json!({"max_turns": 3, "turn_discount": 0.9, "feedback": "\nwrong, again:\n"}),
    );
    let run = |script: &[&str]| {
        let script = script.iter().map(|s| (*s).to_owned()).collect();
        let (group, runner) = run_scripted(script, retry.clone(), Vec::new(), 1, 256);
        let sample = group.samples.into_iter().next().unwrap();
        let text = Bytes.decode(&sample.completion.token_ids).unwrap();
        let turns = runner
            .counters
            .turns
            .load(std::sync::atomic::Ordering::SeqCst);
        (sample.reward, text, turns)
    };
    let (reward, text, turns) = run(&["=41", "=42"]);
    assert_eq!(text, "=41\nwrong, again:\n=42");
    assert_eq!(
        (reward.verdict, reward.value, turns),
        (Verdict::Accepted, 0.9, 2)
    );
    assert_eq!(reward.provenance.details["turns"], json!(2));
    let (reward, text, turns) = run(&["=41"]);
    assert_eq!(text, "=41\nwrong, again:\n=41\nwrong, again:\n=41");
    assert_eq!(
        (reward.verdict, reward.value, turns),
        (Verdict::WrongAnswer, 0.0, 3)
    );
}

/// A tool loaded from a Python file is called by the name the model is told (its function's),
/// not by its plugin's kind.
#[test]
fn a_python_function_tool_is_called_by_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hypot.py");
    std::fs::write(
        &path,
        "import math\ndef hypot(a, b):\n    return math.hypot(a, b)\n",
    )
    .unwrap();
    let hypot = tool(
        "python-function",
        json!({"path": path, "description": "The hypotenuse."}),
    );
    let call = json!({"name": "hypot", "arguments": {"a": 3, "b": 4}});
    let script = vec![
        format!("<tool_call>{call}</tool_call>"),
        "<tool_call>{\"name\": \"python-function\"}</tool_call>".into(),
        "42".into(),
    ];
    let tool_calls = episode("tool-calls", json!({}));
    let (group, _) = run_scripted(script, tool_calls, vec![hypot], 1, 4096);
    let text = Bytes
        .decode(&group.samples[0].completion.token_ids)
        .unwrap();
    assert!(
        text.contains("<tool_response>\n5.0\n\n</tool_response>"),
        "{text}"
    );
    assert!(
        text.contains("there is no tool \"python-function\"; the tools are: hypot"),
        "{text}"
    );
}
