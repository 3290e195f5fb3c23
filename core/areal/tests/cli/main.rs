//! The `areal` binary: plugin listing, a short training run, config errors, code and maths
//! grading, benches, resuming runs (`resume.rs`), any config's reward (`reward.rs`).

use std::process::{Command, Output};

mod resume;
mod reward;

fn areal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_areal"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run areal")
}

/// The testkit's fast config, written to a file in `dir`.
fn testkit_config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("testkit.toml");
    std::fs::write(&path, areal_testkit::CONFIG).unwrap();
    path
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A grade command's output: one JSON value per line.
fn json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    text(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The `verdict` of each graded line.
fn verdicts(results: &[serde_json::Value]) -> Vec<&str> {
    results
        .iter()
        .map(|r| r["verdict"].as_str().unwrap())
        .collect()
}

/// A plugin that silently fails to register is a known inventory pitfall: the binary must
/// list exactly these.
#[test]
fn plugins_lists_every_built_in_plugin() {
    let out = areal(&["plugins", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut found: Vec<(String, String)> = list
        .iter()
        .map(|p| {
            (
                p["kind"].as_str().unwrap().to_owned(),
                p["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    found.sort();
    let expected = [
        ("algorithm", "areal-grpo"),
        ("algorithm", "dapo"),
        ("algorithm", "decoupled-ppo"),
        ("algorithm", "dr-grpo"),
        ("algorithm", "grpo"),
        ("algorithm", "gspo"),
        ("algorithm", "m2po"),
        ("algorithm", "ppo"),
        ("algorithm", "ppo-critic"),
        ("algorithm", "reinforce++"),
        ("algorithm", "rloo"),
        ("algorithm", "sapo"),
        ("episode", "agent"),
        ("episode", "retry"),
        ("episode", "single-turn"),
        ("episode", "testkit-relay"),
        ("episode", "tool-calls"),
        ("generator", "burn"),
        ("generator", "remote"),
        ("generator", "sglang"),
        ("generator", "testkit-bigram"),
        ("generator", "vllm"),
        ("policy", "testkit-bigram"),
        ("policy", "transformer"),
        ("reward", "chain-sum"),
        ("reward", "lcb"),
        ("reward", "math"),
        ("reward", "python"),
        ("reward", "remote"),
        ("reward", "testkit-faulty"),
        ("reward", "testkit-successor"),
        ("reward", "tool-mul"),
        ("reward", "wasm"),
        ("task", "chain-sum"),
        ("task", "code"),
        ("task", "code-arith"),
        ("task", "math"),
        ("task", "testkit-successor"),
        ("task", "tool-mul"),
        ("tool", "python"),
        ("tool", "python-function"),
        ("tool", "remote"),
        ("tool", "testkit-shift"),
        ("tool", "wasm"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(k, n)| (k.to_string(), n.to_string()))
        .collect();
    assert_eq!(found, expected);
    assert!(
        list.iter()
            .all(|p| !p["description"].as_str().unwrap().is_empty())
    );

    let table = areal(&["plugins"]);
    let table = text(&table.stdout);
    assert!(table.starts_with("KIND"), "{table}");
    assert!(table.contains("decoupled-ppo"));
}

#[test]
fn train_writes_a_run_folder() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let config = testkit_config(dir.path());
    let out = areal(&[
        "train",
        "-q",
        "--config",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--set",
        "train.steps=5",
        "--seed",
        "9",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("trained 5 steps"), "{stdout}");
    for file in [
        "config.toml",
        "metrics.jsonl",
        "summary.json",
        "accuracy.png",
        "checkpoint/bigram.json",
    ] {
        assert!(run.join(file).exists(), "{file} missing");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["seed"], 9);
    assert_eq!(summary["steps"], 5);
    assert!(
        std::fs::read_to_string(run.join("config.toml"))
            .unwrap()
            .contains("seed = 9")
    );
}

/// Every file under `dir` (relative path, bytes), sorted.
fn tree(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    fn walk(dir: &std::path::Path, prefix: &str, out: &mut Vec<(String, Vec<u8>)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if entry.file_type().unwrap().is_dir() {
                walk(&entry.path(), &format!("{name}/"), out);
            } else {
                out.push((name, std::fs::read(entry.path()).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out);
    out.sort();
    out
}

/// `areal train --out` given a finished run's folder once replaced it, checkpoints and
/// summary gone, exit 0. A folder that is not empty is refused, untouched; `--overwrite`
/// deletes only what a run writes there.
#[test]
fn a_run_folder_that_is_not_empty_is_refused_unless_overwrite_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let config = testkit_config(dir.path());
    let train = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "-q",
            "--config",
            config.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
            "--set",
            "train.steps=6",
            "--set",
            "checkpoint.every=2",
        ];
        args.extend_from_slice(extra);
        areal(&args)
    };
    // an empty folder (made by a scheduler, say) is a new run's
    std::fs::create_dir(&run).unwrap();
    let first = train(&["--seed", "3"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    std::fs::write(run.join("notes.txt"), "the user's own").unwrap();
    let before = tree(&run);
    assert!(
        before
            .iter()
            .any(|(name, _)| name.starts_with("checkpoints/")),
        "{:?}",
        before.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    let again = train(&["--seed", "4"]);
    let stderr = text(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is not empty")
            && stderr.contains("checkpoints")
            && stderr.contains("config.toml")
            && stderr.contains("3 more")
            && stderr.contains(&format!("--resume {}", run.display()))
            && stderr.contains("--overwrite"),
        "{stderr}"
    );
    assert!(tree(&run) == before, "the refused run changed the folder");
    // asked by name: the run starts afresh, the user's own file stays
    let third = train(&["--seed", "4", "--overwrite"]);
    assert!(third.status.success(), "{}", text(&third.stderr));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        (summary["seed"].as_u64(), summary["steps"].as_u64()),
        (Some(4), Some(6))
    );
    assert_eq!(
        std::fs::read_to_string(run.join("notes.txt")).unwrap(),
        "the user's own"
    );
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps = metrics
        .lines()
        .filter(|l| l.contains("\"event\":\"step\""))
        .count();
    assert_eq!(steps, 6, "the old run's records are gone");
    // --overwrite needs --out: it never applies to a default folder by accident
    let bare = areal(&["train", "--overwrite", "-q"]);
    assert_eq!(bare.status.code(), Some(2), "{}", text(&bare.stderr));
}

#[test]
fn config_prints_the_resolved_config() {
    let out = areal(&[
        "config",
        "--set",
        "rollout.max_staleness=0",
        "--set",
        "algorithm.kind=ppo",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let toml = text(&out.stdout);
    assert!(toml.contains("max_staleness = 0"), "{toml}");
    assert!(toml.contains("kind = \"ppo\""), "{toml}");
}

fn failure(args: &[&str]) -> String {
    let out = areal(args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected a config error from {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stderr)
}

#[test]
fn config_errors_name_the_key_the_origin_and_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.toml");
    std::fs::write(&file, "[rollout]\nmax_stalenes = 2\n").unwrap();
    let err = failure(&["train", "-q", "--config", file.to_str().unwrap()]);
    assert!(
        err.contains("`rollout.max_stalenes`")
            && err.contains("run.toml")
            && err.contains("unknown field"),
        "{err}"
    );

    let err = failure(&["train", "-q", "--set", "rollout.max_staleness=abc"]);
    assert!(
        err.contains("`rollout.max_staleness`")
            && err.contains("--set rollout.max_staleness=abc")
            && err.contains("\"abc\""),
        "{err}"
    );

    let err = failure(&["train", "-q", "--set", "algorithm.kind=grpo9"]);
    assert!(
        err.contains("grpo9")
            && err.contains("decoupled-ppo, dr-grpo, grpo, gspo")
            && err.contains("--set algorithm.kind=grpo9"),
        "{err}"
    );

    let err = failure(&["train", "-q", "--set", "algorithm.eps_clip=3"]);
    assert!(
        err.contains("`algorithm.eps_clip`")
            && err.contains("found 3")
            && err.contains("--set algorithm.eps_clip=3"),
        "{err}"
    );

    std::fs::write(
        &file,
        "[generator]\nkind = \"testkit-bigram\"\njitter = 2.0\n[train]\nlr = -1\n",
    )
    .unwrap();
    let err = failure(&["train", "-q", "--config", file.to_str().unwrap()]);
    assert!(
        err.contains("`train.lr`") && err.contains("found -1"),
        "{err}"
    );
    assert!(
        err.contains("`generator.jitter`"),
        "plugin and engine problems are reported together: {err}"
    );

    // Values that once deadlocked, wrapped, aborted on a multi-TB allocation or misled.
    for (set, key, says) in [
        (
            "rollout.group_size=4611686018427387904",
            "`rollout.group_size`",
            "between 1 and 65536",
        ),
        (
            "rollout.batch_size=1000000000000",
            "`rollout.batch_size`",
            "found 1000000000000",
        ),
        (
            "rollout.max_new_tokens=1000000000",
            "`rollout.max_new_tokens`",
            "found 1000000000",
        ),
        ("policy.hidden_size=1000000", "`policy`", "needs about"),
        (
            "generator.threads=2000",
            "`generator.threads`",
            "2000 threads",
        ),
        ("train.lr=nan", "`train.lr`", "not a finite number"),
        ("seed=9223372036854775808", "`seed`", "out of range"),
    ] {
        let err = failure(&["train", "-q", "--set", set]);
        assert!(
            err.contains(key) && err.contains(says) && !err.contains("null"),
            "{set}: {err}"
        );
    }
    // A checkpoint whose config.json claims 10^9 layers is refused before its weights are read.
    let checkpoint = dir.path().join("huge");
    std::fs::create_dir_all(&checkpoint).unwrap();
    std::fs::write(
        checkpoint.join("config.json"),
        r#"{"vocab_size": 100, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 1000000000, "num_attention_heads": 4, "max_position_embeddings": 128}"#,
    )
    .unwrap();
    let set = format!("policy.path={}", checkpoint.display());
    let err = failure(&["train", "-q", "--set", &set]);
    assert!(
        err.contains("`policy`")
            && err.contains("config.json")
            && err.contains("1000000000 layers")
            && err.contains("needs about"),
        "{err}"
    );

    let out = areal(&["train", "-q", "--seed", "9223372036854775808"]);
    assert_eq!(out.status.code(), Some(2), "clap's own usage error");
    assert!(text(&out.stderr).contains("--seed"));

    let missing = dir.path().join("nope.toml");
    let err = failure(&["train", "--config", missing.to_str().unwrap()]);
    assert!(err.contains("nope.toml"), "{err}");
}

#[test]
fn plugin_option_errors_come_with_their_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.toml");
    std::fs::write(
        &file,
        "[generator]\nkind = \"testkit-bigram\"\njitter = 2.0\n",
    )
    .unwrap();
    let err = failure(&["train", "-q", "--config", file.to_str().unwrap()]);
    assert!(
        err.contains("`generator.jitter`") && err.contains("found 2") && err.contains("run.toml"),
        "{err}"
    );
}

/// One JSON line out per line in, in order; a bad line is an `error` line and grading goes on.
#[test]
fn grade_code_answers_every_line_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../rewards/code/tests/fixtures/lcb_reference.jsonl");
    let mut lines: Vec<String> = std::fs::read_to_string(fixtures)
        .unwrap()
        .lines()
        .take(4)
        .map(str::to_owned)
        .collect();
    // a wrong program, a line that is not JSON, a record with neither code nor completion
    let mut wrong: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    wrong["code"] = "print(0)".into();
    let mut neither = wrong.clone();
    neither.as_object_mut().unwrap().remove("code");
    lines.insert(1, wrong.to_string());
    lines.insert(3, "{not json".into());
    lines.push(neither.to_string());
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = areal(&[
        "grade",
        "code",
        input.to_str().unwrap(),
        "--timeout",
        "2",
        "-j",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = json_lines(&out.stdout);
    let verdicts = verdicts(&results);
    assert_eq!(
        verdicts,
        [
            "accepted",
            "wrong_answer",
            "accepted",
            "error",
            "accepted",
            "accepted",
            "error"
        ]
    );
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["line"], i + 1);
        for key in ["reward", "passed", "total", "wall_ms", "provenance"] {
            assert!(r.get(key).is_some(), "line {}: no {key}", i + 1);
        }
    }
    assert_eq!(results[0]["reward"], 1.0);
    assert_eq!(results[1]["reward"], 0.0);
    assert!(
        results[3]["provenance"]["details"]["message"]
            .as_str()
            .unwrap()
            .contains("line 4: not JSON")
    );
    assert!(
        text(&out.stderr).contains("graded 7 lines"),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 32: a record of more than 64 MiB (which `--max-tests-mb` admits) failed with `-j 2`
/// ("h2 protocol error", both workers reported failed) and was graded with `-j 1`. Worker
/// processes and in-process grading give the same verdict for every record the limits
/// admit; a line past them is refused unread, the same way with either.
#[test]
fn grade_code_gives_the_same_verdicts_in_workers_and_in_process_at_any_size() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../rewards/code/tests/fixtures/lcb_reference.jsonl");
    let first = std::fs::read_to_string(fixtures).unwrap();
    let record: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    let mut big = record.clone();
    big["question_content"] = "x".repeat(70 << 20).into();
    let input = dir.path().join("in.jsonl");
    let lines = [record.to_string(), big.to_string(), record.to_string()];
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let input = input.to_str().unwrap();
    let mut seen: Vec<Vec<String>> = Vec::new();
    for j in ["1", "2"] {
        // --max-tests-mb 1: a line may hold 2 × 1 MiB of tests and 64 MiB besides
        let tight = areal(&["grade", "code", input, "-j", j, "-q", "--max-tests-mb", "1"]);
        let roomy = areal(&["grade", "code", input, "-j", j, "-q"]);
        for out in [&tight, &roomy] {
            assert!(out.status.success(), "-j {j}: {}", text(&out.stderr));
        }
        let tight = json_lines(&tight.stdout);
        assert_eq!(
            verdicts(&tight),
            ["accepted", "error", "accepted"],
            "-j {j}"
        );
        let why = tight[1]["provenance"]["details"]["message"]
            .as_str()
            .unwrap();
        assert!(why.contains("line 2: longer than 66 MiB"), "{why}");
        let roomy = json_lines(&roomy.stdout);
        assert_eq!(verdicts(&roomy), ["accepted"; 3], "-j {j}");
        seen.push(
            verdicts(&tight)
                .into_iter()
                .chain(verdicts(&roomy))
                .map(str::to_owned)
                .collect(),
        );
    }
    assert_eq!(seen[0], seen[1]);
}

/// Lines that once ended the command, crashed it or filled memory: each becomes an `error`
/// line naming its line, and every other line is still graded, in order.
#[test]
fn grade_code_survives_bad_lines_deep_values_and_bombs() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../rewards/code/tests/fixtures/lcb_reference.jsonl");
    let good: Vec<Vec<u8>> = std::fs::read_to_string(fixtures)
        .unwrap()
        .lines()
        .take(3)
        .map(|l| l.as_bytes().to_vec())
        .collect();
    // A functional answer nested 10 000 deep (once a stack overflow that lost every line).
    let depth = 10_000;
    let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    let tests = serde_json::json!([{"input": depth.to_string(), "output": nested, "testtype": "functional"}]);
    let deep = serde_json::json!({
        "question_id": "deep",
        "public_test_cases": tests.to_string(),
        "metadata": "{\"func_name\": \"nest\"}",
        "code": "def nest(n):\n    v = 1\n    for _ in range(n):\n        v = [v]\n    return v",
    });
    // A zlib bomb: 3 MiB of private tests from a few KiB (past --max-tests-mb 1).
    let mut pickle = vec![0x80, 4, 0x8d];
    pickle.extend((3u64 << 20).to_le_bytes());
    pickle.extend(std::iter::repeat_n(b'x', 3 << 20));
    pickle.extend([0x94, b'.']);
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(&pickle).unwrap();
    let bomb = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(z.finish().unwrap())
    };
    let mut bombed: serde_json::Value = serde_json::from_slice(&good[0]).unwrap();
    bombed["private_test_cases"] = bomb.into();
    let lines: Vec<Vec<u8>> = vec![
        good[0].clone(),
        b"{\"code\": \"print(1)\xff\xfe\"}".to_vec(),
        good[1].clone(),
        deep.to_string().into_bytes(),
        bombed.to_string().into_bytes(),
        format!("{}{}", "[".repeat(6000), "]".repeat(6000)).into_bytes(),
        good[2].clone(),
    ];
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, lines.join(&b"\n"[..])).unwrap();
    let out = areal(&[
        "grade",
        "code",
        input.to_str().unwrap(),
        "--max-tests-mb",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = json_lines(&out.stdout);
    let verdicts = verdicts(&results);
    assert_eq!(
        verdicts,
        [
            "accepted", "error", "accepted", "accepted", "error", "error", "accepted"
        ]
    );
    let message = |i: usize| {
        results[i]["provenance"]["details"]["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        message(1).starts_with("line 2: not UTF-8"),
        "{}",
        message(1)
    );
    assert!(
        message(4).contains("line 5: private_test_cases: decompresses to more than 1 MiB"),
        "{}",
        message(4)
    );
    assert!(message(5).starts_with("line 6: "), "{}", message(5));
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["line"], i + 1);
    }
}

/// Limits out of range are refused by name before anything runs, never a panic (exit 101)
/// or a silent wrap.
#[test]
fn grade_flags_out_of_range_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{}\n").unwrap();
    let input = input.to_str().unwrap();
    for (command, args, flag) in [
        ("code", &["--timeout", "1e300"][..], "--timeout"),
        ("code", &["--timeout", "inf"], "--timeout"),
        ("code", &["--timeout", "nan"], "--timeout"),
        ("code", &["--time-scale", "1e300"], "--time-scale"),
        ("code", &["--memory-mb", "17592186044416"], "--memory-mb"),
        ("code", &["--memory-mb", "0"], "--memory-mb"),
        ("code", &["--output-bytes", "0"], "--output-bytes"),
        ("code", &["--fuel", "0"], "--fuel"),
        ("code", &["--max-tests-mb", "0"], "--max-tests-mb"),
        ("code", &["-j", "1000"], "--threads 1000"),
        ("code", &["-j", "0"], "--threads 0"),
        ("math", &["--timeout", "1e300"], "--timeout"),
        ("math", &["--timeout", "inf"], "--timeout"),
        ("math", &["--float-rounding", "16"], "--float-rounding"),
        ("math", &["-j", "1000"], "--threads 1000"),
    ] {
        let mut all = vec!["grade", command, input];
        all.extend(args);
        let out = areal(&all);
        let stderr = text(&out.stderr);
        // Issue 32: these exited 1 where clap's own usage errors exit 2: one rule.
        assert_eq!(out.status.code(), Some(2), "{all:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(flag),
            "{all:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{all:?}");
    }
}

/// `areal bench controller` runs the engine with the in-flight limit it is given and prints one
/// table row per setting (what the figures are is for the bench to say, not this test).
#[test]
fn bench_controller_prints_a_row_per_setting() {
    let out = areal(&[
        "bench",
        "controller",
        "--in-flight",
        "40,200",
        "--batch",
        "50",
        "--steps",
        "6",
        "--rounds",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("| 40 |") || l.starts_with("| 200 |"))
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    // η is chosen so that the rule admits the whole in-flight limit, and it is reached
    assert!(
        rows[1].starts_with("| 200 | 4 |") && rows[1].contains("| 200 |"),
        "{table}"
    );
    let err = failure(&["bench", "controller", "--steps", "2"]);
    assert!(err.contains("--steps"), "{err}");
}

#[test]
fn grade_math_answers_every_line_in_order_on_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = vec![
        r#"{"gold": "\\frac{14}{3}", "pred": "So the answer is $\\boxed{\\dfrac{14}{3}}$.", "id": "a"}"#.to_string(),
        r#"{"gold": "\\frac{1}{3}", "pred": "The answer is 0.33."}"#.to_string(),
        "{not json".to_string(),
        r#"{"gold": "3"}"#.to_string(),
        r#"{"gold": "(1,2)", "pred": "I do not know."}"#.to_string(),
        r#"{"gold": "1,22", "pred": "1.22", "config": {"match_types": ["expr"]}}"#.to_string(),
        r#"{"gold": "1", "pred": "1", "config": {"match_type": ["expr"]}}"#.to_string(),
    ];
    // and many more, so that the threads share the work
    for k in 0..600 {
        lines.push(format!(
            r#"{{"gold": "{k}", "pred": "$\\boxed{{{}}}$"}}"#,
            k + k % 2
        ));
    }
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let run = |threads: &str| {
        let out = areal(&["grade", "math", input.to_str().unwrap(), "-j", threads]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let results = json_lines(&out.stdout);
        (results, text(&out.stderr))
    };
    let (results, stderr) = run("1");
    assert_eq!(results.len(), 607);
    let verdicts = verdicts(&results[..7]);
    assert_eq!(
        verdicts,
        [
            "accepted",
            "wrong_answer",
            "error",
            "error",
            "no_answer",
            "accepted",
            "error"
        ]
    );
    assert_eq!(results[0]["id"], "a");
    assert_eq!(results[0]["gold"], "14/3");
    assert_eq!(results[0]["pred"], "14/3");
    assert_eq!(results[1]["pred"], "0.33");
    assert!(
        results[2]["error"]
            .as_str()
            .unwrap()
            .contains("line 3: not JSON")
    );
    assert!(
        results[3]["error"]
            .as_str()
            .unwrap()
            .contains("line 4: no `pred`")
    );
    assert!(
        results[6]["error"]
            .as_str()
            .unwrap()
            .contains("unknown config key `match_type`")
    );
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["line"], i + 1);
    }
    let accepted = results[7..].iter().filter(|r| r["reward"] == 1.0).count();
    assert_eq!(accepted, 300, "even k are boxed as k, odd k as k + 1");
    assert!(stderr.contains("graded 607 lines"), "{stderr}");
    let (threaded, _) = run("3");
    let strip = |rs: &[serde_json::Value]| -> Vec<serde_json::Value> {
        rs.iter()
            .map(|r| {
                let mut r = r.clone();
                r.as_object_mut().unwrap().remove("wall_ms");
                r
            })
            .collect()
    };
    assert_eq!(strip(&threaded), strip(&results));
}

/// A line that is not UTF-8 once ended the command and lost the lines after it.
#[test]
fn grade_math_answers_the_lines_after_one_that_is_not_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let mut bytes = br#"{"gold": "2", "pred": "$2$"}"#.to_vec();
    bytes.extend(b"\n{\"gold\": \"2\", \"pred\": \"\xff\"}\n");
    bytes.extend(br#"{"gold": "3", "pred": "$3$"}"#);
    std::fs::write(&input, bytes).unwrap();
    let out = areal(&["grade", "math", input.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = json_lines(&out.stdout);
    let verdicts = verdicts(&results);
    assert_eq!(verdicts, ["accepted", "error", "accepted"]);
    let error = results[1]["error"].as_str().unwrap();
    assert!(error.starts_with("line 2: not UTF-8"), "{error}");
}

/// `areal bench math` prints a row per kind of pair (Math-Verify left out: it is measured by
/// hand, with the figures in docs/benchmarks.md).
#[test]
fn bench_math_prints_a_row_per_kind_of_pair() {
    let answers = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../rewards/math/tests/fixtures/math500.jsonl");
    let out = areal(&[
        "bench",
        "math",
        "--answers",
        answers.to_str().unwrap(),
        "--threads",
        "1,2",
        "--seconds",
        "0.05",
        "--no-reference",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    for row in [
        "| identical (gold against gold) | 500 |",
        "| \\dfrac for \\frac | 68 |",
        "| boxed in prose | 500 |",
        "| perturbed (unequal) | 500 |",
    ] {
        assert!(table.contains(row), "{row} missing from\n{table}");
    }
    assert!(table.contains("500 (100.0 % right)"), "{table}");
}

/// `areal train` in the background, its stderr read line by line as it comes.
struct Background {
    child: std::process::Child,
    stderr: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Background {
    /// `areal train -q --config testkit.toml --out RUN` plus `args`, through `sh -c` with
    /// `prefix` (e.g. a `ulimit`).
    fn train(dir: &std::path::Path, run: &std::path::Path, prefix: &str, args: &[&str]) -> Self {
        let config = testkit_config(dir);
        let mut command = format!(
            "{prefix} exec '{}' train -q --config '{}' --out '{}'",
            env!("CARGO_BIN_EXE_areal"),
            config.display(),
            run.display()
        );
        for a in args {
            command.push_str(&format!(" '{a}'"));
        }
        let mut child = Command::new("sh")
            .args(["-c", &command])
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start areal train");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stderr).lines() {
                if tx.send(line.unwrap_or_default()).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stderr: rx,
            seen: Vec::new(),
        }
    }

    /// Send `signal` (`INT`, `TERM`) to the run (with the shell's own `kill`).
    fn signal(&self, signal: &str) {
        let kill = format!("kill -{signal} {}", self.child.id());
        let status = Command::new("sh").args(["-c", &kill]).status().unwrap();
        assert!(status.success(), "{kill}");
    }

    /// Wait (at most two minutes) until a stderr line contains `text`.
    fn wait_for_stderr(&mut self, text: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !self.seen.iter().any(|l| l.contains(text)) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no {text:?} on stderr; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// Wait for the process; its exit code and whole stderr.
    fn finish(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        self.seen.extend(self.stderr.iter());
        (status.code(), self.seen.join("\n"))
    }
}

/// Wait (at most two minutes) until `path` exists and holds a line with `text`.
fn wait_for_line(path: &std::path::Path, text: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let found = std::fs::read_to_string(path).is_ok_and(|t| t.contains(text));
        if found {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} never held {text:?}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Files of a run folder whose names say they were never finished.
fn leftovers(run: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial") || n.contains(".old-"))
        .collect()
}

/// SIGINT and SIGTERM once ended a run at once, with no summary, no checkpoint and
/// sometimes a 0-byte plot. Now the step in progress finishes, the checkpoint, the plot and
/// the summary are written whole, and the exit status is 130.
#[test]
fn a_signal_stops_a_run_cleanly_with_everything_saved() {
    for signal in ["INT", "TERM"] {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let slow = Background::train(
            dir.path(),
            &run,
            "",
            &[
                "--set",
                "train.steps=100000",
                "--set",
                "generator.token_delay_us=2000",
                "--set",
                "eval.every=2",
            ],
        );
        wait_for_line(&run.join("metrics.jsonl"), "\"step\":3,");
        slow.signal(signal);
        let (code, stderr) = slow.finish();
        assert_eq!(code, Some(130), "SIG{signal}: {stderr}");
        assert!(
            stderr.contains(&format!("SIG{signal}: stopping")),
            "{stderr}"
        );
        assert!(stderr.contains("interrupted after"), "{stderr}");
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(summary["interrupted"], true);
        assert_eq!(summary["checkpoint"], "checkpoint");
        let steps = summary["steps"].as_u64().unwrap();
        assert!((3..100_000).contains(&steps), "{steps}");
        assert!(run.join("checkpoint/bigram.json").exists());
        let png = std::fs::read(run.join("accuracy.png")).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 1000);
        let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        let step_lines = metrics
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("whole lines"))
            .filter(|v| v["event"] == "step")
            .count();
        assert_eq!(step_lines as u64, steps, "every step trained is recorded");
        assert!(leftovers(&run).is_empty(), "{:?}", leftovers(&run));
    }
}

/// A second signal quits at once, without waiting for what the first one asked for.
#[test]
fn a_second_signal_quits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // The baseline evaluation sleeps 8 tokens × 0.4 s per item: a clean stop waits for it.
    let slow = Background::train(
        dir.path(),
        &run,
        "",
        &["--set", "generator.token_delay_us=400000"],
    );
    wait_for_line(&run.join("config.toml"), "seed");
    std::thread::sleep(std::time::Duration::from_millis(300));
    slow.signal("INT");
    std::thread::sleep(std::time::Duration::from_millis(200));
    slow.signal("INT");
    let (code, stderr) = slow.finish();
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains("SIGINT again: quitting at once"),
        "{stderr}"
    );
    assert!(
        !run.join("summary.json").exists(),
        "it did not wait for the clean stop"
    );
}

/// Two runs given the same folder once both ran, interleaving their records.
#[test]
fn a_run_folder_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let first = Background::train(
        dir.path(),
        &run,
        "",
        &[
            "--set",
            "train.steps=100000",
            "--set",
            "generator.token_delay_us=2000",
        ],
    );
    wait_for_line(&run.join("metrics.jsonl"), "\"event\":\"step\"");
    let config = testkit_config(dir.path());
    let second = areal(&[
        "train",
        "-q",
        "--config",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ]);
    let stderr = text(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is in use by another run") && stderr.contains("run.lock"),
        "{stderr}"
    );
    first.signal("TERM");
    let (code, stderr) = first.finish();
    assert_eq!(code, Some(130), "{stderr}");
    // the folder is free again, and what the first run wrote is its own
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["interrupted"], true);
}

/// A tiny transformer run whose checkpoint (~100 KB) is past the 32 KiB a file may grow to:
/// the disk is "full" for the checkpoint only (a soft `ulimit -f`, which `prlimit` can lift
/// from outside, with SIGXFSZ ignored so that the write fails instead of killing the process).
const FULL_DISK: &str = "trap '' XFSZ; ulimit -S -f 32;";
const TINY_TRANSFORMER: &[&str] = &[
    "--set",
    "policy={kind = \"transformer\", alphabet = \"abcdefghij\", hidden_size = 32, layers = 2, heads = 2, kv_heads = 1, max_positions = 32}",
    "--set",
    "generator.kind=burn",
    "--set",
    "train.steps=2",
    "--set",
    "eval.enabled=false",
];

/// A full disk at the final checkpoint once lost the trained model after all its steps.
/// Now saving is retried (`checkpoint.retry_s`): freeing space saves the model; giving up
/// leaves nothing half-written and says where and why.
#[test]
fn a_full_disk_at_the_checkpoint_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut args = TINY_TRANSFORMER.to_vec();
    args.extend(["--set", "checkpoint.retry_s=300"]);
    let mut full = Background::train(dir.path(), &run, FULL_DISK, &args);
    full.wait_for_stderr("cannot save the checkpoint");
    assert!(!run.join("checkpoint").exists());
    // space is freed: the file-size limit of the running process is lifted
    let pid = full.child.id().to_string();
    let lifted = Command::new("prlimit")
        .args(["--pid", &pid, "--fsize=unlimited:unlimited"])
        .output()
        .expect("prlimit (util-linux)");
    assert!(lifted.status.success(), "{}", text(&lifted.stderr));
    let (code, stderr) = full.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("trying again in 10 s"), "{stderr}");
    let weights = std::fs::metadata(run.join("checkpoint/model.safetensors")).unwrap();
    assert!(
        weights.len() > 8 << 10,
        "the whole model: {} bytes",
        weights.len()
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["checkpoint"], "checkpoint");
    assert!(leftovers(&run).is_empty(), "{:?}", leftovers(&run));

    // No retry: the run fails naming the checkpoint, and leaves no part of it behind.
    let run = dir.path().join("gave-up");
    let mut args = TINY_TRANSFORMER.to_vec();
    args.extend(["--set", "checkpoint.retry_s=0"]);
    let (code, stderr) = Background::train(dir.path(), &run, FULL_DISK, &args).finish();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot save the checkpoint to") && stderr.contains("checkpoint.retry_s"),
        "{stderr}"
    );
    assert!(!run.join("checkpoint").exists());
    assert!(leftovers(&run).is_empty(), "{:?}", leftovers(&run));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 2);
    assert!(summary["checkpoint"].is_null());
}

/// The built-in code job's config loads, its model reads every character of the task, and a
/// few RL steps run with every reward graded in the sandbox (none a failure), reported with
/// its latency next to generation and training.
#[test]
fn the_code_job_trains_on_rewards_from_the_sandbox() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = root.join("rewards/code/examples/code-arith.toml");
    let text_of_config = std::fs::read_to_string(&config).unwrap();
    assert!(
        text_of_config.contains(&format!(
            "alphabet = {:?}",
            areal_tasks::code_arith::ALPHABET
        )),
        "the job's alphabet is the task's"
    );
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = areal(&[
        "train",
        "-q",
        "--config",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--set",
        "warmup.enabled=false",
        "--set",
        "train.steps=3",
        "--set",
        "eval.max_items=16",
        "--set",
        "rollout.batch_size=2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|m: &serde_json::Value| m["event"] == "step")
        .collect();
    assert_eq!(steps.len(), 3);
    for m in &steps {
        assert_eq!(m["reward_failures"], 0, "{m}");
        assert!(m["reward_latency_p50_ms"].as_f64().unwrap() > 0.0, "{m}");
    }
}

/// Every record of `kind` in the run's `metrics.jsonl`.
fn records(run: &std::path::Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("whole lines"))
        .filter(|v| v["event"] == kind)
        .collect()
}

/// The run's `summary.json`.
fn summary(run: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

/// Every episode of `steps` (a run's step records) was compared with its conversation as the
/// job's chat template renders it, and its tokens spell the rendering.
fn assert_every_episode_matches_the_template(steps: &[serde_json::Value]) {
    let total = |key: &str| steps.iter().map(|s| s[key].as_f64().unwrap()).sum::<f64>();
    assert!(total("episodes") > 0.0);
    assert_eq!(total("retokenization_checked"), total("episodes"));
    assert_eq!(total("retokenization_mismatches"), 0.0);
    // drift is the policy's doing, not the run's: a sampled split the tokenizer would not make
    // (a special token's name spelled letter by letter); rare, and timing decides which
    // samples an asynchronous run draws
    assert!(
        total("retokenization_drift") <= total("episodes") / 100.0,
        "{} of {} episodes drifted",
        total("retokenization_drift"),
        total("episodes")
    );
}

/// A run's `summary` accounts for every sample admitted: each trained, dropped or pending.
fn assert_ledger_balances(summary: &serde_json::Value) {
    assert_eq!(
        summary["samples_admitted"].as_u64().unwrap(),
        ["samples_trained", "samples_dropped", "samples_pending"]
            .iter()
            .map(|k| summary[k].as_u64().unwrap())
            .sum::<u64>(),
        "{summary}"
    );
}

/// `areal train` of `config` into `run` for 40 steps (evaluated at the end on 100 held-out
/// items) with `extra` arguments: the run folder, and the held-out accuracy before and after.
fn short_run(
    config: &std::path::Path,
    run: &std::path::Path,
    extra: &[&str],
) -> (std::path::PathBuf, f64, f64) {
    let mut args = vec![
        "train",
        "-q",
        "--config",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--set",
        "train.steps=40",
        "--set",
        "eval.every=40",
        "--set",
        "eval.max_items=100",
    ];
    args.extend(extra);
    let out = areal(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary = summary(run);
    let accuracy = |key: &str| summary[key].as_f64().unwrap();
    (
        run.to_owned(),
        accuracy("baseline_accuracy"),
        accuracy("final_accuracy"),
    )
}

/// The built-in multi-turn job, shortened: with the `python` tool the policy learns to call it
/// and copy its answer (held-out accuracy up by far more than 0.2), and the steps say so (the
/// share of episodes calling a tool, two turns each, a plot of it); without the tool the same
/// job, from the same warm-up, learns nothing like it. In deterministic mode: asynchronous,
/// 40 steps learn less on a busy machine (0.47 → 0.61 to 0.79 measured, 8 runs), where the
/// trainer lags generation by more versions.
#[test]
fn the_multi_turn_job_learns_to_call_the_tool_and_without_it_does_not() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = root.join("plugins/tools/examples/tool-mul.toml");
    let text_of_config = std::fs::read_to_string(&config).unwrap();
    assert!(
        text_of_config.contains(&format!(
            "alphabet = {:?}",
            areal_tasks::tool_mul::alphabet()
        )),
        "the job's alphabet is the task's"
    );
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        let extra = [&["--set", "deterministic=true"], extra].concat();
        short_run(&config, &dir.path().join(name), &extra)
    };
    let (with, before, after) = run("tools", &[]);
    // 0.47 → 0.78 on this machine
    assert!(after - before >= 0.25, "{before} → {after}");
    // over the last 10 steps (a step may see few episodes end)
    let steps = records(&with, "step");
    let last = &steps[steps.len() - 10..];
    let number = |s: &serde_json::Value, key: &str| s[key].as_f64().unwrap();
    let episodes: f64 = last.iter().map(|s| number(s, "episodes")).sum();
    let share = |key: &str| {
        last.iter()
            .map(|s| number(s, key) * number(s, "episodes"))
            .sum::<f64>()
            / episodes
    };
    assert!(episodes > 0.0);
    assert!(share("tool_call_fraction") > 0.5, "{last:?}");
    assert!(share("turns_per_episode") > 1.5, "{last:?}");
    assert!(with.join("tools.png").exists(), "the plot of tool use");
    assert_every_episode_matches_the_template(&steps);

    let (_, alone_before, alone_after) = run("none", &["--set", "tools=[]"]);
    assert!(
        alone_after - alone_before < 0.1 && after - alone_after >= 0.25,
        "without the tool: {alone_before} → {alone_after}; with it: {before} → {after}"
    );
}

/// The built-in multi-turn job with its agent written against OpenAI's API (OpenAI's own
/// Python client, run as a service taking sessions of the proxy) learns as the in-process
/// episodes do on the same seed, and every episode's tokens are what the template renders.
/// Needs the client's virtual environment (`core/serve/scripts/setup-openai.sh`; `make test`
/// makes it).
#[test]
fn the_multi_turn_job_learns_through_an_openai_client_agent_as_in_process() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let venv = std::env::var_os("AREAL_OPENAI_VENV")
        .map_or_else(|| root.join(".cache/openai"), std::path::PathBuf::from);
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run core/serve/scripts/setup-openai.sh",
        python.display()
    );
    let agent = root.join("plugins/tools/examples/agents/tool_mul_agent.py");
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, config: &str, extra: &[&str]| {
        let config = root.join("plugins/tools/examples").join(config);
        short_run(&config, &dir.path().join(name), extra)
    };
    let service = format!("episode.service=[{:?}, {:?}]", python, agent);
    // an outside program's turns are not the same each time: no deterministic mode
    let config = root.join("plugins/tools/examples/tool-mul-agent.toml");
    let out = areal(&[
        "train",
        "-q",
        "--config",
        config.to_str().unwrap(),
        "--set",
        &service,
        "--set",
        "deterministic=true",
        "--out",
        dir.path().join("deterministic").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr)
            .contains("deterministic = true: the agent episode drives an outside program"),
        "{}",
        text(&out.stderr)
    );
    let (with_agent, before, after) = run("agent", "tool-mul-agent.toml", &["--set", &service]);
    // in process in deterministic mode, which a busy machine does not change (asynchronous,
    // 40 steps in process learn less under load: 0.61 to 0.79 measured; through the agent,
    // whose generation is the slower side, 0.79 to 0.80 in 7 runs, 5 of them under load)
    let (_, in_before, in_after) = run(
        "in-process",
        "tool-mul.toml",
        &["--set", "deterministic=true"],
    );
    assert!(
        after - before >= 0.25,
        "through the agent: {before} → {after}"
    );
    // the same warm-up, so the same start; the end within the seeds' spread (0.03 over 3
    // seeds at 100 steps, 0.1 allowed at 40)
    assert_eq!(before, in_before);
    assert!(
        (after - in_after).abs() <= 0.1,
        "through the agent {before} → {after}, in process {in_before} → {in_after}"
    );
    let steps = records(&with_agent, "step");
    let total = |key: &str| steps.iter().map(|s| s[key].as_f64().unwrap()).sum::<f64>();
    assert_every_episode_matches_the_template(&steps);
    // the agent called its tool: more than one turn per episode on average at the end
    let last = &steps[steps.len() - 10..];
    let episodes: f64 = last.iter().map(|s| s["episodes"].as_f64().unwrap()).sum();
    let turns: f64 = last
        .iter()
        .map(|s| s["turns_per_episode"].as_f64().unwrap() * s["episodes"].as_f64().unwrap())
        .sum();
    assert!(turns / episodes > 1.5, "{last:?}");
    assert_eq!(
        total("episode_splits"),
        0.0,
        "the agent never rewrites its history"
    );

    // the same agent rewriting its first message before its second request: every episode
    // with a tool call splits in two samples, both trained, none re-tokenized
    let rewriting = format!(
        "import json, sys\n\
         sys.path.insert(0, {:?})\n\
         import tool_mul_agent as a\n\
         def episode(client, item, max_turns=2):\n\
         \x20   messages = [{{'role': 'user', 'content': item['prompt']}}]\n\
         \x20   for turn in range(max_turns):\n\
         \x20       reply = client.chat.completions.create(model='policy', messages=messages, tools=a.TOOLS)\n\
         \x20       message = reply.choices[0].message\n\
         \x20       messages.append(message.model_dump(exclude_none=True))\n\
         \x20       if not message.tool_calls or turn + 1 == max_turns:\n\
         \x20           return message.content\n\
         \x20       for call in message.tool_calls:\n\
         \x20           output = a.run_python(json.loads(call.function.arguments)['code'])\n\
         \x20           messages.append({{'role': 'tool', 'tool_call_id': call.id, 'content': output}})\n\
         \x20       messages[0] = {{'role': 'user', 'content': item['prompt'] + ' '}}\n\
         a.episode = episode\n\
         a.serve(8)\n",
        agent.parent().unwrap()
    );
    let service = format!("episode.service=[{:?}, \"-c\", {:?}]", python, rewriting);
    let (split, _, _) = run(
        "split",
        "tool-mul-agent.toml",
        &["--set", &service, "--set", "train.steps=5"],
    );
    let steps = records(&split, "step");
    let total = |key: &str| steps.iter().map(|s| s[key].as_f64().unwrap()).sum::<f64>();
    let summary = summary(&split);
    assert!(total("episode_splits") > 0.0, "{steps:?}");
    assert_eq!(total("retokenization_mismatches"), 0.0);
    // a split episode is two samples of one id: more samples trained than episodes
    let samples = total("samples");
    assert!(
        samples > summary["samples_trained"].as_f64().unwrap(),
        "{samples} samples, {summary}"
    );
    // the ledger counts episodes: each trained, dropped or pending
    assert_ledger_balances(&summary);
}

/// A bare HTTP/1.1 POST of `body` with `key`: the status and the JSON answer.
fn post(addr: &str, path: &str, key: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    use std::io::{Read as _, Write as _};
    let body = body.to_string();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let json = answer
        .find("\r\n\r\n")
        .and_then(|at| serde_json::from_str(&answer[at + 4..]).ok())
        .unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// `areal serve proxy` serves the agent proxy without training: an agent from elsewhere takes
/// a session (with the task item), asks for a turn, ends it, and the session's sample is
/// written to the records (token ids, loss mask on the policy's tokens, logprobs, reward).
#[test]
fn serve_proxy_serves_agents_and_records_their_sessions() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = root.join("plugins/tools/examples/tool-mul-agent.toml");
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("records.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_areal"))
        .args(["serve", "proxy", "--config"])
        .arg(&config)
        .args([
            "--set",
            "episode.service=[]",
            "--sessions",
            "2",
            "--records",
        ])
        .arg(&records)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let line = {
        use std::io::BufRead as _;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        line
    };
    let addr = line
        .strip_prefix("serving the agent proxy on ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    // the proxy listens before its episodes are admitted: a 429 says later, as to any client
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let session = loop {
        let (status, session) = post(
            &addr,
            "/rl/start_session",
            "",
            &serde_json::json!({"task_id": "t"}),
        );
        if status == 200 {
            break session;
        }
        assert_eq!(status, 429, "{session}");
        assert!(std::time::Instant::now() < deadline, "no session came");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let key = session["api_key"].as_str().unwrap().to_owned();
    let prompt = session["item"]["prompt"].as_str().unwrap().to_owned();
    let (status, answer) = post(
        &addr,
        "/v1/chat/completions",
        &key,
        &serde_json::json!({"model": "policy", "messages": [{"role": "user", "content": prompt}]}),
    );
    assert_eq!(status, 200, "{answer}");
    let completion_tokens = answer["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(completion_tokens > 0);
    // 16 choices at temperature 1 of the real (untrained) policy: 16 draws, each a sample
    let (status, choices) = post(
        &addr,
        "/v1/chat/completions",
        &key,
        &serde_json::json!({"model": "policy", "messages": [{"role": "user", "content": prompt}],
            "n": 16, "temperature": 1.0, "max_tokens": 12}),
    );
    assert_eq!(status, 200, "{choices}");
    let drawn: std::collections::BTreeSet<&str> = choices["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(drawn.len(), 16, "{drawn:?}");
    let (status, _) = post(&addr, "/rl/end_session", &key, &serde_json::json!({}));
    assert_eq!(status, 200);
    // the first request's sample and the 16 choices', all written
    wait_for_line(&records, "\"part\":16");
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&records).unwrap();
    let record: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let input = record["input_ids"].as_array().unwrap();
    let mask = record["loss_mask"].as_array().unwrap();
    assert_eq!(input.len(), mask.len());
    // the prompt the agent wrote, not trained; the policy's turn, trained
    let trained = mask.iter().filter(|m| m.as_u64() == Some(1)).count() as u64;
    assert_eq!(trained, completion_tokens);
    assert_eq!(input.len() as u64, prompt.len() as u64 + completion_tokens);
    assert!(record["verdict"].is_string() && record["reward"].is_number());
    // each record names the session start_session gave and the answers it holds
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 17);
    for (k, line) in lines.iter().enumerate() {
        assert_eq!(line["session"], session["session_id"], "{line}");
        assert_eq!(line["part"], k);
    }
    assert_eq!(lines[0]["interactions"], serde_json::json!([answer["id"]]));
    assert_eq!(
        lines[16]["interactions"],
        serde_json::json!([choices["id"]])
    );
}

/// Adapters trained over a checkpoint (`[policy] path`, `[policy.lora]`): the run's own
/// checkpoint (the adapter folded in, the adapter beside it in PEFT's format), the base with
/// `areal eval --adapter`, and the checkpoint `areal lora merge` writes all evaluate the same,
/// and differ from the base alone.
#[test]
fn an_adapter_evaluates_the_same_folded_in_over_its_base_and_merged() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    let cache = format!("warmup.cache_dir={}", path("cache").display());
    let tiny = [
        "task.eval_items=16",
        "task.validation_items=16",
        "task.max_terms=2",
        "warmup.eval_every=100",
        "warmup.max_steps=200",
        "warmup.batch_size=16",
        cache.as_str(),
        "rollout.batch_size=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=30",
        "deterministic=true",
    ];
    let sets = |extra: &[&str]| -> Vec<String> {
        tiny.iter()
            .chain(extra)
            .flat_map(|s| ["--set".to_owned(), (*s).to_owned()])
            .collect()
    };
    let run = |name: &str, extra: &[&str]| {
        let mut args = vec!["train".to_owned(), "-q".to_owned(), "--out".to_owned()];
        args.push(path(name).to_str().unwrap().to_owned());
        args.extend(sets(extra));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = areal(&args);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    };
    // the base: the warm-up and one step of RL
    run("base", &["train.steps=1", "eval.enabled=false"]);
    let base = path("base").join("checkpoint");
    let base_path = format!("policy.path=\"{}\"", base.display());
    run(
        "lora",
        &[
            base_path.as_str(),
            "warmup.enabled=false",
            "policy.lora.rank=4",
            "policy.lora.target_modules=[\"q_proj\", \"v_proj\", \"down_proj\"]",
            "train.steps=6",
            "train.lr=0.003",
            "eval.every=6",
        ],
    );
    let trained = path("lora").join("checkpoint");
    let adapter = trained.join("adapter");
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["r"], 4);
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["base_model_name_or_path"], base.to_str().unwrap());

    // every completion and the figures, without the folder's name
    let eval = |args: &[&str]| -> String {
        let mut all = vec!["eval", "--show", "16"];
        all.extend(args);
        let out = areal(&all);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout).replace(args[0], "CHECKPOINT")
    };
    let merged = path("merged");
    let out = areal(&[
        "lora",
        "merge",
        "--base",
        base.to_str().unwrap(),
        "--adapter",
        adapter.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("rank 4"),
        "{}",
        text(&out.stdout)
    );
    let config = path("lora").join("config.toml");
    let config = config.to_str().unwrap();
    let folded = eval(&[trained.to_str().unwrap(), "--config", config]);
    let over_base = eval(&[
        base.to_str().unwrap(),
        "--adapter",
        adapter.to_str().unwrap(),
        "--config",
        config,
    ]);
    let from_merge = eval(&[merged.to_str().unwrap(), "--config", config]);
    let alone = eval(&[base.to_str().unwrap(), "--config", config]);
    assert_eq!(over_base, folded);
    assert_eq!(from_merge, folded);
    assert_ne!(alone, folded, "the adapter changed nothing: {folded}");
    // merging into a checkpoint that exists is refused
    let out = areal(&[
        "lora",
        "merge",
        "--base",
        base.to_str().unwrap(),
        "--adapter",
        adapter.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("already holds a checkpoint"));
}
