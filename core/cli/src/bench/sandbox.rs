//! `areal bench sandbox`: the wasm sandbox against native, unsandboxed Python.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use areal_reward_code::compare::{parse_python_json, stdout_matches};
use areal_reward_code::{GradeOptions, PRELUDE, Problem, TestKind, grade_code};
use areal_sandbox::{Mode, Pool};
use areal_sdk::Verdict;
use clap::Args;

use super::stats::median;
use serde_json::{Value, json};

const NATIVE_RUNNER: &str = include_str!("native_runner.py");

#[derive(Debug, Args)]
pub(crate) struct BenchSandboxArgs {
    /// LiveCodeBench records, each with a reference solution in `code` (the format of
    /// `areal grade code`).
    #[arg(
        long,
        default_value = "rewards/code/tests/fixtures/lcb_reference.jsonl"
    )]
    problems: PathBuf,
    /// The native interpreter of the baseline.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Timed passes over the whole set per runner and thread count (after one untimed pass).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Thread counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Also write the report (markdown) to this file.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

struct Item {
    id: String,
    problem: Problem,
    code: String,
}

#[derive(Default)]
struct Samples {
    per_test_ms: Vec<f64>,
    per_problem_ms: Vec<f64>,
    startup_ms: Vec<f64>,
    exec_ms: Vec<f64>,
    tests: usize,
    seconds: f64,
}

impl Samples {
    fn tests_per_second(&self) -> f64 {
        self.tests as f64 / self.seconds
    }
}

fn load(path: &PathBuf) -> anyhow::Result<Vec<Item>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {} (run from the repository root, or pass --problems)",
            path.display()
        )
    })?;
    let mut items = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let record: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        let problem = Problem::from_record(&record)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        let Some(code) = record["code"].as_str() else {
            bail!(
                "{} line {}: no reference solution in `code`",
                path.display(),
                i + 1
            );
        };
        items.push(Item {
            id: problem
                .id
                .clone()
                .unwrap_or_else(|| format!("line {}", i + 1)),
            problem,
            code: code.to_owned(),
        });
    }
    Ok(items)
}

#[allow(clippy::print_stderr, clippy::print_stdout)]
pub(super) fn run(args: BenchSandboxArgs) -> anyhow::Result<()> {
    let items = Arc::new(load(&args.problems)?);
    let n_tests: usize = items.iter().map(|i| i.problem.tests.len()).sum();
    let functional = items
        .iter()
        .filter(|i| i.problem.func_name.is_some())
        .count();
    let (python, python_version) = resolve_python(&args.python)?;
    let sandbox = areal_reward_code::shared_sandbox(Mode::Fast)?;
    let options = GradeOptions::default();
    eprintln!(
        "{} problems ({functional} functional, {} stdin), {n_tests} tests; {} timed rounds",
        items.len(),
        items.len() - functional,
        args.rounds
    );

    let mut rows: Vec<(&'static str, usize, Samples)> = Vec::new();
    for &threads in &args.threads {
        let pool = Pool::new(Arc::clone(&sandbox), threads);
        let wasm = measure(args.rounds, || wasm_round(&pool, &items, &options))?;
        eprintln!(
            "  wasm sandbox, {threads} threads: {:.1} tests/s",
            wasm.tests_per_second()
        );
        rows.push(("wasm sandbox (fresh instance per test)", threads, wasm));
        for (label, per_test) in [
            ("native python (fresh process per problem)", false),
            ("native python (fresh process per test)", true),
        ] {
            let native = measure(args.rounds, || {
                native_round(&python, &items, threads, per_test)
            })?;
            eprintln!(
                "  {label}, {threads} threads: {:.1} tests/s",
                native.tests_per_second()
            );
            rows.push((label, threads, native));
        }
    }

    let mut report = String::new();
    report.push_str(&format!(
        "{} problems of `{}` ({functional} functional, {} stdin; {n_tests} tests), {} timed rounds after one untimed.\n\
         wasm: {} (guest sha256 {}…), wasmtime {}, per-test CPU limit {} s; native: {python} ({python_version}).\n\n",
        items.len(),
        args.problems.display(),
        items.len() - functional,
        args.rounds,
        sandbox.module(),
        &sandbox.guest_sha256()[..12],
        areal_sandbox::wasmtime_version(),
        options.cpu_limit().as_secs_f64(),
    ));
    report.push_str("| runner | threads | tests/s | per-test latency p50 (ms) | per-problem latency p50 (ms) | start-up p50 (ms) | execution p50 (ms) |\n");
    report.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    for (label, threads, s) in &rows {
        report.push_str(&format!(
            "| {label} | {threads} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |\n",
            s.tests_per_second(),
            median(&s.per_test_ms),
            median(&s.per_problem_ms),
            median(&s.startup_ms),
            median(&s.exec_ms),
        ));
    }
    let find = |label: &str, threads: usize| {
        rows.iter()
            .find(|(l, t, _)| l.starts_with(label) && *t == threads)
            .map(|(_, _, s)| s)
    };
    report.push_str("\nRatios, wasm ÷ native with a fresh process per problem (below 1.0 the sandbox is faster):\n\n");
    report.push_str("| threads | per-test latency | per-problem latency | throughput (native ÷ wasm) |\n|---:|---:|---:|---:|\n");
    for &threads in &args.threads {
        if let (Some(w), Some(n)) = (
            find("wasm", threads),
            find("native python (fresh process per problem)", threads),
        ) {
            report.push_str(&format!(
                "| {threads} | {:.2}× | {:.2}× | {:.2}× |\n",
                median(&w.per_test_ms) / median(&n.per_test_ms),
                median(&w.per_problem_ms) / median(&n.per_problem_ms),
                n.tests_per_second() / w.tests_per_second(),
            ));
        }
    }
    if let (Some(&lo), Some(&hi)) = (args.threads.first(), args.threads.last())
        && lo != hi
    {
        report.push_str(&format!("\nThroughput scaling {lo} → {hi} threads:\n\n"));
        for label in [
            "wasm sandbox",
            "native python (fresh process per problem)",
            "native python (fresh process per test)",
        ] {
            if let (Some(a), Some(b)) = (find(label, lo), find(label, hi)) {
                report.push_str(&format!(
                    "- {label}: {:.2}×\n",
                    b.tests_per_second() / a.tests_per_second()
                ));
            }
        }
    }
    println!("{report}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn measure(
    rounds: usize,
    mut round: impl FnMut() -> anyhow::Result<Samples>,
) -> anyhow::Result<Samples> {
    round()?; // untimed: caches, page cache, the compiled module
    let mut all = Samples::default();
    for _ in 0..rounds.max(1) {
        let s = round()?;
        all.per_test_ms.extend(s.per_test_ms);
        all.per_problem_ms.extend(s.per_problem_ms);
        all.startup_ms.extend(s.startup_ms);
        all.exec_ms.extend(s.exec_ms);
        all.tests += s.tests;
        all.seconds += s.seconds;
    }
    Ok(all)
}

fn wasm_round(
    pool: &Pool,
    items: &Arc<Vec<Item>>,
    options: &GradeOptions,
) -> anyhow::Result<Samples> {
    let started = Instant::now();
    let options = options.clone();
    let shared = Arc::clone(items);
    let grades = pool.map((0..items.len()).collect(), move |sb, i| {
        let item = &shared[i];
        grade_code(sb, &item.problem, &item.code, &options)
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut s = Samples {
        seconds,
        ..Samples::default()
    };
    for (item, grade) in items.iter().zip(grades) {
        let grade = grade.context("a sandbox worker panicked")?;
        if grade.verdict != Verdict::Accepted {
            bail!(
                "{}: the reference solution got {} in the sandbox: {:?}",
                item.id,
                grade.verdict.as_str(),
                grade.message
            );
        }
        s.per_problem_ms.push(grade.wall_ms);
        for run in &grade.runs {
            s.tests += 1;
            s.per_test_ms.push(run.wall_ms);
            if let Some(exec) = run.exec_ms {
                s.exec_ms.push(exec);
                s.startup_ms.push(run.wall_ms - exec);
            }
        }
    }
    Ok(s)
}

/// The real interpreter behind `python` (a pyenv shim costs ~100 ms a start) and its version.
fn resolve_python(python: &str) -> anyhow::Result<(String, String)> {
    let out = Command::new(python)
        .args([
            "-c",
            "import sys; print(sys.executable); print(sys.version.split()[0])",
        ])
        .output()
        .with_context(|| format!("cannot run {python}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    match (lines.next(), lines.next()) {
        (Some(exe), Some(version)) if out.status.success() => {
            Ok((exe.to_owned(), version.to_owned()))
        }
        _ => bail!("{python} did not report its executable"),
    }
}

struct NativeJob {
    item: usize,
    tests: std::ops::Range<usize>,
}

struct NativeResult {
    item: usize,
    wall_ms: f64,
    startup_ms: f64,
    exec_ms: Vec<f64>,
}

fn native_round(
    python: &str,
    items: &[Item],
    threads: usize,
    per_test: bool,
) -> anyhow::Result<Samples> {
    let jobs: Vec<NativeJob> = items
        .iter()
        .enumerate()
        .flat_map(|(i, item)| {
            let n = item.problem.tests.len();
            if per_test {
                (0..n)
                    .map(|t| NativeJob {
                        item: i,
                        tests: t..t + 1,
                    })
                    .collect::<Vec<_>>()
            } else {
                vec![NativeJob {
                    item: i,
                    tests: 0..n,
                }]
            }
        })
        .collect();
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let results: Vec<anyhow::Result<NativeResult>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        let Some(job) = jobs.get(j) else { break };
                        done.push(run_native(python, &items[job.item], job));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a bench worker panicked"))
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut s = Samples {
        seconds,
        ..Samples::default()
    };
    let mut per_problem = vec![0.0; items.len()];
    for r in results {
        let r = r?;
        per_problem[r.item] += r.wall_ms;
        let n = r.exec_ms.len();
        s.tests += n;
        s.startup_ms.push(r.startup_ms);
        for e in &r.exec_ms {
            s.exec_ms.push(*e);
            s.per_test_ms.push(r.wall_ms / n as f64);
        }
    }
    s.per_problem_ms = per_problem;
    Ok(s)
}

fn run_native(python: &str, item: &Item, job: &NativeJob) -> anyhow::Result<NativeResult> {
    let tests = &item.problem.tests[job.tests.clone()];
    let input = json!({
        "kind": if item.problem.func_name.is_some() { "call" } else { "stdin" },
        "func": item.problem.func_name,
        "code": item.code,
        "prelude": PRELUDE,
        "inputs": tests.iter().map(|t| t.input.as_str()).collect::<Vec<_>>(),
    });
    let spawned_at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
    let started = Instant::now();
    let mut child = Command::new(python)
        .args(["-c", NATIVE_RUNNER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {python}"))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        bail!(
            "{}: native python failed: {}",
            item.id,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{}: native runner printed no report", item.id))?;
    let outputs = report["outputs"].as_array().context("outputs")?;
    for (test, got) in tests.iter().zip(outputs) {
        let got = got.as_str().unwrap_or_default();
        let ok = match test.kind {
            TestKind::Stdin => stdout_matches(got, &test.output),
            TestKind::Functional => match (parse_python_json(got), parse_python_json(&test.output))
            {
                (Ok(a), Ok(b)) => a.py_eq(&b),
                _ => false,
            },
        };
        if !ok {
            bail!("{}: the reference solution is wrong natively", item.id);
        }
    }
    let ready = report["ready"].as_f64().context("ready")?;
    Ok(NativeResult {
        item: job.item,
        wall_ms,
        startup_ms: (ready - spawned_at) * 1e3,
        exec_ms: report["exec"]
            .as_array()
            .context("exec")?
            .iter()
            .map(|v| v.as_f64().unwrap_or(0.0) * 1e3)
            .collect(),
    })
}
