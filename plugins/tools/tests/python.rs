//! The `python` tool through its registration, as an episode uses it.
//!
//! Needs the WASI interpreter (`make python-wasi`); `make test` builds it first.

use std::sync::Arc;

use areal_sdk::{BuildContext, PluginConfig, Tool, ToolOutput, ToolPlugin, ToolSession};
use serde_json::{Map, Value, json};

use areal_tools as _;

fn tool(options: Value) -> Arc<dyn Tool> {
    let mut config = PluginConfig::new("tools.python", "python");
    for (k, v) in options.as_object().expect("options").clone() {
        config = config.with(&k, v);
    }
    ToolPlugin::build_from(&config, &BuildContext::new(0, 1)).expect("the python tool")
}

fn code(source: &str) -> Map<String, Value> {
    json!({ "code": source })
        .as_object()
        .cloned()
        .expect("object")
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f)
}

async fn call(session: &mut Box<dyn ToolSession>, source: &str) -> ToolOutput {
    session
        .call(&code(source))
        .await
        .expect("the host runs the call")
}

#[test]
fn the_schema_tells_the_model_what_it_takes() {
    let t = tool(json!({}));
    let schema = t.schema();
    assert_eq!(schema.name, "python");
    assert_eq!(schema.parameters["required"], json!(["code"]));
    let function = schema.to_function();
    assert_eq!(function["type"], "function");
    assert_eq!(function["function"]["name"], "python");
    assert!(
        schema.description.contains("4096 bytes"),
        "{}",
        schema.description
    );
}

#[test]
fn bad_options_name_their_key() {
    let bad = |options: Value| {
        let mut config = PluginConfig::new("tools.python", "python");
        for (k, v) in options.as_object().unwrap().clone() {
            config = config.with(&k, v);
        }
        match ToolPlugin::build_from(&config, &BuildContext::new(0, 1)) {
            Ok(_) => panic!("{options} was accepted"),
            Err(e) => e.to_string(),
        }
    };
    let typo = bad(json!({ "timeout": 1.0 }));
    assert!(typo.contains("timeout"), "{typo}");
    let negative = bad(json!({ "timeout_s": -1.0 }));
    assert!(negative.contains("tools.python.timeout_s"), "{negative}");
    let tiny = bad(json!({ "memory_mb": 1 }));
    assert!(tiny.contains("tools.python.memory_mb"), "{tiny}");
}

#[test]
fn an_episode_keeps_its_names_and_another_does_not_see_them() {
    let t = tool(json!({}));
    block_on(async {
        let mut one = t.open(1).await.unwrap();
        let mut two = t.open(2).await.unwrap();
        let first = call(&mut one, "import math\nr = math.isqrt(10**12)\nr").await;
        assert_eq!(first, ToolOutput::ok("1000000\n"));
        assert_eq!(call(&mut one, "r + 1").await, ToolOutput::ok("1000001\n"));
        let other = call(&mut two, "r").await;
        assert!(other.error && other.text.contains("NameError"), "{other:?}");
    });
}

#[test]
fn a_bad_call_is_an_answer_the_model_reads() {
    let t = tool(json!({}));
    block_on(async {
        let mut s = t.open(0).await.unwrap();
        let missing = s.call(&Map::new()).await.unwrap();
        assert!(
            missing.error && missing.text.contains("{\"code\": \"...\"}"),
            "{missing:?}"
        );
        let number = s
            .call(json!({"code": 5}).as_object().unwrap())
            .await
            .unwrap();
        assert!(
            number.error && number.text.contains("must be a string"),
            "{number:?}"
        );
        let extra = s
            .call(json!({"code": "1", "timeout": 9}).as_object().unwrap())
            .await
            .unwrap();
        assert!(
            extra.error && extra.text.contains("unknown argument \"timeout\""),
            "{extra:?}"
        );
        let raised = call(&mut s, "x = 2\n[][x]").await;
        assert!(raised.error, "{raised:?}");
        assert!(
            raised.text.contains("IndexError: list index out of range"),
            "{raised:?}"
        );
        assert_eq!(
            call(&mut s, "x").await,
            ToolOutput::ok("2\n"),
            "the session went on"
        );
    });
}

#[test]
fn exit_quit_and_closed_streams_end_the_cell_and_keep_the_session() {
    let t = tool(json!({}));
    block_on(async {
        let mut s = t.open(0).await.unwrap();
        call(&mut s, "kept = 0").await;
        let ends = [
            "exit()",
            "quit()",
            "import sys\nsys.exit(3)",
            "import sys\nsys.stdin.close()",
            "import sys\nsys.stdout.close()",
        ];
        for (i, end) in ends.iter().enumerate() {
            let ended = call(&mut s, &format!("print('last words')\n{end}")).await;
            assert_eq!(ended, ToolOutput::ok("last words\n"), "{end}");
            assert_eq!(
                call(&mut s, "kept += 1\nkept").await,
                ToolOutput::ok(format!("{}\n", i + 1)),
                "after {end}, the same interpreter"
            );
        }
        // closing the descriptor itself leaves nothing to talk to: the session restarts
        let closed = call(&mut s, "import os\nprint('bye')\nos.close(1)").await;
        assert!(closed.error, "{closed:?}");
        assert!(
            closed.text.starts_with("bye\n[the interpreter crashed")
                && closed.text.ends_with(
                    "the next call starts a new interpreter: names defined before are gone]"
                ),
            "{closed:?}"
        );
        let gone = call(&mut s, "kept").await;
        assert!(gone.error && gone.text.contains("NameError"), "{gone:?}");
        assert_eq!(call(&mut s, "6 * 7").await, ToolOutput::ok("42\n"));
    });
}

#[test]
fn floods_loops_and_hoards_cost_one_call() {
    let t = tool(json!({ "timeout_s": 0.3, "memory_mb": 128, "output_bytes": 256 }));
    block_on(async {
        let mut s = t.open(0).await.unwrap();
        call(&mut s, "kept = 1").await;
        let flood = call(&mut s, "print('y' * 1_000_000)").await;
        assert!(!flood.error, "{flood:?}");
        assert!(
            flood.text.ends_with("\n[output cut at 256 bytes]"),
            "{:?}",
            &flood.text[200..]
        );
        assert_eq!(call(&mut s, "kept").await, ToolOutput::ok("1\n"));

        let spin = call(&mut s, "print('start')\nwhile True:\n    pass").await;
        assert!(spin.error, "{spin:?}");
        assert!(spin.text.starts_with("start\n[stopped: the call ran past its limit of 0.3 s; the next call starts a new interpreter"), "{spin:?}");
        let gone = call(&mut s, "kept").await;
        assert!(
            gone.error && gone.text.contains("NameError"),
            "a new interpreter: {gone:?}"
        );

        call(&mut s, "kept = 2").await;
        let hoard = call(&mut s, "blocks = [bytearray(1 << 20) for _ in range(500)]").await;
        assert!(
            hoard.error && hoard.text.contains("more than 128 MB"),
            "{hoard:?}"
        );
        assert_eq!(
            call(&mut s, "3 * 3").await,
            ToolOutput::ok("9\n"),
            "and the next call runs"
        );
    });
}

fn function_tool(
    dir: &std::path::Path,
    source: &str,
    options: Value,
) -> Result<Arc<dyn Tool>, String> {
    let path = dir.join("hypot.py");
    std::fs::write(&path, source).unwrap();
    let mut config = PluginConfig::new("tools[0]", "python-function")
        .with("path", json!(path))
        .with("description", json!("The hypotenuse."))
        .with(
            "parameters",
            json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}),
        );
    for (k, v) in options.as_object().unwrap().clone() {
        config = config.with(&k, v);
    }
    ToolPlugin::build_from(&config, &BuildContext::new(0, 1)).map_err(|e| e.to_string())
}

const HYPOT: &str = "import math\n_calls = 0\n\ndef hypot(a, b):\n    global _calls\n    _calls += 1\n    print('call', _calls)\n    return math.hypot(a, b)\n";

/// A Python function from a file is a tool: called by its name with keyword arguments, its
/// prints and its value come back, its module state lasts one episode, and a bad call is a
/// traceback the model reads.
#[test]
fn a_python_function_from_a_file_is_a_tool() {
    let dir = tempfile::tempdir().unwrap();
    let t = function_tool(dir.path(), HYPOT, json!({})).expect("the tool");
    assert_eq!(t.name(), "python-function");
    let schema = t.schema();
    assert_eq!(schema.name, "hypot", "called by the function's name");
    assert_eq!(schema.description, "The hypotenuse.");
    let args = |v: Value| v.as_object().cloned().unwrap();
    block_on(async {
        let mut one = t.open(1).await.unwrap();
        let first = one.call(&args(json!({"a": 3, "b": 4}))).await.unwrap();
        assert_eq!(first, ToolOutput::ok("call 1\n5.0\n"));
        let second = one.call(&args(json!({"a": 5, "b": 12}))).await.unwrap();
        assert_eq!(
            second,
            ToolOutput::ok("call 2\n13.0\n"),
            "state lasts the episode"
        );
        let mut two = t.open(2).await.unwrap();
        let other = two.call(&args(json!({"a": 3, "b": 4}))).await.unwrap();
        assert_eq!(other, ToolOutput::ok("call 1\n5.0\n"), "and no longer");
        let bad = one.call(&args(json!({"c": 1}))).await.unwrap();
        assert!(bad.error, "{bad:?}");
        assert!(
            bad.text.contains("TypeError") && bad.text.contains("'c'"),
            "{bad:?}"
        );
    });
}

#[test]
fn a_python_function_that_cannot_be_loaded_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let function_tool = |dir: &std::path::Path, source: &str, options: Value| match function_tool(
        dir, source, options,
    ) {
        Ok(_) => panic!("{source:?} was loaded"),
        Err(e) => Err::<(), String>(e),
    };
    let syntax = function_tool(dir.path(), "def hypot(a, b:\n", json!({})).unwrap_err();
    assert!(
        syntax.contains("tools[0].path")
            && syntax.contains("hypot.py")
            && syntax.contains("SyntaxError"),
        "{syntax}"
    );
    let missing = function_tool(dir.path(), HYPOT, json!({"function": "area"})).unwrap_err();
    assert!(missing.contains("defines no function 'area'"), "{missing}");
    let schema =
        function_tool(dir.path(), HYPOT, json!({"parameters": {"type": "string"}})).unwrap_err();
    assert!(schema.contains("tools[0].parameters"), "{schema}");
}

/// Issue 45: a `python-function` tool importing `random` and numpy drew the same numbers in
/// every episode of every run (their state was frozen in the snapshot). Each episode now
/// draws from its own seed: the same seed gives the same draws (deterministic mode), another
/// seed others.
#[test]
fn a_function_tools_random_numbers_are_each_episodes_own() {
    let dir = tempfile::tempdir().unwrap();
    let source = "import random\nimport numpy as np\n\ndef hypot(a, b):\n    return [random.getrandbits(30), int(np.random.randint(1 << 30))]\n";
    let t =
        function_tool(dir.path(), source, json!({ "mode": "deterministic" })).expect("the tool");
    block_on(async {
        let mut draws = Vec::new();
        for seed in [7, 7, 8, 9] {
            let mut s = t.open(seed).await.unwrap();
            let first = s
                .call(json!({"a": 1, "b": 2}).as_object().unwrap())
                .await
                .unwrap();
            let second = s
                .call(json!({"a": 1, "b": 2}).as_object().unwrap())
                .await
                .unwrap();
            assert!(!first.error, "{first:?}");
            assert_ne!(first.text, second.text, "a stream, not one number");
            draws.push(first.text);
        }
        assert_eq!(
            draws[0], draws[1],
            "the same seed, the same draws: {draws:?}"
        );
        assert!(
            draws[1] != draws[2] && draws[2] != draws[3] && draws[1] != draws[3],
            "{draws:?}"
        );
    });
}

/// The sessions of every Python tool of a process, `python` and `python-function` alike, hold
/// no more memory together than its budget (`AREAL_SESSION_MEMORY_MB`, set here to 320 MiB in
/// a process of the test's own): the session that does not fit is refused and the call that
/// would pass it stopped, both naming the budget and its setting; an episode's session that
/// ends gives its memory back.
#[test]
fn the_sessions_of_every_python_tool_share_the_processs_memory_budget() {
    const NAME: &str = "the_sessions_of_every_python_tool_share_the_processs_memory_budget";
    if std::env::var_os("AREAL_TEST_BUDGET_CHILD").is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
            .env("AREAL_TEST_BUDGET_CHILD", "1")
            .env(areal_sandbox::SESSION_MEMORY_ENV, "320")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{said}");
        assert!(said.contains("1 passed"), "{said}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let plain = tool(json!({}));
    let function = function_tool(dir.path(), HYPOT, json!({})).expect("the tool");
    let args = json!({"a": 3, "b": 4}).as_object().cloned().unwrap();
    block_on(async {
        let mut open = Vec::new();
        let refused = loop {
            let t = if open.len() % 2 == 0 {
                &plain
            } else {
                &function
            };
            let mut s = t.open(open.len() as u64).await.unwrap();
            let first = if open.len() % 2 == 0 {
                s.call(&code("1")).await
            } else {
                s.call(&args).await
            };
            match first {
                Ok(answer) => assert!(!answer.error, "{answer:?}"),
                Err(e) => break e.to_string(),
            }
            open.push(s);
            assert!(open.len() < 10, "10 sessions in 320 MiB");
        };
        assert!(open.len() >= 2, "{refused}");
        for words in [
            "no memory left for another session",
            "320 MiB",
            "AREAL_SESSION_MEMORY_MB=320",
        ] {
            assert!(refused.contains(words), "{words}: {refused}");
        }
        // a call growing past what is left: stopped, naming the budget, the others go on
        let hoard = call(
            &mut open[0],
            "blocks = [bytearray(1 << 20) for _ in range(200)]",
        )
        .await;
        assert!(hoard.error, "{hoard:?}");
        assert!(
            hoard
                .text
                .contains("more memory than is left of the 320 MiB"),
            "{hoard:?}"
        );
        assert!(
            hoard.text.contains("AREAL_SESSION_MEMORY_MB=320"),
            "{hoard:?}"
        );
        assert_eq!(call(&mut open[0], "2 + 2").await, ToolOutput::ok("4\n"));
        assert_eq!(
            open[1].call(&args).await.unwrap(),
            ToolOutput::ok("call 2\n5.0\n")
        );
        // episodes end: their memory is the next one's
        open.clear();
        let mut next = plain.open(99).await.unwrap();
        assert_eq!(call(&mut next, "3 * 3").await, ToolOutput::ok("9\n"));
    });
}
