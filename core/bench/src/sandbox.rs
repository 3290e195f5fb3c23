//! `areal bench sandbox`: the wasm sandbox against native, unsandboxed Python.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use areal_reward_code::compare::{parse_python_json, stdout_matches};
use areal_reward_code::{Grade, GradeOptions, PRELUDE, PROGRAM, Problem, TestKind, grade_code};
use areal_sandbox::{Mode, Pool};
use areal_sdk::Verdict;
use clap::Args;

use super::stats::median;
use serde_json::{Value, json};

const NATIVE_RUNNER: &str = include_str!("native_runner.py");

/// Which programs the bench grades.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ProgramSet {
    /// `--problems`: LiveCodeBench records with reference solutions (small public tests).
    Lcb,
    /// CPU-heavy programs at the sizes of LiveCodeBench's private tests, their expected
    /// output what native Python prints; adds a table of execution time wasm ÷ native per
    /// program.
    Heavy,
}

#[derive(Debug, Args)]
pub(crate) struct BenchSandboxArgs {
    /// The programs: `lcb` (the records of `--problems`) or `heavy`.
    #[arg(long, value_enum, default_value = "lcb")]
    set: ProgramSet,
    /// LiveCodeBench records, each with a reference solution in `code` (the format of
    /// `areal grade code`).
    #[arg(
        long,
        default_value = "rewards/code/tests/fixtures/lcb_reference.jsonl"
    )]
    problems: PathBuf,
    /// The native interpreter of the baseline (for `--set heavy`, one with numpy 1.26.4:
    /// `.cache/lcb-grader/bin/python`, made by `rewards/code/scripts/setup-lcb-grader.sh`).
    #[arg(long, default_value = "python3")]
    python: String,
    /// Timed passes over the whole set per runner and thread count (after one untimed pass).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Thread counts to measure (sandboxes on threads of this process).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Worker-process counts to measure (the `lcb` reward in `areal serve reward` workers,
    /// as `areal grade code -j N` and `reward_service.workers` run it); `--workers` alone
    /// for none.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,2")]
    workers: Vec<usize>,
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

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(super) fn run(args: BenchSandboxArgs) -> anyhow::Result<()> {
    let (python, python_version) = resolve_python(&args.python)?;
    let items = Arc::new(match args.set {
        ProgramSet::Lcb => load(&args.problems)?,
        ProgramSet::Heavy => heavy_items(&python)?,
    });
    let n_tests: usize = items.iter().map(|i| i.problem.tests.len()).sum();
    let functional = items
        .iter()
        .filter(|i| i.problem.func_name.is_some())
        .count();
    let sandbox = areal_reward_code::shared_sandbox(Mode::Fast)?;
    let options = GradeOptions::default();
    if args.set == ProgramSet::Heavy {
        let report = heavy_report(
            &python,
            &python_version,
            &items,
            &sandbox,
            &options,
            args.rounds,
        )?;
        return crate::publish(&report, args.markdown.as_deref());
    }
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
    for &workers in &args.workers {
        let (verifier, started) = areal_cli::internal::lcb_workers(&sandbox, &options, workers)?;
        let through = measure(args.rounds, || {
            workers_round(verifier.as_ref(), &items, workers)
        })?;
        drop(started);
        eprintln!(
            "  wasm, worker processes, {workers}: {:.1} tests/s",
            through.tests_per_second()
        );
        rows.push((
            "wasm worker processes (fresh instance per test)",
            workers,
            through,
        ));
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
    report.push_str("| runner | threads or workers | tests/s | per-test latency p50 (ms) | per-problem latency p50 (ms) | start-up p50 (ms) | execution p50 (ms) |\n");
    report.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    for (label, threads, s) in &rows {
        report.push_str(&format!(
            "| {label} | {threads} | {:.1} | {} | {:.1} | {} | {} |\n",
            s.tests_per_second(),
            cell(&s.per_test_ms, 1),
            median(&s.per_problem_ms),
            cell(&s.startup_ms, 1),
            cell(&s.exec_ms, 2),
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
    let scalings = [
        (&args.threads, "threads", "wasm sandbox"),
        (
            &args.threads,
            "threads",
            "native python (fresh process per problem)",
        ),
        (
            &args.threads,
            "threads",
            "native python (fresh process per test)",
        ),
        (&args.workers, "worker processes", "wasm worker processes"),
    ];
    for (i, (counts, unit, label)) in scalings.into_iter().enumerate() {
        if let (Some(&lo), Some(&hi)) = (counts.first(), counts.last())
            && lo != hi
        {
            if i == 0 || i == 3 {
                report.push_str(&format!("\nThroughput scaling {lo} → {hi} {unit}:\n\n"));
            }
            if let (Some(a), Some(b)) = (find(label, lo), find(label, hi)) {
                report.push_str(&format!(
                    "- {label}: {:.2}×\n",
                    b.tests_per_second() / a.tests_per_second()
                ));
            }
        }
    }
    crate::publish(&report, args.markdown.as_deref())
}

/// The heavy set's table: each program runs natively and then in the sandbox, one after the
/// other, `rounds` times after an untimed pass, so that both see the machine alike (on a
/// shared machine its speed drifts by 10–30 % over minutes); a program's ratio is the median
/// of its rounds' ratios. Execution time only: the program alone, start-up excluded.
#[allow(clippy::print_stderr, reason = "messages for the user, on stderr")]
fn heavy_report(
    python: &str,
    python_version: &str,
    items: &[Item],
    sandbox: &areal_sandbox::Sandbox,
    options: &GradeOptions,
    rounds: usize,
) -> anyhow::Result<String> {
    let n = items.len();
    let (mut native, mut wasm, mut ratios) = (vec![vec![]; n], vec![vec![]; n], vec![vec![]; n]);
    let mut as_function = vec![None; n];
    for round in 0..=rounds.max(1) {
        for (i, item) in items.iter().enumerate() {
            let job = NativeJob {
                item: i,
                tests: 0..1,
            };
            let native_ms = run_native(python, item, &job)?.exec_ms[0];
            let grade = accepted(
                item,
                grade_code(sandbox, &item.problem, &item.code, options),
            )?;
            let run = &grade.runs[0];
            let wasm_ms = run
                .exec_ms
                .context("the harness measured no execution time")?;
            as_function[i] = run.as_function;
            if round > 0 {
                native[i].push(native_ms);
                wasm[i].push(wasm_ms);
                ratios[i].push(wasm_ms / native_ms);
            }
        }
        eprintln!(
            "  {} {round} of {rounds}",
            if round == 0 { "untimed pass," } else { "round" }
        );
    }
    let mut report = format!(
        "The CPU-heavy set (`--set heavy`): {n} programs, each run natively and then in the \
         sandbox, {rounds} rounds after an untimed one. wasm: {} (guest sha256 {}…), wasmtime \
         {}; native: {python} ({python_version}). Execution time of the program alone \
         (start-up excluded), medians; ratio: the median of the rounds' ratios.\n\n\
         | program | compiled as | native (ms) | wasm (ms) | wasm ÷ native |\n\
         |---|---|---:|---:|---:|\n",
        sandbox.module(),
        &sandbox.guest_sha256()[..12],
        areal_sandbox::wasmtime_version(),
    );
    let mut medians = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let ratio = median(&ratios[i]);
        medians.push(ratio);
        report.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {ratio:.2}× |\n",
            item.id,
            match as_function[i] {
                Some(true) => "function",
                Some(false) => "module",
                None => "–",
            },
            median(&native[i]),
            median(&wasm[i]),
        ));
    }
    let mut sorted = medians.clone();
    sorted.sort_by(f64::total_cmp);
    report.push_str(&format!(
        "\nwasm ÷ native: median {:.2}×, geometric mean {:.2}×, range {:.2}×–{:.2}×\n",
        median(&medians),
        (medians.iter().map(|r| r.ln()).sum::<f64>() / n.max(1) as f64).exp(),
        sorted.first().copied().unwrap_or(0.0),
        sorted.last().copied().unwrap_or(0.0),
    ));
    Ok(report)
}

/// The median of `xs` to `places` decimals, or `–` when nothing was measured (a worker reports
/// whole gradings, not their tests).
fn cell(xs: &[f64], places: usize) -> String {
    if xs.is_empty() {
        "–".into()
    } else {
        format!("{:.*}", places, median(xs))
    }
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
        let grade = accepted(item, grade.context("a sandbox worker panicked")?)?;
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

/// `grade`, or an error naming `item` if its reference solution was not accepted.
fn accepted(item: &Item, grade: Grade) -> anyhow::Result<Grade> {
    if grade.verdict != Verdict::Accepted {
        bail!(
            "{}: the reference solution got {} in the sandbox: {:?}",
            item.id,
            grade.verdict.as_str(),
            grade.message
        );
    }
    Ok(grade)
}

/// One pass over `items` through worker processes: two calls in flight per worker.
fn workers_round(
    verifier: &dyn areal_sdk::RewardVerifier,
    items: &[Item],
    workers: usize,
) -> anyhow::Result<Samples> {
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let results: Vec<anyhow::Result<(usize, f64)>> = std::thread::scope(|scope| {
        let callers: Vec<_> = (0..areal_cli::internal::CALLS_PER_WORKER * workers.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        done.push(grade_in_worker(verifier, item).map(|ms| (i, ms)));
                    }
                    done
                })
            })
            .collect();
        callers
            .into_iter()
            .flat_map(|c| c.join().expect("a bench caller panicked"))
            .collect()
    });
    let mut s = Samples {
        seconds: started.elapsed().as_secs_f64(),
        ..Samples::default()
    };
    for r in results {
        let (i, wall_ms) = r?;
        s.tests += items[i].problem.tests.len();
        s.per_problem_ms.push(wall_ms);
    }
    Ok(s)
}

/// Grade a reference solution through the workers; the grading's wall time (ms).
fn grade_in_worker(verifier: &dyn areal_sdk::RewardVerifier, item: &Item) -> anyhow::Result<f64> {
    let mut record = json!({
        "question_id": item.id,
        "public_test_cases": serde_json::to_string(&item.problem.tests)?,
    });
    if let Some(func) = &item.problem.func_name {
        record["metadata"] = json!({ "func_name": func });
    }
    let reward = areal_cli::internal::verify_record(
        verifier,
        0,
        item.id.clone(),
        areal_tasks::code::fence(&item.code),
        record,
    )
    .map_err(|e| anyhow::anyhow!("{}: {}", item.id, areal_core::chain(&e)))?;
    if reward.verdict != Verdict::Accepted {
        bail!(
            "{}: the reference solution got {} in a worker: {:?}",
            item.id,
            reward.verdict.as_str(),
            reward.provenance.details.get("message")
        );
    }
    Ok(reward.provenance.wall_ms)
}

/// The heavy set as items: each program's expected output is what native `python` prints.
fn heavy_items(python: &str) -> anyhow::Result<Vec<Item>> {
    let mut items = Vec::new();
    for h in super::heavy::set() {
        let probe = Item {
            id: h.id.to_owned(),
            problem: Problem {
                id: Some(h.id.to_owned()),
                tests: Vec::new(),
                func_name: None,
            },
            code: h.code.to_owned(),
        };
        let output = native_output(python, &probe, &h.input)?;
        let mut item = probe;
        item.problem.tests.push(areal_reward_code::TestCase {
            input: h.input,
            output,
            kind: TestKind::Stdin,
        });
        items.push(item);
    }
    Ok(items)
}

/// What `item`'s program prints for `input` in native `python`.
fn native_output(python: &str, item: &Item, input: &str) -> anyhow::Result<String> {
    let report = native_report(python, item, &[input])?;
    Ok(report["outputs"][0]
        .as_str()
        .context("no output")?
        .to_owned())
}

/// `item`'s program on `inputs` in one native `python` process (`native_runner.py`): its
/// report.
fn native_report(python: &str, item: &Item, inputs: &[&str]) -> anyhow::Result<Value> {
    let job = json!({
        "kind": if item.problem.func_name.is_some() { "call" } else { "stdin" },
        "func": item.problem.func_name,
        "code": item.code,
        "prelude": PRELUDE,
        "inputs": inputs,
    });
    let mut child = Command::new(python)
        .args(["-c", &format!("{PROGRAM}\n{NATIVE_RUNNER}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {python}"))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(job.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{}: native python failed: {}",
            item.id,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{}: native runner printed no report", item.id))
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
    let inputs: Vec<&str> = tests.iter().map(|t| t.input.as_str()).collect();
    let spawned_at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
    let started = Instant::now();
    let report = native_report(python, item, &inputs)?;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
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
