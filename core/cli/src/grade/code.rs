//! `areal grade code`: grade LiveCodeBench records with the wasm sandbox, one JSON line out
//! per line in, in order.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use areal_reward_code::{GradeOptions, Problem, grade_code, grade_completion, reward_of};
use areal_sandbox::{Mode, Pool, Sandbox};
use areal_sdk::{Provenance, Verdict};
use clap::Args;
use serde_json::{Value, json};

use super::input::{Lines, check_flags, line_progress, open_input};

#[derive(Debug, Args)]
pub(crate) struct GradeCodeArgs {
    /// A JSONL file, or `-` for stdin.
    file: PathBuf,
    /// LiveCodeBench's time limit per test for native CPython, in seconds.
    #[arg(long, default_value_t = GradeOptions::default().timeout_s)]
    timeout: f64,
    /// Factor applied to --timeout for the WASI interpreter (recorded in provenance).
    #[arg(long, default_value_t = GradeOptions::default().time_scale)]
    time_scale: f64,
    /// Linear memory per test, in MiB (the interpreter's 64 MiB C stack included).
    #[arg(long, default_value_t = GradeOptions::default().memory_mb)]
    memory_mb: usize,
    /// Stdout per test, in bytes.
    #[arg(long, default_value_t = GradeOptions::default().output_bytes)]
    output_bytes: usize,
    /// Parallel sandboxes (1 to 64). One is the fastest today: sandboxes on several threads
    /// of one process slow each other down (docs/benchmarks.md).
    #[arg(long, short = 'j', default_value_t = 1)]
    threads: usize,
    /// Reward = fraction of tests passed instead of 1 iff accepted.
    #[arg(long)]
    partial_credit: bool,
    /// Deterministic mode: a fuel budget instead of time limits, a fixed clock and random
    /// source; the same input gives the same verdicts and fuel.
    #[arg(long)]
    deterministic: bool,
    /// Fuel per test in deterministic mode.
    #[arg(long, default_value_t = GradeOptions::default().fuel)]
    fuel: u64,
    /// The most a record's compressed private tests may decompress to, in MiB.
    #[arg(long, default_value_t = GradeOptions::default().max_tests_mb)]
    max_tests_mb: usize,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// What one input line asks for.
struct Job {
    id: Option<String>,
    problem: Problem,
    text: Text,
}

enum Text {
    Completion(String),
    Code(String),
}

fn parse_line(line: &str, max_tests_bytes: usize) -> Result<Job, String> {
    if line.trim().is_empty() {
        return Err("empty line".into());
    }
    let record: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let text = match (record.get("completion"), record.get("code")) {
        (Some(Value::String(c)), None) => Text::Completion(c.clone()),
        (None, Some(Value::String(c))) => Text::Code(c.clone()),
        (Some(_), Some(_)) => return Err("give `completion` or `code`, not both".into()),
        (None, None) => return Err("no `completion` (the model's response) or `code`".into()),
        _ => return Err("`completion` / `code` must be a string".into()),
    };
    let problem =
        Problem::from_record_within(&record, max_tests_bytes).map_err(|e| e.to_string())?;
    Ok(Job {
        id: problem.id.clone(),
        problem,
        text,
    })
}

#[allow(clippy::print_stderr)]
pub(super) fn run(args: GradeCodeArgs) -> anyhow::Result<()> {
    let options = GradeOptions {
        mode: if args.deterministic {
            Mode::Deterministic
        } else {
            Mode::Fast
        },
        timeout_s: args.timeout,
        time_scale: args.time_scale,
        memory_mb: args.memory_mb,
        output_bytes: args.output_bytes,
        partial_credit: args.partial_credit,
        fuel: args.fuel,
        max_tests_mb: args.max_tests_mb,
    };
    check_flags(options.check(), args.threads)?;
    let max_tests_bytes = options.max_tests_bytes();
    let input = open_input(&args.file)?;
    let sandbox = areal_reward_code::shared_sandbox(options.mode)?;
    let threads = args.threads;
    let pool = Pool::new(Arc::clone(&sandbox), threads);
    let options = Arc::new(options);

    let bar = line_progress(args.quiet);
    let started = Instant::now();
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut pending: VecDeque<crossbeam_channel::Receiver<Value>> = VecDeque::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut total_reward = 0.0;
    let mut graded = 0usize;
    let mut emit = |result: Value, out: &mut BufWriter<std::io::StdoutLock<'_>>| {
        let verdict = result["verdict"].as_str().unwrap_or("error").to_owned();
        *counts.entry(verdict).or_default() += 1;
        total_reward += result["reward"].as_f64().unwrap_or(0.0);
        graded += 1;
        bar.inc(1);
        bar.set_message(format!("accepted {}", counts.get("accepted").unwrap_or(&0)));
        serde_json::to_writer(&mut *out, &result)?;
        out.write_all(b"\n")?;
        out.flush()
    };
    for line in Lines::new(input) {
        let (line_no, line) = line?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        match line.and_then(|line| parse_line(&line, max_tests_bytes)) {
            Err(message) => {
                let message = format!("line {line_no}: {message}");
                let _ = tx.send(error_line(line_no, &message, &sandbox));
            }
            Ok(job) => {
                let options = Arc::clone(&options);
                // The pool's own receiver is dropped: the job answers on `tx`.
                let _ = pool.submit(move |sb| {
                    let _ = tx.send(grade_job(sb, line_no, job, &options));
                });
            }
        }
        pending.push_back(rx);
        while pending.len() > threads * 4 {
            let rx = pending.pop_front().expect("non-empty");
            emit(receive(rx, &sandbox), &mut out)?;
        }
    }
    while let Some(rx) = pending.pop_front() {
        emit(receive(rx, &sandbox), &mut out)?;
    }
    bar.finish_and_clear();
    let summary: Vec<String> = counts.iter().map(|(v, n)| format!("{v} {n}")).collect();
    eprintln!(
        "graded {graded} lines in {:.1} s on {threads} threads: {}; mean reward {:.3}",
        started.elapsed().as_secs_f64(),
        summary.join(", "),
        if graded > 0 {
            total_reward / graded as f64
        } else {
            0.0
        }
    );
    Ok(())
}

fn receive(rx: crossbeam_channel::Receiver<Value>, sandbox: &Sandbox) -> Value {
    rx.recv()
        .unwrap_or_else(|_| error_line(0, "the grading worker panicked", sandbox))
}

fn grade_job(sandbox: &Sandbox, line: usize, job: Job, options: &GradeOptions) -> Value {
    let grade = match &job.text {
        Text::Completion(c) => grade_completion(sandbox, &job.problem, c, options),
        Text::Code(c) => grade_code(sandbox, &job.problem, c, options),
    };
    let reward = reward_of(&grade, options, sandbox);
    json!({
        "line": line,
        "id": job.id,
        "reward": reward.value,
        "verdict": grade.verdict,
        "passed": grade.passed,
        "total": grade.total,
        "wall_ms": grade.wall_ms,
        "provenance": reward.provenance,
    })
}

fn error_line(line: usize, message: &str, sandbox: &Sandbox) -> Value {
    let mut provenance = Provenance {
        verifier: "lcb".into(),
        verifier_version: areal_reward_code::verifier_version(sandbox),
        ..Provenance::default()
    };
    provenance.details.insert("message".into(), message.into());
    json!({
        "line": line,
        "id": null,
        "reward": 0.0,
        "verdict": Verdict::Error,
        "passed": 0,
        "total": 0,
        "wall_ms": 0.0,
        "provenance": provenance,
    })
}
