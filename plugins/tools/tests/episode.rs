//! The `tool-calls` episode run by the engine's group runner with the real `python` tool, on a
//! generator that says scripted turns: a malformed call, a call that loops, one that hoards
//! memory and one that prints a megabyte each cost one turn, never the episode.
//!
//! Needs the WASI interpreter (`make python-wasi`); `make test` builds it first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use areal_core::{GroupRunner, GroupSpec, PromptConfig, PromptFormat, RewardService};
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

/// Says the turns of `script` in order, per sample, each in `tokenizer`'s tokens and ending
/// with its stop token.
struct Scripted {
    script: Vec<String>,
    said: Mutex<HashMap<u64, usize>>,
    tokenizer: Arc<dyn Tokenizer>,
    /// What each request asked for: (tokens at most, temperature).
    asked: Mutex<Vec<(usize, f32)>>,
}

#[areal_sdk::async_trait]
impl Generator for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    async fn generate(&self, request: GenerateRequest) -> Result<Completion, PluginError> {
        self.asked
            .lock()
            .unwrap()
            .push((request.max_new_tokens, request.sampling.temperature));
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
    run_scripted_with(
        Arc::new(Bytes),
        PromptConfig::default(),
        script,
        episode,
        tools,
        group_size,
        max_new_tokens,
    )
}

/// [`run_scripted`] with `tokenizer`, prompts put as `prompt` says.
fn run_scripted_with(
    tokenizer: Arc<dyn Tokenizer>,
    prompt: PromptConfig,
    script: Vec<String>,
    episode: Arc<dyn Episode>,
    tools: Vec<Arc<dyn Tool>>,
    group_size: usize,
    max_new_tokens: usize,
) -> (TrajectoryGroup, Arc<GroupRunner>) {
    let generator = scripted(script, tokenizer);
    run_on(
        generator,
        prompt,
        episode,
        tools,
        group_size,
        max_new_tokens,
    )
}

/// A generator saying `script` in `tokenizer`'s tokens.
fn scripted(script: Vec<String>, tokenizer: Arc<dyn Tokenizer>) -> Arc<Scripted> {
    Arc::new(Scripted {
        script,
        said: Mutex::new(HashMap::new()),
        tokenizer,
        asked: Mutex::new(Vec::new()),
    })
}

/// [`run_scripted`] on `generator` (its tokenizer the run's), prompts put as `prompt` says.
fn run_on(
    generator: Arc<Scripted>,
    prompt: PromptConfig,
    episode: Arc<dyn Episode>,
    tools: Vec<Arc<dyn Tool>>,
    group_size: usize,
    max_new_tokens: usize,
) -> (TrajectoryGroup, Arc<GroupRunner>) {
    let tokenizer = generator.tokenizer.clone();
    let rewards = RewardService::new(Arc::new(SaysFortyTwo), 1, Duration::from_secs(30));
    let runner = Arc::new(
        GroupRunner::new(generator, tokenizer, rewards)
            .with_prompt(prompt)
            .expect("the prompt's format")
            .with_episode(episode, tools),
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

/// A chat format in the style of ChatML for a character tokenizer: the tools named in the
/// system turn, each answer in a `<tool_response>` block of a user turn, the assistant's turns
/// ended by `eos_token`. With `strip_thinking`, earlier assistant turns are written without
/// their `<think>` block, as Qwen3's template writes them.
fn chat_template(strip_thinking: bool) -> String {
    let content = if strip_thinking {
        "(message.content.split('</think>')[-1] if not loop.last and '</think>' in message.content else message.content)"
    } else {
        "message.content"
    };
    format!(
        "{{%- if tools %}}system: tools{{% for t in tools %}} {{{{ t.function.name }}}}{{% endfor %}}{{{{ '\n' }}}}{{% endif %}}\
         {{%- for message in messages %}}\
         {{%- if message.role == 'tool' %}}\
         {{%- if messages[loop.index0 - 1].role != 'tool' %}}user:{{% endif %}}\
         {{{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}}}\
         {{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}}{{{{ '\\n' }}}}{{% endif %}}\
         {{%- elif message.role == 'assistant' %}}{{{{- 'assistant:\\n' + {content} + eos_token + '\\n' }}}}\
         {{%- else %}}{{{{- message.role + ':\\n' + message.content + '\\n' }}}}\
         {{%- endif %}}\
         {{%- endfor %}}\
         {{%- if add_generation_prompt %}}{{{{- 'assistant:\\n' }}}}{{% endif %}}"
    )
}

/// A character tokenizer (printable ASCII and the newline) with [`chat_template`].
fn chat_tokenizer(strip_thinking: bool) -> Arc<dyn Tokenizer> {
    let alphabet: String = (' '..='~').chain(['\n']).collect();
    let mut tokenizer = areal_model::char_tokenizer(&alphabet).unwrap();
    tokenizer
        .set_chat_template(&chat_template(strip_thinking))
        .unwrap();
    Arc::new(tokenizer)
}

fn chat() -> PromptConfig {
    PromptConfig {
        format: PromptFormat::Chat,
        system: None,
    }
}

fn retokenization(runner: &GroupRunner) -> (u64, u64, u64) {
    let c = &runner.counters;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::SeqCst);
    (
        load(&c.retokenization_checked),
        load(&c.retokenization_mismatches),
        load(&c.retokenization_drift),
    )
}

/// With prompts in the chat format, the tool answers are appended in the template's own
/// markup (`tool` messages), and every episode's tokens are what the template renders for its
/// conversation: compared at every turn and at the end, no mismatch.
#[test]
fn tool_answers_are_written_as_the_chat_template_writes_them() {
    let tokenizer = chat_tokenizer(false);
    let script = vec![call("print(6 * 7)"), "It is 42.".to_owned()];
    let python = tool("python", json!({}));
    let (group, runner) = run_scripted_with(
        tokenizer.clone(),
        chat(),
        script,
        episode("tool-calls", json!({})),
        vec![python],
        3,
        4096,
    );
    assert_eq!(retokenization(&runner), (3, 0, 0));
    let prompt = tokenizer.decode_verbatim(&group.prompt_ids).unwrap();
    assert_eq!(
        prompt,
        "system: tools python\nuser:\nWhat is 6 * 7?\nassistant:\n"
    );
    let text = tokenizer
        .decode_verbatim(&group.samples[0].completion.token_ids)
        .unwrap();
    assert_eq!(
        text,
        format!(
            "{}<eos>\nuser:\n<tool_response>\n42\n\n</tool_response>\nassistant:\nIt is 42.<eos>",
            call("print(6 * 7)")
        )
    );
    for sample in &group.samples {
        assert_eq!(sample.reward.verdict, Verdict::Accepted);
    }
}

/// A template that writes earlier turns otherwise than they were generated (without their
/// `<think>` block, as Qwen3's does) is counted as a mismatch on every episode; the episode
/// keeps the tokens it sampled and goes on with the template's markup for the answers.
#[test]
fn a_template_that_rewrites_earlier_turns_is_counted_as_a_mismatch() {
    let tokenizer = chat_tokenizer(true);
    let first = format!("<think>\nmultiply\n</think>\n{}", call("print(6 * 7)"));
    let script = vec![first.clone(), "It is 42.".to_owned()];
    let (group, runner) = run_scripted_with(
        tokenizer.clone(),
        chat(),
        script,
        episode("tool-calls", json!({})),
        vec![tool("python", json!({}))],
        2,
        4096,
    );
    assert_eq!(retokenization(&runner), (2, 2, 0));
    let text = tokenizer
        .decode_verbatim(&group.samples[1].completion.token_ids)
        .unwrap();
    assert_eq!(
        text,
        format!(
            "{first}<eos>\nuser:\n<tool_response>\n42\n\n</tool_response>\nassistant:\nIt is 42.<eos>"
        ),
        "the thinking the policy sampled stays, the answers follow in the template's markup"
    );
}

/// Text appended bare (markup the episode writes itself) is not compared: the episode's
/// conversation is no longer known as messages.
#[test]
fn text_appended_bare_is_not_compared() {
    let script = vec![call("print(6 * 7)"), "It is 42.".to_owned()];
    let (_, runner) = run_scripted_with(
        chat_tokenizer(false),
        chat(),
        script,
        episode("tool-calls", json!({"answer": "\n[{output}]\n"})),
        vec![tool("python", json!({}))],
        2,
        4096,
    );
    assert_eq!(retokenization(&runner), (0, 0, 0));
}

/// Rewards given to turns (`EpisodeContext::reward_turn`) reach the trajectory at their
/// turns' ends, beside the final reward, and the sample's return is their sum.
#[test]
fn a_turns_reward_reaches_the_trajectory_at_its_turns_end() {
    struct Stepwise;
    #[areal_sdk::async_trait]
    impl Episode for Stepwise {
        fn name(&self) -> &str {
            "stepwise"
        }
        async fn run(
            &self,
            ctx: &mut dyn areal_sdk::EpisodeContext,
        ) -> Result<Reward, PluginError> {
            let early = ctx.reward_turn(1.0).unwrap_err().to_string();
            assert!(early.contains("before any turn"), "{early}");
            ctx.generate().await?;
            ctx.reward_turn(0.25)?;
            let bad = ctx.reward_turn(f64::NAN).unwrap_err().to_string();
            assert!(bad.contains("not finite"), "{bad}");
            ctx.append("\nagain: ")?;
            let last = ctx.generate().await?;
            ctx.verify(&last.text).await
        }
    }
    let script = vec!["first".to_owned(), "it is 42".to_owned()];
    let (group, _) = run_scripted(script, Arc::new(Stepwise), vec![], 2, 4096);
    for sample in &group.samples {
        let first_turn = "first".len() + 1; // and its stop token
        assert_eq!(
            sample.reward.turns,
            vec![areal_sdk::TurnReward {
                end: first_turn,
                value: 0.25
            }]
        );
        assert_eq!(sample.reward.value, 1.0);
        assert_eq!(sample.reward.total(), 1.25);
    }
}

/// A tool compiled to a WebAssembly component (`[[tools]] kind = "wasm"`, the `tally`
/// component of `make reward-components`) is called by the name it describes itself with,
/// its state kept across the episode's calls.
#[test]
fn a_wasm_component_tool_keeps_its_state_across_an_episodes_calls() {
    let component = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/components/tally.wasm");
    assert!(
        component.is_file(),
        "build the components: make reward-components"
    );
    let tally = tool("wasm", json!({"path": component}));
    let add = |n: i64| {
        let call = json!({"name": "tally", "arguments": {"add": n}});
        format!("<tool_call>\n{call}\n</tool_call>")
    };
    let script = vec![add(40), add(2), "The total is 42.".to_owned()];
    let (group, runner) = run_scripted(
        script,
        episode("tool-calls", json!({})),
        vec![tally],
        2,
        4096,
    );
    for sample in &group.samples {
        let text = Bytes.decode(&sample.completion.token_ids).unwrap();
        assert!(
            text.contains("<tool_response>\n40\n</tool_response>")
                && text.contains("<tool_response>\n42\n</tool_response>"),
            "{text}"
        );
        assert_eq!(sample.reward.verdict, Verdict::Accepted);
    }
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(load(&runner.counters.tool_calls), 4);
    assert_eq!(load(&runner.counters.tool_errors), 0);
}

/// A turn's own options (`generate_with`): at most `max_tokens` of it, ended for `length`
/// with the episode going on, at its own temperature; options the generator cannot take are
/// an error naming them.
#[test]
fn a_turn_may_be_capped_and_sampled_at_its_own_temperature() {
    struct Capped;
    #[areal_sdk::async_trait]
    impl Episode for Capped {
        fn name(&self) -> &str {
            "capped"
        }
        async fn run(
            &self,
            ctx: &mut dyn areal_sdk::EpisodeContext,
        ) -> Result<Reward, PluginError> {
            use areal_sdk::TurnOptions;
            let zero = ctx
                .generate_with(&TurnOptions::default().with_max_tokens(0))
                .await;
            assert!(zero.unwrap_err().to_string().contains("max_tokens"));
            let hot = ctx
                .generate_with(&TurnOptions::default().with_temperature(f32::NAN))
                .await;
            assert!(hot.unwrap_err().to_string().contains("temperature"));
            let options = TurnOptions::default()
                .with_max_tokens(3)
                .with_temperature(0.5);
            let first = ctx.generate_with(&options).await?;
            assert_eq!(first.text, "hel");
            assert_eq!(first.finish_reason, FinishReason::Length);
            assert!(ctx.tokens_left() > 0, "the episode goes on");
            ctx.append(" / ")?;
            let last = ctx.generate().await?;
            ctx.verify(&last.text).await
        }
    }
    let script = vec!["hello".to_owned(), "it is 42".to_owned()];
    let generator = scripted(script, Arc::new(Bytes));
    let (group, _) = run_on(
        generator.clone(),
        PromptConfig::default(),
        Arc::new(Capped),
        vec![],
        1,
        100,
    );
    let text = Bytes
        .decode(&group.samples[0].completion.token_ids)
        .unwrap();
    assert_eq!(text, "hel / it is 42");
    assert_eq!(group.samples[0].reward.verdict, Verdict::Accepted);
    let asked = generator.asked.lock().unwrap().clone();
    assert_eq!(
        asked[0],
        (3, 0.5),
        "the first turn's own cap and temperature"
    );
    assert_eq!(asked[1].1, 0.0, "the second at the run's (greedy)");
    assert_eq!(asked[1].0, 100 - "hel / ".len(), "the rest of the budget");
}
