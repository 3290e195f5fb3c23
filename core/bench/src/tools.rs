//! `areal bench tools`: what an agent's `python` tool call costs. A call in a session (one
//! interpreter kept alive in the wasm sandbox, so that its names persist to the next call)
//! against a fresh `python3` process per call, the way local tool sandboxes of other
//! frameworks run a call; for a trivial call and a ~50 ms computation. Then episodes per
//! second of the built-in multi-turn job with its tool in process and on a tool server.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use areal_sandbox::{Limits, Mode, Outcome, PYTHON_CELLS, Sandbox, Session, Settings};
use clap::Args;

use crate::stats::{mean, percentile};

#[derive(Debug, Args)]
pub(crate) struct BenchToolsArgs {
    /// Calls per kind and runner.
    #[arg(long, default_value_t = 200)]
    calls: usize,
    /// Calls of the ~50 ms computation per runner (it costs ~100x a trivial call).
    #[arg(long, default_value_t = 30)]
    heavy_calls: usize,
    /// The native Python of the baseline.
    #[arg(long, default_value = "python3")]
    python: PathBuf,
    /// Also write the report (markdown) to this file.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// RL steps of the built-in multi-turn job per run, for episodes per second with its
    /// `python` tool in process and on a tool server (`areal serve tools`); 0 leaves it out.
    #[arg(long, default_value_t = 40)]
    job_steps: u64,
    /// The job (its `[[tools]]` are what the tool server serves).
    #[arg(long, default_value = "plugins/tools/examples/tool-mul.toml")]
    job_config: PathBuf,
}

/// What the session holds before the measured calls (what a fresh process has to redo).
const SETUP: &str = "counter = 0";
/// The calls measured: a name, the cell a session runs, and the program a fresh process
/// runs for the same answer (the setup again, and a print of the cell's last value).
const CALLS: [(&str, &str, &str); 2] = [
    (
        "trivial (update the state, show it)",
        "counter += 1\ncounter",
        "counter = 0\ncounter += 1\nprint(counter)",
    ),
    (
        "a loop of 420 000 steps (~50 ms native)",
        "total = 0\nfor i in range(420_000):\n    total += i * i % 7\ntotal",
        "counter = 0\ntotal = 0\nfor i in range(420_000):\n    total += i * i % 7\nprint(total)",
    ),
];

struct Row {
    runner: &'static str,
    call: &'static str,
    ms: Vec<f64>,
}

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(super) fn run(args: BenchToolsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.calls > 0 && args.heavy_calls > 0,
        "--calls and --heavy-calls: at least 1"
    );
    eprintln!("building the session sandbox (snapshotted once, then cached)...");
    let sandbox = Sandbox::new(&Settings {
        mode: Mode::Fast,
        preinit: Some(PYTHON_CELLS.into()),
        ..Settings::default()
    })
    .context("the WASI interpreter (`make python-wasi`)")?;
    let limits = Limits {
        cpu: Duration::from_secs(10),
        wall: Duration::from_secs(30),
        memory_bytes: 256 << 20,
        stdout_bytes: 16 << 10,
        ..Limits::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let mut rows = Vec::new();
    let mut starts = Vec::new();
    rt.block_on(async {
        // an untimed warm-up session
        let mut warm = Session::start(&sandbox, &limits, 0).await?;
        warm.call(SETUP.as_bytes()).await?;
        for (i, (call, source, _)) in CALLS.into_iter().enumerate() {
            let n = if i == 0 { args.calls } else { args.heavy_calls };
            let started = Instant::now();
            let mut session = Session::start(&sandbox, &limits, 0).await?;
            starts.push(started.elapsed().as_secs_f64() * 1e3);
            let setup = session.call(SETUP.as_bytes()).await?;
            anyhow::ensure!(
                setup.outcome == Outcome::Exited(0),
                "the setup cell: {:?}",
                setup.outcome
            );
            let mut ms = Vec::with_capacity(n);
            for _ in 0..n {
                let t = Instant::now();
                let report = session.call(source.as_bytes()).await?;
                ms.push(t.elapsed().as_secs_f64() * 1e3);
                anyhow::ensure!(
                    report.outcome == Outcome::Exited(0) && !report.stdout.is_empty(),
                    "a {call} call: {:?}, {:?}",
                    report.outcome,
                    String::from_utf8_lossy(&report.stdout)
                );
            }
            rows.push(Row {
                runner: "wasm session (state kept)",
                call,
                ms,
            });
        }
        Ok::<_, anyhow::Error>(())
    })?;
    // the interpreter itself, not a launcher in front of it (pyenv's shim costs ~100 ms)
    let python = Command::new(&args.python)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| args.python.clone());
    // a fresh process cannot keep the state: it runs the setup again, then the call
    for (i, (call, _, program)) in CALLS.into_iter().enumerate() {
        let n = if i == 0 { args.calls } else { args.heavy_calls };
        let mut ms = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let out = Command::new(&python)
                .args(["-c", program])
                .output()
                .with_context(|| format!("running {}", python.display()))?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(
                out.status.success(),
                "{}: {}",
                python.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        rows.push(Row {
            runner: "python3 process per call",
            call,
            ms,
        });
    }
    let version = Command::new(&python)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let mut report = format!(
        "A `python` tool call as the episode sees it: the cell sent, run, its output back. \
         Session start-up (an instance of the snapshot): {:.2} ms. Native: {} ({version}), a \
         fresh process per call, which must redo the setup a session keeps.\n\n\
         | runner | call | calls | p50 ms | p99 ms | mean ms |\n|---|---|---:|---:|---:|---:|\n",
        mean(&starts),
        python.display()
    );
    for r in &rows {
        report.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} |\n",
            r.runner,
            r.call,
            r.ms.len(),
            percentile(&r.ms, 50.0),
            percentile(&r.ms, 99.0),
            mean(&r.ms)
        ));
    }
    if args.job_steps > 0 {
        report.push_str(&job(&args)?);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    report.push_str(&format!("\n{cores} cores\n"));
    crate::publish(&report, args.markdown.as_deref())
}

/// Episodes per second of the built-in multi-turn job, its tool in the trainer's process and
/// on a tool server on the same machine: a table.
#[allow(clippy::print_stderr, reason = "progress on stderr")]
fn job(args: &BenchToolsArgs) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("cannot find the areal binary")?;
    let dir = tempfile::tempdir()?;
    let config: std::ffi::OsString = args.job_config.clone().into();
    let (mut servers, mut urls) =
        crate::start_servers("tools", 1, &["--config".into(), config.clone()], dir.path())?;
    let url = urls.pop().context("the tool server did not start")?;
    let remote =
        format!("tools=[{{kind = \"remote\", endpoints = [\"{url}\"], tool = \"python\"}}]");
    let mut table = format!(
        "\nThe built-in multi-turn job ({}), {} RL steps after its (cached) warm-up, the \
         `python` tool in the trainer's process or on a tool server (`areal serve tools`, \
         loopback, the same 2 cores):\n\n\
         | tool | episodes | RL s | episodes/s | tool calls/s | held-out accuracy |\n\
         |---|---:|---:|---:|---:|---:|\n",
        args.job_config.display(),
        args.job_steps
    );
    for (label, set) in [("in process", None), ("on a tool server", Some(remote))] {
        eprintln!("the job with its tool {label}...");
        let out = dir.path().join(label.replace(' ', "-"));
        let mut command = Command::new(&exe);
        command
            .arg("train")
            .arg("-q")
            .arg("--config")
            .arg(&config)
            .arg("--out")
            .arg(&out);
        for s in [
            format!("train.steps={}", args.job_steps),
            format!("eval.every={}", args.job_steps),
        ]
        .into_iter()
        .chain(set)
        {
            command.arg("--set").arg(s);
        }
        let ran = command.output().context("running areal train")?;
        anyhow::ensure!(
            ran.status.success(),
            "the job with its tool {label} failed: {}",
            String::from_utf8_lossy(&ran.stderr)
        );
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json"))?)?;
        let (mut episodes, mut calls) = (0.0, 0.0);
        for line in std::fs::read_to_string(out.join("metrics.jsonl"))?.lines() {
            let record: serde_json::Value = serde_json::from_str(line)?;
            episodes += record["episodes"].as_f64().unwrap_or(0.0);
            calls += record["tool_calls"].as_f64().unwrap_or(0.0);
        }
        let seconds = summary["rl_seconds"].as_f64().unwrap_or(f64::NAN);
        table.push_str(&format!(
            "| {label} | {episodes} | {seconds:.1} | {:.0} | {:.0} | {:.3} |\n",
            episodes / seconds,
            calls / seconds,
            summary["final_accuracy"].as_f64().unwrap_or(f64::NAN)
        ));
    }
    servers.stop();
    Ok(table)
}
