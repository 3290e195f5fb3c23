//! Resuming runs: killed with SIGKILL at chosen points (`AREAL_FAILPOINT`: during
//! generation, during a training step, while a checkpoint is written) or stopped by a signal,
//! resumed with `areal train --resume`, and compared with the same run left alone.

use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use super::{
    Background, assert_ledger_balances, records, summary, testkit_config, text, wait_for_line,
};

thread_local! {
    /// The `AREAL_STALL` that this test's runs are given (each test runs on a thread of its
    /// own).
    static STALL: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
}

/// `areal train -q ARGS`, killed at `failpoint` when given.
fn train(args: &[&str], failpoint: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_areal"));
    command
        .arg("train")
        .arg("-q")
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("AREAL_FAILPOINT")
        .env_remove("AREAL_STALL");
    if let Some(point) = failpoint {
        command.env("AREAL_FAILPOINT", point);
    }
    if let Some(stall) = STALL.get() {
        command.env("AREAL_STALL", stall);
    }
    command.output().expect("run areal")
}

/// The arguments of a fresh run of `config` into `run`.
fn fresh<'a>(config: &'a [String], run: &'a Path) -> Vec<&'a str> {
    let mut args: Vec<&str> = config.iter().map(String::as_str).collect();
    args.extend(["--out", run.to_str().unwrap()]);
    args
}

/// Run `config` into `run` uninterrupted.
fn straight(run: &Path, config: &[String]) {
    let args = fresh(config, run);
    let out = train(&args, None);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Run `config` into `run`, killed at each of `failpoints` in turn (each process resumed from
/// the one before), then resumed to its end.
fn killed_and_resumed(run: &Path, config: &[String], failpoints: &[&str]) {
    let dir = run.to_str().unwrap();
    for (i, point) in failpoints.iter().enumerate() {
        let out = if i == 0 {
            let args = fresh(config, run);
            train(&args, Some(point))
        } else {
            train(&["--resume", dir], Some(point))
        };
        assert_eq!(
            out.status.signal(),
            Some(9),
            "AREAL_FAILPOINT={point} (kill {}): the run ended before it got there: {}",
            i + 1,
            text(&out.stderr)
        );
    }
    let out = train(&["--resume", dir], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// What a step trained, to compare runs: its number, sample ids, loss and rewards.
fn trained(run: &Path) -> Vec<(u64, Value, Value, Value)> {
    records(run, "step")
        .iter()
        .map(|s| {
            (
                s["step"].as_u64().unwrap(),
                s["sample_ids"].clone(),
                s["loss"].clone(),
                s["reward_mean"].clone(),
            )
        })
        .collect()
}

/// Records of a step's reward in the run's TensorBoard events (one event file).
fn tensorboard_steps(run: &Path) -> usize {
    let files: Vec<_> = std::fs::read_dir(run)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("events.out.tfevents."))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let tag = b"step/reward_mean";
    areal_core::tensorboard::read_records(&files[0])
        .unwrap()
        .iter()
        .filter(|r| r.windows(tag.len()).any(|w| w == tag))
        .count()
}

/// The files of the final model (its adapter's too), byte for byte.
fn model(run: &Path) -> Vec<(String, Vec<u8>)> {
    fn files(dir: &Path, prefix: &str, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            let name = format!("{prefix}{}", path.file_name().unwrap().to_string_lossy());
            if path.is_dir() {
                files(&path, &format!("{name}/"), out);
            } else {
                out.push((name, std::fs::read(path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    files(&run.join("checkpoint"), "", &mut out);
    out.sort();
    out
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

fn testkit(dir: &Path, sets: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--config".to_owned(),
        testkit_config(dir).to_str().unwrap().to_owned(),
    ];
    for set in sets {
        args.extend(["--set".to_owned(), (*set).to_owned()]);
    }
    args
}

/// `config` run alone into `dir/alone`, and into `dir/killed` killed at each of `points` and
/// resumed: the killed run trains each of its `steps` steps once, in order, with the same
/// samples, losses and rewards as the run alone, and ends with the same weights, bit for bit.
fn killed_ends_as_alone(
    dir: &Path,
    config: &[String],
    points: &[&str],
    steps: usize,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let (alone, killed) = (dir.join("alone"), dir.join("killed"));
    straight(&alone, config);
    killed_and_resumed(&killed, config, points);
    // A reward that misses its deadline is the one thing deterministic mode does not repeat
    // (docs/resume.md): the callers give the instant testkit reward a deadline no stall on a
    // busy machine reaches, and a lost reward is named here rather than as other samples.
    for run in [&alone, &killed] {
        let lost: u64 = records(run, "step")
            .iter()
            .map(|s| {
                s["reward_failures"]
                    .as_u64()
                    .expect("a step records its lost rewards")
            })
            .sum();
        assert_eq!(lost, 0, "{}: rewards lost to the deadline", run.display());
    }
    let trained_killed = trained(&killed);
    assert_eq!(trained_killed.len(), steps, "every step once");
    assert!(
        trained_killed
            .iter()
            .enumerate()
            .all(|(i, s)| s.0 == i as u64 + 1)
    );
    assert_eq!(
        trained_killed,
        trained(&alone),
        "the same samples, losses and rewards"
    );
    assert_eq!(model(&killed), model(&alone), "the same final weights");
    assert_eq!(summary(&killed)["resumes"], points.len());
    (alone, killed)
}

/// In deterministic mode a run killed during generation, during a training step and while a
/// checkpoint is written, and resumed each time, trains the same samples at every step and
/// ends with the same weights, bit for bit, as the run left alone; samples span rounds and
/// versions (chunks of 3 tokens).
#[test]
fn a_deterministic_run_killed_anywhere_ends_with_the_same_samples_and_weights() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit(
        dir.path(),
        &[
            "deterministic=true",
            "checkpoint.every=4",
            "rollout.chunk_tokens=3",
            "reward_service.deadline_ms=600000",
        ],
    );
    let points = [
        "rollout:300",
        "train:9",
        "checkpoint:3",
        "rollout:600",
        "train:5",
    ];
    let (alone, killed) = killed_ends_as_alone(dir.path(), &config, &points, 60);
    assert_eq!(
        tensorboard_steps(&killed),
        60,
        "TensorBoard has each step once"
    );
    let lags: Vec<u64> = records(&alone, "step")
        .iter()
        .map(|s| s["token_lag_max"].as_u64().unwrap())
        .collect();
    assert!(
        lags.iter().any(|&l| l > 0),
        "generation ran ahead: {lags:?}"
    );
    let (a, k) = (summary(&alone), summary(&killed));
    // a process killed before its first checkpoint leaves no record (it is cut off with the
    // rest of what it wrote), so only the last resume is sure to be there
    assert_eq!(records(&killed, "resume").last().unwrap()["resumes"], 5);
    for key in [
        "samples_trained",
        "samples_admitted",
        "samples_pending",
        "final_accuracy",
    ] {
        assert_eq!(a[key], k[key], "{key}");
    }
}

/// With `rollout.generate_ahead`, deterministic rounds generate all the staleness rule admits
/// before each batch, as an infinitely fast generator would: step `s` trains samples exactly
/// `min(s − 1, η)` versions old, every token of them, and a run killed in generation and in
/// training ends with the same samples and weights as the run left alone.
#[test]
fn a_deterministic_run_generating_ahead_trains_samples_eta_versions_old_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit(
        dir.path(),
        &[
            "deterministic=true",
            "rollout.generate_ahead=true",
            "rollout.max_staleness=3",
            "checkpoint.every=4",
            "train.steps=20",
            "reward_service.deadline_ms=600000",
        ],
    );
    let (alone, _) = killed_ends_as_alone(dir.path(), &config, &["rollout:300", "train:9"], 20);
    for s in records(&alone, "step") {
        let step = s["step"].as_u64().unwrap();
        let lag = (step - 1).min(3);
        assert_eq!(s["token_lag_max"].as_u64().unwrap(), lag, "{s}");
        assert_eq!(s["token_lag_mean"].as_f64().unwrap(), lag as f64, "{s}");
    }
}

/// The same when recording what the generator answered is slow (each part waits 5 ms once it
/// is recorded, before its turn's end is, as a descheduled thread does on a busy machine): a
/// batch is handed to the trainer only once every episode has recorded its answers, so no
/// checkpoint copies the rollout state while one is still being recorded, and resuming
/// regenerates nothing.
#[test]
fn a_deterministic_run_recording_slowly_resumes_with_the_same_samples_and_weights() {
    STALL.set(Some("rollout:5"));
    let dir = tempfile::tempdir().unwrap();
    let config = testkit(
        dir.path(),
        &[
            "deterministic=true",
            "checkpoint.every=2",
            "train.steps=12",
            "rollout.chunk_tokens=3",
            "reward_service.deadline_ms=600000",
        ],
    );
    killed_ends_as_alone(dir.path(), &config, &["train:5", "train:5"], 12);
}

/// The same for episodes of several turns with a stateful tool between them
/// (`testkit-relay`, `testkit-shift`), killed in the middle of episodes (between turns,
/// inside a turn and after a tool's answer was recorded): a resumed episode replays its
/// record, its tool's state is rebuilt, and the run ends with the same samples and weights.
#[test]
fn a_deterministic_run_of_episodes_killed_mid_episode_ends_with_the_same_samples_and_weights() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit(
        dir.path(),
        &[
            "deterministic=true",
            "checkpoint.every=4",
            "rollout.chunk_tokens=3",
            "reward_service.deadline_ms=600000",
            "train.steps=24",
            "rollout.max_new_tokens=24",
            "episode.kind=\"testkit-relay\"",
            "tools=[{kind = \"testkit-shift\"}]",
        ],
    );
    let points = ["rollout:200", "train:7", "rollout:500"];
    let (alone, _) = killed_ends_as_alone(dir.path(), &config, &points, 24);
    let records = records(&alone, "step");
    let calls: u64 = records
        .iter()
        .map(|s| s["tool_calls"].as_u64().unwrap())
        .sum();
    let turns: Vec<f64> = records
        .iter()
        .map(|s| s["turns_per_episode"].as_f64().unwrap())
        .collect();
    assert!(calls > 0, "the tool was called");
    assert!(
        turns.iter().any(|&t| t > 1.5),
        "episodes have several turns: {turns:?}"
    );
}

/// The built-in job (transformer, burn generator, warm-up), shortened, killed in the
/// warm-up, in an RL step, while writing a checkpoint and while generating: the same weights
/// bit for bit and the same warm-up curve.
#[test]
fn the_built_in_job_killed_in_warm_up_and_in_rl_ends_with_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let config = strings(&[
        "--set",
        "deterministic=true",
        "--set",
        "warmup.max_steps=120",
        "--set",
        "warmup.eval_every=40",
        "--set",
        "warmup.cache_dir=",
        "--set",
        "eval.max_items=32",
        "--set",
        "eval.every=4",
        "--set",
        "train.steps=8",
        "--set",
        "checkpoint.every=2",
    ]);
    let (alone, killed) = (dir.path().join("alone"), dir.path().join("killed"));
    straight(&alone, &config);
    // warm-up step 70; then (from warm-up step 40) RL step 5; the next checkpoint; generation
    killed_and_resumed(
        &killed,
        &config,
        &["train:70", "train:85", "checkpoint:1", "rollout:40"],
    );
    let curve = |run: &Path| -> Vec<(Value, Value)> {
        records(run, "warmup")
            .iter()
            .map(|w| {
                (
                    w["validation_accuracy"].clone(),
                    w["validation_loss"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(curve(&killed).len(), 3);
    assert_eq!(curve(&killed), curve(&alone));
    assert_eq!(trained(&killed), trained(&alone));
    assert_eq!(model(&killed), model(&alone));
    let resumed = records(&killed, "resume");
    assert_eq!(resumed[0]["checkpoint"], "warmup-00000040", "{resumed:?}");
    assert_eq!(resumed.last().unwrap()["resumes"], 4, "{resumed:?}");
    assert_eq!(summary(&killed)["resumes"], 4);
}

/// With LoRA adapters, a deterministic run killed in RL (during a step, then during
/// generation) and resumed trains the same samples with the same losses and ends with the same
/// weights and adapter files, bit for bit, as the run left alone.
#[test]
fn the_built_in_job_with_adapters_killed_in_rl_ends_with_the_same_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let cache = format!("warmup.cache_dir={}", dir.path().join("cache").display());
    let config = strings(&[
        "--set",
        "deterministic=true",
        "--set",
        "warmup.max_steps=60",
        "--set",
        "warmup.eval_every=30",
        "--set",
        &cache,
        "--set",
        "eval.max_items=32",
        "--set",
        "eval.every=4",
        "--set",
        "train.steps=8",
        "--set",
        "train.lr=0.001",
        "--set",
        "checkpoint.every=2",
        "--set",
        "policy.lora.rank=4",
    ]);
    let (alone, killed) = (dir.path().join("alone"), dir.path().join("killed"));
    straight(&alone, &config);
    // the warm-up is cached: the killed run counts RL steps only
    killed_and_resumed(&killed, &config, &["train:5", "rollout:40"]);
    assert_eq!(trained(&killed).len(), 8);
    assert_eq!(trained(&killed), trained(&alone));
    let files = model(&killed);
    assert!(
        files
            .iter()
            .any(|(name, _)| name == "adapter/adapter_model.safetensors"),
        "{:?}",
        files.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    assert_eq!(files, model(&alone));
    assert_eq!(summary(&killed)["resumes"], 2);
}

/// Outside deterministic mode, a run killed at the same kinds of points trains every step
/// once, no sample twice, accounts for every sample admitted, and its admission stays within
/// the staleness bound across every resume.
#[test]
fn a_killed_run_trains_each_sample_once_within_the_staleness_bound() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit(
        dir.path(),
        &[
            "checkpoint.every=3",
            "generator.token_delay_us=300",
            "generator.jitter=0.5",
        ],
    );
    let run = dir.path().join("run");
    killed_and_resumed(
        &run,
        &config,
        &["rollout:400", "train:12", "checkpoint:2", "rollout:200"],
    );
    let steps = records(&run, "step");
    assert_eq!(steps.len(), 60);
    let mut seen = std::collections::BTreeSet::new();
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["step"], i as u64 + 1);
        let mut n = 0;
        for range in s["sample_ids"].as_array().unwrap() {
            for id in range[0].as_u64().unwrap()..range[1].as_u64().unwrap() {
                assert!(seen.insert(id), "sample {id} trained twice");
                n += 1;
            }
        }
        assert_eq!(n, s["samples"].as_u64().unwrap());
        // (η + version + 1) · B, with η = 4 and B = 8
        let limit = (4 + s["policy_version"].as_u64().unwrap() + 1) * 8;
        let held = s["accepted_total"].as_u64().unwrap() + s["running"].as_u64().unwrap();
        assert!(held <= limit, "step {}: {held} groups past {limit}", i + 1);
    }
    let summary = summary(&run);
    assert_eq!(summary["samples_trained"], seen.len() as u64);
    assert_ledger_balances(&summary);
    assert_eq!(summary["resumes"], 4);
}

/// Damaged checkpoints (a truncated file, a missing one, a wrong checksum) are named and
/// passed over for the one before; the run still ends as the run left alone does. When every
/// one is damaged, resuming fails and names each.
#[test]
fn a_damaged_checkpoint_is_named_and_the_one_before_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit(dir.path(), &["deterministic=true", "checkpoint.every=5"]);
    let (alone, killed) = (dir.path().join("alone"), dir.path().join("killed"));
    straight(&alone, &config);
    let args = fresh(&config, &killed);
    let out = train(&args, Some("train:33"));
    assert_eq!(out.status.signal(), Some(9), "{}", text(&out.stderr));
    let checkpoints = killed.join("checkpoints");
    let truncated = checkpoints.join("step-00000030/trainer/policy/parameters.safetensors");
    let bytes = std::fs::read(&truncated).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::remove_file(checkpoints.join("step-00000025/state.json")).unwrap();

    let out = train(&["--resume", killed.to_str().unwrap()], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("step-00000030") && stderr.contains("damaged checkpoint"),
        "{stderr}"
    );
    let resumed = &records(&killed, "resume")[0];
    assert_eq!(resumed["checkpoint"], "step-00000020");
    let skipped: Vec<&str> = resumed["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert!(
        skipped[0].starts_with("step-00000030")
            && skipped[0].contains("parameters.safetensors does not match its checksum"),
        "{skipped:?}"
    );
    assert!(
        skipped[1].starts_with("step-00000025") && skipped[1].contains("state.json"),
        "{skipped:?}"
    );
    assert_eq!(trained(&killed), trained(&alone));
    assert_eq!(model(&killed), model(&alone));

    // every checkpoint damaged: refused, each named
    let broken = dir.path().join("broken");
    let args = fresh(&config, &broken);
    let out = train(&args, Some("train:18"));
    assert_eq!(out.status.signal(), Some(9), "{}", text(&out.stderr));
    let mut names = Vec::new();
    for entry in std::fs::read_dir(broken.join("checkpoints")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("step-") {
            // one byte flipped in the optimizer's state
            let file = path.join("trainer/policy/optimizer.bpk");
            let mut bytes = std::fs::read(&file).unwrap();
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
            std::fs::write(&file, bytes).unwrap();
            names.push(name);
        }
    }
    assert_eq!(names.len(), 3, "{names:?}");
    let out = train(&["--resume", broken.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("every checkpoint in"), "{stderr}");
    for name in &names {
        assert!(
            stderr.contains(&format!(
                "{name} (trainer/policy/optimizer.bpk does not match its checksum)"
            )),
            "{stderr}"
        );
    }
}

/// A resumed run takes its own config: another one is refused, naming each key that differs,
/// unless `--allow-config-change` says it is meant; `policy` and `rollout.group_size` never
/// change; a finished run is not resumed, but can be trained further on purpose.
#[test]
fn resuming_refuses_a_config_that_differs_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit(dir.path(), &["checkpoint.every=5"]);
    let run = dir.path().join("run");
    let path = run.to_str().unwrap();
    let args = fresh(&config, &run);
    let out = train(&args, Some("train:12"));
    assert_eq!(out.status.signal(), Some(9), "{}", text(&out.stderr));

    let out = train(
        &["--resume", path, "--set", "train.lr=0.1", "--seed", "4"],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("differs from the run's own"), "{stderr}");
    assert!(stderr.contains("`train.lr`: 0.3 → 0.1"), "{stderr}");
    assert!(stderr.contains("`seed`: 1 → 4"), "{stderr}");
    assert!(stderr.contains("--allow-config-change"), "{stderr}");
    let other = dir.path().join("other.toml");
    std::fs::write(&other, "[rollout]\nmax_staleness = 1\n").unwrap();
    let out = train(
        &["--resume", path, "--config", other.to_str().unwrap()],
        None,
    );
    assert!(
        text(&out.stderr).contains("`rollout.max_staleness`: 4 → 1"),
        "{}",
        text(&out.stderr)
    );
    let out = train(
        &[
            "--resume",
            path,
            "--set",
            "rollout.group_size=2",
            "--allow-config-change",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("cannot change") && stderr.contains("`rollout.group_size`: 4 → 2"),
        "{stderr}"
    );
    assert!(!run.join("summary.json").exists(), "nothing ran");

    // the same config, said again, is no change
    let out = train(&["--resume", path, "--set", "train.lr=0.3"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(records(&run, "step").len(), 60);
    let out = train(&["--resume", path], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("is complete (60 of 60 steps)"),
        "{}",
        text(&out.stderr)
    );
    let out = train(
        &[
            "--resume",
            path,
            "--set",
            "train.steps=70",
            "--allow-config-change",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let steps: Vec<u64> = records(&run, "step")
        .iter()
        .map(|s| s["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=70).collect::<Vec<_>>());
    assert!(
        std::fs::read_to_string(run.join("config.toml"))
            .unwrap()
            .contains("steps = 70"),
        "the run's config says what it now is"
    );
    let out = train(
        &["--resume", dir.path().join("none").to_str().unwrap()],
        None,
    );
    assert!(
        text(&out.stderr).contains("is not a run folder"),
        "{}",
        text(&out.stderr)
    );
}

/// An asynchronous run's checkpoints copy the rollout state while episodes record their
/// answers (each part waits 5 ms after it is recorded, as a descheduled thread does): a
/// turn's last tokens are recorded with its end, so no checkpoint holds a sample that ended
/// with a stop token, or at its budget, as a turn still going on (a resumed episode would
/// sample past its stop token).
#[test]
fn a_checkpoint_never_holds_a_turns_last_tokens_without_its_end() {
    STALL.set(Some("rollout:5"));
    let dir = tempfile::tempdir().unwrap();
    let config = testkit(
        dir.path(),
        &[
            "checkpoint.every=1",
            "checkpoint.keep=100",
            "train.steps=12",
            "rollout.max_new_tokens=8",
            "generator.token_delay_us=300",
            "generator.jitter=0.5",
        ],
    );
    let run = dir.path().join("run");
    straight(&run, &config);
    let (mut checked, mut ended) = (0, 0);
    for entry in std::fs::read_dir(run.join("checkpoints")).unwrap() {
        let state: Value = serde_json::from_slice(
            &std::fs::read(entry.unwrap().path().join("state.json")).unwrap(),
        )
        .unwrap();
        for group in state["stage"]["rollout"]["running"].as_array().unwrap() {
            for sample in group["samples"].as_array().unwrap() {
                let completion = &sample["completion"];
                let len = completion["token_ids"].as_array().unwrap().len() as u64;
                let last_turn_end = sample["turns"]
                    .as_array()
                    .unwrap()
                    .last()
                    .map(|t| t["end"].as_u64().unwrap());
                // ended with a stop token, or at the budget above
                let whole = completion["finish_reason"] == "stop" || len == 8;
                checked += 1;
                if whole {
                    ended += 1;
                    assert_eq!(
                        last_turn_end,
                        Some(len),
                        "a turn's last tokens without its end: {sample}"
                    );
                }
            }
        }
    }
    assert!(
        checked > 0 && ended > 0,
        "{checked} samples in flight, {ended} ended"
    );
}

/// SIGTERM stops a run with a checkpoint of where it was; resumed, it ends as the run left
/// alone does.
#[test]
fn a_run_stopped_by_a_signal_resumes_where_it_stopped() {
    stopped_by_a_signal_and_resumed("", 1000);
}

/// The same when recording what the generator answered is slow (each part waits 5 ms once it
/// is recorded, before its turn's end is, as a descheduled thread does on a busy machine):
/// the run stops between
/// rounds only once every episode has recorded its answers, so the checkpoint it saves holds
/// them and resuming regenerates nothing.
#[test]
fn a_run_recording_slowly_stopped_by_a_signal_resumes_where_it_stopped() {
    stopped_by_a_signal_and_resumed("AREAL_STALL=rollout:5", 20_000);
}

/// A deterministic run (its process started with the environment `env`) stopped by SIGTERM
/// after step 5 and resumed ends as the same run left alone.
fn stopped_by_a_signal_and_resumed(env: &str, token_delay_us: u64) {
    let dir = tempfile::tempdir().unwrap();
    let delay = format!("generator.token_delay_us={token_delay_us}");
    let sets = [
        "deterministic=true",
        &delay,
        "reward_service.deadline_ms=600000",
    ];
    let (alone, stopped) = (dir.path().join("alone"), dir.path().join("stopped"));
    straight(&alone, &testkit(dir.path(), &sets));
    let args: Vec<String> = sets
        .iter()
        .flat_map(|s| ["--set".to_owned(), (*s).to_owned()])
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = Background::train(dir.path(), &stopped, env, &args);
    wait_for_line(&stopped.join("metrics.jsonl"), "\"step\":5,");
    run.signal("TERM");
    let (code, stderr) = run.finish();
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("areal train --resume"), "{stderr}");
    let out = train(&["--resume", stopped.to_str().unwrap()], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(trained(&stopped), trained(&alone));
    assert_eq!(model(&stopped), model(&alone));
    assert_eq!(summary(&stopped)["interrupted"], false);
}

/// Rewrite `state.json` of the checkpoint `dir` with `edit`, and its manifest's checksum with
/// it: a forgery the manifest alone does not catch.
fn forge(dir: &Path, edit: impl FnOnce(&mut Value)) {
    use sha2::Digest;
    let path = dir.join("state.json");
    let mut state: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut state);
    let bytes = serde_json::to_vec_pretty(&state).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let manifest = dir.join("manifest.json");
    let mut sums: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let sum: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    sums["state.json"] = sum.into();
    std::fs::write(&manifest, serde_json::to_vec_pretty(&sums).unwrap()).unwrap();
}

/// Issue 32: resume trusted its files. A checkpoint's `log.events_file` named a file outside
/// the run folder (which was truncated and appended to), `stage.step = 2^64 − 1` wrapped,
/// `rollout.counts.accepted = 10^18` hung the run, a buffered sample with fewer versions than
/// tokens panicked the trainer: each checkpoint is now passed over as damaged, naming why,
/// and the one before it is used. A `metrics.jsonl` that is a symbolic link is refused, its
/// target untouched.
#[test]
fn a_forged_checkpoint_is_passed_over_naming_why_and_nothing_outside_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit(dir.path(), &["deterministic=true", "checkpoint.every=5"]);
    let outside = dir.path().join("outside.txt");
    std::fs::write(&outside, "not the run's\n").unwrap();
    type Forgery = Box<dyn Fn(&mut Value)>;
    let forgeries: [(&str, Forgery); 4] = [
        (
            "log.events_file",
            Box::new(|s: &mut Value| s["log"]["events_file"] = "../outside.txt".into()),
        ),
        (
            "stage.step 18446744073709551615",
            Box::new(|s: &mut Value| s["stage"]["step"] = u64::MAX.into()),
        ),
        (
            "do not add up",
            Box::new(|s: &mut Value| {
                s["stage"]["rollout"]["counts"]["accepted"] = 1_000_000_000_000_000_000u64.into()
            }),
        ),
        (
            "1 logprobs and 0 versions",
            Box::new(|s: &mut Value| {
                // the first sample with tokens, in the buffer or in flight
                let Value::Object(rollout) = &mut s["stage"]["rollout"] else {
                    panic!("a rollout snapshot")
                };
                let mut completions: Vec<&mut Value> = Vec::new();
                for (key, groups) in rollout.iter_mut() {
                    if key != "buffer" && key != "running" {
                        continue;
                    }
                    for g in groups.as_array_mut().unwrap() {
                        for sample in g["samples"].as_array_mut().unwrap() {
                            completions.push(&mut sample["completion"]);
                        }
                    }
                }
                let c = completions
                    .into_iter()
                    .find(|c| !c["token_ids"].as_array().unwrap().is_empty())
                    .expect("a sample with tokens");
                for key in ["token_ids", "behaviour_logprobs"] {
                    let first = c[key][0].clone();
                    c[key] = vec![first].into();
                }
                c["versions"] = Vec::<u64>::new().into();
            }),
        ),
    ];
    for (i, (says, edit)) in forgeries.iter().enumerate() {
        let run = dir.path().join(format!("run-{i}"));
        let args = fresh(&config, &run);
        let out = train(&args, Some("train:13"));
        assert_eq!(out.status.signal(), Some(9), "{}", text(&out.stderr));
        forge(&run.join("checkpoints/step-00000010"), edit);
        let out = train(&["--resume", run.to_str().unwrap()], Some("train:14"));
        assert_eq!(
            out.status.signal(),
            Some(9),
            "{says}: {}",
            text(&out.stderr)
        );
        let resumed = &records(&run, "resume")[0];
        assert_eq!(resumed["checkpoint"], "step-00000005", "{says}: {resumed}");
        let skipped = resumed["skipped"][0].as_str().unwrap();
        assert!(
            skipped.starts_with("step-00000010") && skipped.contains(says),
            "{says}: {skipped}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "not the run's\n"
    );

    // metrics.jsonl a link to a file outside: refused, its target left as it was
    let run = dir.path().join("linked");
    let args = fresh(&config, &run);
    let out = train(&args, Some("train:13"));
    assert_eq!(out.status.signal(), Some(9), "{}", text(&out.stderr));
    std::fs::remove_file(run.join("metrics.jsonl")).unwrap();
    std::os::unix::fs::symlink(&outside, run.join("metrics.jsonl")).unwrap();
    let out = train(&["--resume", run.to_str().unwrap()], None);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not a regular file"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "not the run's\n"
    );
}

/// Issue 32: swapping the run folder's `config.toml` bypassed `--allow-config-change` (the
/// resume compared the arguments with that file); checkpoints now record the config they were
/// trained with, and that is what a resume is held to. And resuming a finished run with
/// `checkpoint.every = 0` trained it again from scratch; it is refused, its records kept.
#[test]
fn a_resume_is_held_to_the_config_its_checkpoint_was_trained_with() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit(dir.path(), &["checkpoint.every=5"]);
    let run = dir.path().join("run");
    let path = run.to_str().unwrap();
    let out = train(&fresh(&config, &run), Some("train:12"));
    assert_eq!(out.status.signal(), Some(9), "{}", text(&out.stderr));
    let own = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(own.contains("lr = 0.3"), "{own}");
    std::fs::write(run.join("config.toml"), own.replace("lr = 0.3", "lr = 0.1")).unwrap();
    let out = train(&["--resume", path], None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("trained with another config") && stderr.contains("`train.lr`: 0.3 → 0.1"),
        "{stderr}"
    );
    let out = train(&["--resume", path, "--allow-config-change"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let finished = dir.path().join("finished");
    let mut no_checkpoints = config.clone();
    no_checkpoints.extend(["--set".to_owned(), "checkpoint.every=0".to_owned()]);
    straight(&finished, &no_checkpoints);
    let before = std::fs::read(finished.join("metrics.jsonl")).unwrap();
    let out = train(&["--resume", finished.to_str().unwrap()], None);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is complete"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read(finished.join("metrics.jsonl")).unwrap(),
        before
    );
}

/// Issue 45: a newest checkpoint whose frozen base (the weights adapters train over) was
/// changed, its manifest made to match, resumed and trained on it. The sha256 of the frozen
/// parameters is recorded with them; a changed base passes the checkpoint over as damaged,
/// naming why, and the one before it is used.
#[test]
fn a_checkpoint_whose_frozen_base_was_changed_is_passed_over_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    let config = strings(&[
        "--set",
        "deterministic=true",
        "--set",
        "warmup.enabled=false",
        "--set",
        "eval.enabled=false",
        "--set",
        "train.steps=4",
        "--set",
        "checkpoint.every=2",
        "--set",
        "policy.lora.rank=4",
    ]);
    let first = dir.path().join("first");
    straight(&first, &config);
    let newest = "step-00000004";
    for pick in ["first", "last"] {
        let run = dir.path().join(format!("run-{pick}"));
        copy_tree(&first, &run);
        let checkpoint = run.join("checkpoints").join(newest);
        let file = "trainer/policy/parameters.safetensors";
        let path = checkpoint.join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let frozen: Vec<String> =
            serde_json::from_str(header["__metadata__"]["areal.frozen"].as_str().unwrap()).unwrap();
        assert!(frozen.len() > 4, "{frozen:?}");
        let name = if pick == "first" {
            &frozen[0]
        } else {
            frozen.last().unwrap()
        };
        let at = 8 + n + header[name]["data_offsets"][0].as_u64().unwrap() as usize;
        let value = f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) + 0.5;
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let manifest = checkpoint.join("manifest.json");
        let mut sums: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
        use sha2::Digest;
        sums[file] = sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into();
        std::fs::write(&manifest, serde_json::to_vec_pretty(&sums).unwrap()).unwrap();

        let out = train(
            &[
                "--resume",
                run.to_str().unwrap(),
                "--set",
                "train.steps=6",
                "--allow-config-change",
            ],
            None,
        );
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{pick}: {stderr}");
        assert!(
            stderr.contains(newest)
                && stderr.contains("damaged checkpoint")
                && stderr.contains("the base was changed"),
            "{pick}: {stderr}"
        );
        let resume = records(&run, "resume").pop().unwrap();
        assert_eq!(resume["checkpoint"], "step-00000002", "{pick}: {resume}");
        let skipped = resume["skipped"][0].as_str().unwrap();
        assert!(
            skipped.starts_with(newest)
                && skipped.contains(file)
                && skipped.contains("the base was changed"),
            "{pick}: {skipped}"
        );
        assert_eq!(trained(&run).len(), 6, "{pick}: steps 3 to 6 trained again");
        assert_eq!(trained(&run)[..2], trained(&first)[..2]);
    }
}

/// A copy of the folder `from` at `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
