//! Generation and reward as services, with real processes on loopback: `areal launch local`,
//! servers killed with SIGKILL mid-run and restarted, every server gone, listeners that need a
//! token. Each run is bounded: the testkit job takes seconds.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

fn areal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_areal"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run areal")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The testkit's fast config with `extra` appended, written to a file in `dir`.
fn testkit_config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("testkit.toml");
    let config = areal_testkit::CONFIG.replace(
        "[generator]\nkind = \"testkit-bigram\"\n",
        &format!("[generator]\nkind = \"testkit-bigram\"\n{extra}"),
    );
    std::fs::write(&path, config).unwrap();
    path
}

fn summary(run: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

fn steps_done(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .map(|t| {
            t.lines()
                .filter(|l| l.contains("\"event\":\"step\""))
                .count()
        })
        .unwrap_or(0)
}

/// Samples trained over every step of `run`'s metrics.
fn samples_in_steps(run: &Path) -> u64 {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["event"] == "step")
        .map(|r| r["samples"].as_u64().unwrap())
        .sum()
}

/// Wait (at most two minutes) until `run` has done `steps` steps.
fn wait_for_steps(run: &Path, steps: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while steps_done(run) < steps {
        assert!(
            Instant::now() < deadline,
            "the run never reached step {steps}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Processes whose command line mentions `needle` (e.g. a test's temporary folder).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            // a zombie has no command line; a live server does
            if cmdline.contains(needle) {
                found.push(cmdline);
            }
        }
    }
    found
}

/// Wait (at most 20 s) until no process mentions `needle`.
fn assert_none_left(needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = processes_mentioning(needle);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes left behind: {left:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `areal -v serve KIND` in a child process, logging to `log`; killed (SIGKILL) when dropped.
struct ServerProcess {
    child: Child,
    addr: String,
}

impl ServerProcess {
    fn start(kind: &str, config: &Path, listen: &str) -> Self {
        let log = config.with_file_name(format!("{kind}-{}.log", listen.replace(':', "_")));
        Self::start_logging(kind, config, listen, &log)
    }

    fn start_logging(kind: &str, config: &Path, listen: &str, log: &Path) -> Self {
        Self::start_with(kind, config, listen, log, &[])
    }

    /// [`start_logging`](Self::start_logging) with more arguments (`--api sglang`, `--set ...`).
    fn start_with(kind: &str, config: &Path, listen: &str, log: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_areal"))
            .args([
                "-v",
                "serve",
                kind,
                "--config",
                config.to_str().unwrap(),
                "--listen",
                listen,
            ])
            .args(extra)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("start areal serve");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with(&format!("serving {kind} ")), "{line:?}");
        let addr = line
            .split_whitespace()
            .skip_while(|w| *w != "on")
            .nth(1)
            .unwrap()
            .to_owned();
        Self { child, addr }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGKILL, and wait for it.
    fn kill(mut self) -> String {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.addr.clone()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `areal launch local` with two generator servers and one reward server.
const LAUNCH: [&str; 6] = [
    "launch",
    "local",
    "--generators",
    "2",
    "--reward-servers",
    "1",
];

fn train_args<'a>(config: &'a Path, run: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "train",
        "-q",
        "--config",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--seed",
        "3",
    ];
    args.extend(extra);
    args
}

fn spawn_train(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_areal"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start areal train")
}

fn finish(child: Child) -> Output {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    out
}

/// The testkit job through `areal launch local` (two generator servers, one reward server)
/// learns as it does in process with the same seed, trains every sample once, and leaves no
/// server behind.
#[test]
fn launch_local_learns_as_in_process_and_leaves_no_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit_config(dir.path(), "");
    let local = dir.path().join("local");
    let out = areal(&train_args(&config, &local, &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let launched = dir.path().join("launched");
    let mut args = LAUNCH.to_vec();
    // issue 32: the remote clients' own options reach the trainer alone (with `--set` the
    // servers refused them)
    args.extend(["--trainer-set", "generator.grace_s=77"]);
    args.extend(&train_args(&config, &launched, &[])[1..]);
    let out = areal(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_none_left(dir.path().to_str().unwrap());

    let (local_s, launched_s) = (summary(&local), summary(&launched));
    let accuracy = |s: &Value| s["final_accuracy"].as_f64().unwrap();
    assert!(
        accuracy(&local_s) > 0.5,
        "the job learns in process: {local_s}"
    );
    assert!(
        (accuracy(&launched_s) - accuracy(&local_s)).abs() <= 0.15,
        "in process {} against launched {}",
        accuracy(&local_s),
        accuracy(&launched_s)
    );
    assert_eq!(
        launched_s["baseline_accuracy"],
        local_s["baseline_accuracy"]
    );
    assert_eq!(launched_s["samples_trained"], samples_in_steps(&launched));
    assert_eq!(launched_s["reissued_samples"], 0);
    assert_eq!(launched_s["reward_failures"], 0);
    // the trainer's config names the servers; each server logged to the run folder
    let run_config = std::fs::read_to_string(launched.join("config.toml")).unwrap();
    assert_eq!(
        run_config.matches("http://127.0.0.1:").count(),
        3,
        "{run_config}"
    );
    assert!(run_config.contains("grace_s = 77"), "{run_config}");
    let served = std::fs::read_to_string(launched.join("servers/config.toml")).unwrap();
    assert!(!served.contains("grace_s"), "{served}");
    for log in ["generator-0.log", "generator-1.log", "reward-0.log"] {
        let log = std::fs::read_to_string(launched.join("servers").join(log)).unwrap();
        assert!(log.contains("listening"), "{log}");
    }
}

/// Ctrl-C stops the launched run cleanly (exit 130, its summary saved) and every server with
/// it; a launcher killed outright (SIGKILL) takes its servers along too.
#[test]
fn launch_local_leaves_no_process_behind_on_ctrl_c_or_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit_config(dir.path(), "token_delay_us = 20000\n");
    for (signal, run) in [("INT", "interrupted"), ("KILL", "killed")] {
        let run = dir.path().join(run);
        let mut args = LAUNCH.to_vec();
        args.extend(&train_args(&config, &run, &["--set", "train.steps=100000"])[1..]);
        let child = spawn_train(&args);
        wait_for_steps(&run, 3);
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let out = child.wait_with_output().unwrap();
        if signal == "INT" {
            assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
            assert_eq!(summary(&run)["interrupted"], true);
        }
        assert_none_left(dir.path().to_str().unwrap());
    }
}

/// A generator server killed with SIGKILL mid-run: its samples go to the other server once
/// each, the run completes with every sample trained once, and the server, restarted on its
/// port, is brought to the current weights and takes work again.
#[test]
fn a_generator_server_killed_mid_run_costs_reissues_and_rejoins_when_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit_config(dir.path(), "token_delay_us = 20000\n");
    let (a, b) = (
        ServerProcess::start("generator", &config, "127.0.0.1:0"),
        ServerProcess::start("generator", &config, "127.0.0.1:0"),
    );
    let run = dir.path().join("run");
    let endpoints = format!("generator.endpoints=[\"{}\", \"{}\"]", a.url(), b.url());
    let train = spawn_train(&train_args(
        &config,
        &run,
        &["--set", "generator.kind=remote", "--set", &endpoints],
    ));
    wait_for_steps(&run, 15);
    let addr = a.kill();
    wait_for_steps(&run, 25);
    let log = dir.path().join("restarted.log");
    let restarted = ServerProcess::start_logging("generator", &config, &addr, &log);
    finish(train);
    drop(restarted);

    let s = summary(&run);
    assert_eq!(s["steps"], 60, "{s}");
    assert!(s["reissued_samples"].as_u64().unwrap() >= 1, "{s}");
    assert!(s["endpoint_failures"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(
        s["samples_trained"],
        samples_in_steps(&run),
        "no sample trained twice"
    );
    assert!(s["final_accuracy"].as_f64().unwrap() > 0.5, "{s}");
    // the restarted server was brought to the current weights, then got every update after
    let log = std::fs::read_to_string(&log).unwrap();
    let loads = log.matches("weights loaded").count();
    assert!(loads >= 2, "{log}");
    assert!(
        log.contains("version=60"),
        "it held the last weights: {log}"
    );
}

/// The testkit job with its reward on a server in another process learns as it does in
/// process: same seed, same rewards (the successor reward is exact), so the same final
/// accuracy within the noise of asynchronous generation. With the server gone past the grace
/// period every sample fails, and the run stops naming the endpoint.
#[test]
fn the_testkit_job_learns_with_its_reward_served_by_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit_config(dir.path(), "");
    let server = ServerProcess::start("reward", &config, "127.0.0.1:0");
    let local = dir.path().join("local");
    let out = areal(&train_args(&config, &local, &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let remote = dir.path().join("remote");
    let endpoints = format!("reward.endpoints=[\"{}\"]", server.url());
    let remote_args = ["--set", "reward.kind=remote", "--set", &endpoints];
    let out = areal(&train_args(&config, &remote, &remote_args));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (local, remote) = (summary(&local), summary(&remote));
    assert_eq!(remote["reward_failures"], 0, "{remote}");
    let accuracy = |s: &Value| s["final_accuracy"].as_f64().unwrap();
    assert!(accuracy(&local) > 0.5, "the job learns in process: {local}");
    assert!(
        (accuracy(&remote) - accuracy(&local)).abs() <= 0.15,
        "in process {} against remote {}",
        accuracy(&local),
        accuracy(&remote)
    );

    let url = server.url();
    server.kill();
    let mut gone_args = remote_args.to_vec();
    gone_args.extend(["--set", "reward.grace_s=1"]);
    let out = areal(&train_args(&config, &dir.path().join("gone"), &gone_args));
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&url) && stderr.contains("no reward server has taken work for 1 s"),
        "{stderr}"
    );
}

/// A reward server killed with SIGKILL mid-run and restarted on its port: samples wait for it
/// (within the grace period) and none loses its reward.
#[test]
fn a_reward_server_killed_and_restarted_loses_no_sample() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit_config(dir.path(), "token_delay_us = 5000\n");
    let server = ServerProcess::start("reward", &config, "127.0.0.1:0");
    let run = dir.path().join("run");
    let endpoints = format!("reward.endpoints=[\"{}\"]", server.url());
    let train = spawn_train(&train_args(
        &config,
        &run,
        &["--set", "reward.kind=remote", "--set", &endpoints],
    ));
    wait_for_steps(&run, 15);
    let addr = server.kill();
    std::thread::sleep(Duration::from_millis(500));
    let _restarted = ServerProcess::start("reward", &config, &addr);
    finish(train);

    let s = summary(&run);
    assert_eq!(s["steps"], 60, "{s}");
    assert_eq!(s["reward_failures"], 0, "{s}");
    assert!(s["endpoint_failures"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["samples_trained"], samples_in_steps(&run));
}

/// With every generator server gone for the grace period, the run stops with an error naming
/// each endpoint and what it last said.
#[test]
fn every_generator_server_gone_stops_the_run_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit_config(dir.path(), "");
    let gone = ServerProcess::start("generator", &config, "127.0.0.1:0");
    let url = gone.url();
    gone.kill();
    let run = dir.path().join("run");
    let endpoints = format!("generator.endpoints=[\"{url}\"]");
    let out = areal(&train_args(
        &config,
        &run,
        &[
            "--set",
            "generator.kind=remote",
            "--set",
            &endpoints,
            "--set",
            "generator.grace_s=1",
        ],
    ));
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("no generator server has taken work for 1 s")
            && stderr.contains(&url)
            && stderr.contains("unreachable"),
        "{stderr}"
    );
}

/// Any address but loopback needs a shared token: without one, neither server starts.
#[test]
fn a_listener_off_loopback_without_a_token_refuses_to_start() {
    for kind in ["generator", "reward"] {
        let out = Command::new(env!("CARGO_BIN_EXE_areal"))
            .args(["serve", kind, "--listen", "0.0.0.0:0"])
            .env_remove("AREAL_TOKEN")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("refusing to listen on 0.0.0.0:0 without a token")
                && stderr.contains("AREAL_TOKEN"),
            "{stderr}"
        );
    }
}

/// `--set` arguments of the built-in job on a tiny budget, its warm-up cached under `dir`, then
/// `extra` settings.
fn tiny_built_in(dir: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let cache = format!("warmup.cache_dir={}", dir.join("cache").display());
    let tiny = [
        "task.eval_items=16",
        "task.validation_items=16",
        "task.max_terms=2",
        "warmup.eval_every=100",
        "warmup.max_steps=200",
        "warmup.batch_size=16",
        &cache,
        "train.steps=4",
        "eval.every=2",
        "rollout.batch_size=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=30",
    ];
    tiny.iter()
        .chain(extra)
        .flat_map(|set| ["--set".to_owned(), (*set).to_owned()])
        .collect()
}

/// The built-in job (the transformer on the burn generator, the chain-sum reward) on a tiny
/// budget, in process and through `areal launch local` with two generator servers and one
/// reward server: the greedy evaluations of the warm-up go through the servers and must
/// agree exactly with the in-process ones; RL trains every sample once.
#[test]
fn the_built_in_job_through_launched_servers_evaluates_exactly_as_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_built_in(dir.path(), &[]);
    let sets: Vec<&str> = tiny.iter().map(String::as_str).collect();
    let local = dir.path().join("local");
    let launched = dir.path().join("launched");
    let mut args = vec![
        "train",
        "-q",
        "--seed",
        "5",
        "--out",
        local.to_str().unwrap(),
    ];
    args.extend(&sets);
    let out = areal(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut args = LAUNCH.to_vec();
    args.extend(["-q", "--seed", "5", "--out", launched.to_str().unwrap()]);
    args.extend(&sets);
    let out = areal(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_none_left(dir.path().to_str().unwrap());

    let (l, r) = (summary(&local), summary(&launched));
    let curve = |s: &Value| -> Vec<(Value, Value)> {
        s["warmup"]["curve"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["validation_accuracy"].clone(),
                    p["validation_loss"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(curve(&l).len(), 2, "{l}");
    assert_eq!(
        curve(&r),
        curve(&l),
        "greedy evaluations through the servers"
    );
    assert_eq!(r["baseline_accuracy"], l["baseline_accuracy"]);
    assert_eq!(r["evals"][0], {
        let mut e = l["evals"][0].clone();
        e["wall_s"] = r["evals"][0]["wall_s"].clone();
        e
    });
    assert_eq!(r["steps"], 4);
    assert_eq!(r["samples_trained"], samples_in_steps(&launched));
    assert_eq!(r["reward_failures"], 0);
    // the servers measure their busy time (sampled by the probes, so a run this short may
    // see none of it)
    let gen_busy = r["gen_busy"]
        .as_f64()
        .expect("the burn servers measure their time");
    assert!((0.0..=1.0).contains(&gen_busy), "{r}");
}

/// The built-in job training LoRA adapters (deterministic mode) trains the same samples and
/// evaluates the same in process and through two launched gRPC generator servers (sent the
/// base once, then adapters alone); through an SGLang-API server (the base loaded from disk
/// once, then each version's adapter by name) it draws the same samples every time.
#[test]
fn the_built_in_job_with_adapters_evaluates_the_same_in_process_and_through_servers() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_built_in(
        dir.path(),
        &["train.lr=0.003", "policy.lora.rank=4", "deterministic=true"],
    );
    let sets: Vec<&str> = tiny.iter().map(String::as_str).collect();
    let run = |name: &str, front: &[&str], extra: &[&str]| {
        let out_dir = dir.path().join(name);
        let mut args = front.to_vec();
        args.extend(["-q", "--seed", "5", "--out", out_dir.to_str().unwrap()]);
        args.extend(&sets);
        args.extend(extra);
        let out = areal(&args);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        summary(&out_dir)
    };
    let local = run("local", &["train"], &[]);
    let launched = run("launched", &LAUNCH, &[]);
    assert_none_left(dir.path().to_str().unwrap());

    // Through a fresh SGLang-API server, twice. Its samples are not the in-process ones (the
    // server seeds each request from the seed it names, not from the sample's id), but a
    // second run draws the same samples and rewards at every step.
    let config = dir.path().join("server.toml");
    std::fs::write(&config, "").unwrap();
    let mut server_sets = vec!["--api", "sglang"];
    server_sets.extend(&sets);
    let through_api = |name: &str| {
        let log = dir.path().join(format!("{name}.log"));
        let server =
            ServerProcess::start_with("generator", &config, "127.0.0.1:0", &log, &server_sets);
        let weights = dir.path().join(format!("{name}-weights"));
        let endpoints = format!("generator.endpoints=[\"{}\"]", server.url());
        let weights_dir = format!("generator.weights_dir=\"{}\"", weights.display());
        let summary = run(
            name,
            &["train"],
            &[
                "--set",
                "generator.kind=\"sglang\"",
                "--set",
                &endpoints,
                "--set",
                &weights_dir,
            ],
        );
        (summary, weights)
    };
    let (api, weights) = through_api("sglang");
    let (api_again, _) = through_api("sglang-again");
    let drawn = |name: &str| -> Vec<(Value, Value)> {
        std::fs::read_to_string(dir.path().join(name).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| v["event"] == "step")
            .map(|v| (v["sample_ids"].clone(), v["reward_mean"].clone()))
            .collect()
    };
    assert_eq!(
        drawn("sglang-again"),
        drawn("sglang"),
        "the same samples again"
    );
    assert_eq!(
        drawn("launched"),
        drawn("local"),
        "the same samples through gRPC"
    );

    // the adapters trained: every B matrix, zero at the start, has moved (what greedy
    // accuracy on 5 items does after 4 steps depends on the machine's rounding)
    for name in ["local", "launched"] {
        let path = dir
            .path()
            .join(name)
            .join("checkpoint/adapter/adapter_model.safetensors");
        let moved = lora_b_moved(&path);
        assert!(
            !moved.is_empty() && moved.iter().all(|(_, m)| *m),
            "{name}: {moved:?}"
        );
    }
    let evals = |s: &Value| s["evals"].as_array().unwrap().clone();
    let without_wall = |s: &Value| -> Vec<Value> {
        evals(s)
            .into_iter()
            .map(|mut e| {
                e.as_object_mut().unwrap().remove("wall_s");
                e
            })
            .collect()
    };
    assert_eq!(without_wall(&launched), without_wall(&local));
    assert_eq!(without_wall(&api_again), without_wall(&api));
    assert_eq!(launched["baseline_accuracy"], local["baseline_accuracy"]);
    // before any adapter, greedy evaluation through the API is the in-process one
    assert_eq!(api["baseline_accuracy"], local["baseline_accuracy"]);
    assert_eq!(without_wall(&api)[0], without_wall(&local)[0]);
    for s in [&local, &launched, &api] {
        assert_eq!(s["steps"], 4);
        assert_eq!(s["reward_failures"], 0);
    }
    // the SGLang server was handed the base once and one adapter folder per version
    let mut entries: Vec<String> = std::fs::read_dir(&weights)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    entries.sort();
    assert!(entries[0].starts_with("base-"), "{entries:?}");
    assert!(
        entries[1..].iter().all(|e| e.starts_with('v')),
        "{entries:?}"
    );
    let newest = weights.join(entries.last().unwrap());
    assert!(newest.join("adapter_model.safetensors").is_file());
}

/// Each `lora_B` tensor of the PEFT adapter file `path` (f32), and whether any of its values
/// is not zero.
fn lora_b_moved(path: &std::path::Path) -> Vec<(String, bool)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut out: Vec<(String, bool)> = header
        .iter()
        .filter(|(name, _)| name.contains("lora_B"))
        .map(|(name, t)| {
            assert_eq!(t["dtype"], "F32", "{name}");
            let [start, end] = [0, 1].map(|i| t["data_offsets"][i].as_u64().unwrap() as usize);
            let moved = data[start..end]
                .chunks_exact(4)
                .any(|b| f32::from_le_bytes(b.try_into().unwrap()) != 0.0);
            (name.clone(), moved)
        })
        .collect();
    out.sort();
    out
}

/// `reward_service.workers`: the run's reward in worker processes. One killed with SIGKILL
/// mid-run is started again at its address and its sample sent once more, so no sample loses
/// its reward; the workers' logs are in the run folder, and none outlives the run. (Tokens are
/// slow here so that the run outlasts the 200 ms in which a death is noticed.)
#[test]
fn a_reward_worker_killed_mid_run_is_replaced_and_loses_no_sample() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit_config(dir.path(), "token_delay_us = 20000\n");
    let run = dir.path().join("run");
    let workers = run.join("reward-workers");
    let train = spawn_train(&train_args(
        &config,
        &run,
        &["--set", "reward_service.workers=2"],
    ));
    wait_for_steps(&run, 15);
    let needle = workers.join("config.toml").display().to_string();
    let before = processes_mentioning(&needle);
    assert_eq!(before.len(), 2, "two workers: {before:#?}");
    let pid = first_pid_mentioning(&needle);
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = finish(train);

    let s = summary(&run);
    assert_eq!(s["steps"], 60, "{s}");
    assert_eq!(s["reward_failures"], 0, "{s}");
    assert_eq!(s["samples_trained"], samples_in_steps(&run));
    let said = text(&out.stderr);
    assert!(
        said.contains("a server exited; starting it again"),
        "{said}"
    );
    assert!(workers.join("reward-0.log").exists() && workers.join("reward-1.log").exists());
    assert_none_left(&needle);
}

/// The pid of the first process whose command line mentions `needle`.
fn first_pid_mentioning(needle: &str) -> u32 {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .contains(needle)
        {
            return pid;
        }
    }
    panic!("no process mentions {needle}");
}

/// Issue 33: `reward_service.workers` worked only when the command line started the run;
/// `areal_core::run` ignored it and verified in process. Through the library now, the engine
/// starts the workers (children of this process, their config and logs in the run folder),
/// verifies through them, and stops them with the run; a program that cannot serve rewards is
/// refused naming the key.
#[test]
fn the_library_runs_rewards_in_worker_processes_when_the_config_asks() {
    use areal_core::{ConfigLoader, Plugins, RunOptions};
    use areal_serve as _; // the `remote` reward the workers are called through
    let load = |sets: &[String]| {
        ConfigLoader::new()
            .toml(areal_testkit::CONFIG, Path::new("testkit.toml"))
            .unwrap()
            .set_all(sets)
            .unwrap()
            .load()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let areal = env!("CARGO_BIN_EXE_areal");
    let config = load(&[
        "reward_service.workers=2".into(),
        format!("reward_service.worker_command=[\"{areal}\"]"),
        "generator.token_delay_us=2000".into(),
        "train.steps=20".into(),
    ]);
    let plugins = Plugins::build(&config).unwrap();
    let runtime = areal_cli::internal::runtime().unwrap();
    // the workers are looked at from inside the run (its first step), while they must live
    let needle = run.join("reward-workers/config.toml").display().to_string();
    let seen = Arc::new(WorkersSeen {
        needle: needle.clone(),
        parents: Mutex::new(None),
    });
    let options = RunOptions {
        out_dir: Some(run.clone()),
        observer: seen.clone(),
        ..RunOptions::default()
    };
    let summary = runtime.block_on(areal_core::run(config, plugins, options));
    let parents = seen.parents.lock().unwrap().clone();
    assert_eq!(
        parents,
        Some(vec![std::process::id(); 2]),
        "two workers, started by the engine in this process"
    );
    let summary = summary.unwrap();
    assert_eq!(summary.steps, 20);
    assert_eq!(summary.reward_failures, 0);
    let served = std::fs::read_to_string(run.join("reward-workers/config.toml")).unwrap();
    assert!(served.contains("workers = 0"), "{served}");
    assert!(run.join("reward-workers/reward-1.log").exists());
    assert_none_left(&needle);

    // a program that serves no rewards
    let config = load(&[
        "reward_service.workers=1".into(),
        "reward_service.worker_command=[\"/bin/false\"]".into(),
    ]);
    let plugins = Plugins::build(&config).unwrap();
    let runtime = areal_cli::internal::runtime().unwrap();
    let error = runtime
        .block_on(areal_core::run(config, plugins, RunOptions::default()))
        .unwrap_err();
    let said = areal_core::chain(&error);
    assert!(
        said.contains("reward_service.workers = 1") && said.contains("/bin/false"),
        "{said}"
    );
    assert!(said.contains("reward_service.worker_command"), "{said}");
}

/// An observer that notes, at the run's first step, the parent of every process whose
/// command line mentions `needle`.
struct WorkersSeen {
    needle: String,
    parents: Mutex<Option<Vec<u32>>>,
}

impl areal_core::Observer for WorkersSeen {
    fn on_step(&self, _: &areal_core::StepMetrics) {
        let mut parents = self.parents.lock().unwrap();
        if parents.is_none() {
            *parents = Some(parents_of_processes_mentioning(&self.needle));
        }
    }
}

/// The parent of each process whose command line mentions `needle`.
fn parents_of_processes_mentioning(needle: &str) -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmdline)
            .replace('\0', " ")
            .contains(needle)
        {
            continue;
        }
        // `pid (comm) state ppid ...`: the command may hold spaces and parentheses
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat"))
            && let Some(parent) = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse().ok())
        {
            parents.push(parent);
        }
    }
    parents
}
