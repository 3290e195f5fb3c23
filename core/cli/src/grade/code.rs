//! `areal grade code`: grade LiveCodeBench records with the wasm sandbox, one JSON line out
//! per line in, in order.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use areal_reward_code::{GradeOptions, Problem, grade_code, grade_completion, reward_of};
use areal_sandbox::{Mode, Pool, Sandbox};
use areal_sdk::{Provenance, Reward, Verdict};
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
    /// Parallel sandboxes (1 to 64): from 2 on, each in a worker process of its own (the
    /// `lcb` reward in `areal serve reward` on loopback, as `reward_service.workers` runs
    /// it), so that they do not slow each other down as threads of one process do; one per
    /// core is the usual choice. 1 grades in this process.
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
    record: Value,
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
        record,
        text,
    })
}

#[allow(clippy::print_stderr, reason = "messages for the user, on stderr")]
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
    let grader = Grader::new(&sandbox, &options, threads)?;
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
    // A record holds its two test fields (each at most --max-tests-mb, decompressed or as
    // written), the code and a few small fields: a longer line is refused unread.
    let max_line = max_tests_bytes
        .saturating_mul(2)
        .saturating_add(super::input::MAX_LINE_BYTES);
    for line in Lines::new(input, max_line) {
        let (line_no, line) = line?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        match line.and_then(|line| parse_line(&line, max_tests_bytes)) {
            Err(message) => {
                let message = format!("line {line_no}: {message}");
                let _ = tx.send(error_line(line_no, &message, &sandbox));
            }
            Ok(job) => grader.submit(line_no, job, &options, tx),
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
        "graded {graded} lines in {:.1} s with {threads} sandbox{} ({}): {}; mean reward {:.3}",
        started.elapsed().as_secs_f64(),
        if threads == 1 { "" } else { "es" },
        if threads == 1 {
            "in process"
        } else {
            "worker processes"
        },
        summary.join(", "),
        if graded > 0 {
            total_reward / graded as f64
        } else {
            0.0
        }
    );
    Ok(())
}

/// Where programs are graded: sandboxes on threads of this process, or the `lcb` reward in
/// worker processes.
enum Grader {
    InProcess(Pool),
    Workers {
        jobs: crossbeam_channel::Sender<(usize, Job, crossbeam_channel::Sender<Value>)>,
        // last: the workers stop once the threads that call them are gone
        _workers: areal_core::reward_workers::RewardWorkers,
    },
}

impl Grader {
    fn new(
        sandbox: &Arc<Sandbox>,
        options: &GradeOptions,
        sandboxes: usize,
    ) -> anyhow::Result<Self> {
        if sandboxes <= 1 {
            return Ok(Self::InProcess(Pool::new(Arc::clone(sandbox), 1)));
        }
        let (verifier, workers) = lcb_workers(sandbox, options, sandboxes)?;
        let (jobs, queue) =
            crossbeam_channel::unbounded::<(usize, Job, crossbeam_channel::Sender<Value>)>();
        for _ in 0..areal_core::reward_workers::CALLS_PER_WORKER * sandboxes {
            let (queue, verifier, sandbox) =
                (queue.clone(), Arc::clone(&verifier), Arc::clone(sandbox));
            std::thread::Builder::new()
                .name("areal-grade".into())
                .spawn(move || {
                    for (line, job, tx) in queue {
                        let _ = tx.send(grade_remote(verifier.as_ref(), line, job, &sandbox));
                    }
                })?;
        }
        Ok(Self::Workers {
            jobs,
            _workers: workers,
        })
    }

    /// Grade `job` (line `line`); its result comes on `tx`.
    fn submit(
        &self,
        line: usize,
        job: Job,
        options: &Arc<GradeOptions>,
        tx: crossbeam_channel::Sender<Value>,
    ) {
        match self {
            Self::InProcess(pool) => {
                let options = Arc::clone(options);
                // The pool's own receiver is dropped: the job answers on `tx`.
                let _ = pool.submit(move |sb| {
                    let _ = tx.send(grade_job(sb, line, job, &options));
                });
            }
            Self::Workers { jobs, .. } => {
                let _ = jobs.send((line, job, tx));
            }
        }
    }
}

/// The `lcb` reward with `options` in `count` worker processes (`reward_service.workers`): the
/// verifier that grades through them, and the workers.
pub fn lcb_workers(
    sandbox: &Arc<Sandbox>,
    options: &GradeOptions,
    count: usize,
) -> anyhow::Result<(
    Arc<dyn areal_sdk::RewardVerifier>,
    areal_core::reward_workers::RewardWorkers,
)> {
    let mut reward = serde_json::to_value(options)?;
    reward["kind"] = areal_reward_code::NAME.into();
    let config = areal_core::Config {
        reward,
        reward_service: areal_core::RewardServiceConfig {
            workers: count,
            ..Default::default()
        },
        ..Default::default()
    };
    let local: Arc<dyn areal_sdk::RewardVerifier> = Arc::new(areal_reward_code::LcbVerifier::new(
        Arc::clone(sandbox),
        options.clone(),
    ));
    areal_core::reward_workers::start(&config, &local, None)?
        .ok_or_else(|| anyhow::anyhow!("no worker was asked for"))
}

/// Grade `job` with the `lcb` reward in the workers: the same verdict and provenance as in
/// process; a program (`code`) is sent as a fenced response.
fn grade_remote(
    verifier: &dyn areal_sdk::RewardVerifier,
    line: usize,
    job: Job,
    sandbox: &Sandbox,
) -> Value {
    let completion = match job.text {
        Text::Completion(c) => c,
        Text::Code(c) if c.lines().any(|l| l.contains("```")) => {
            return error_line(
                line,
                &format!(
                    "line {line}: a `code` with a ``` line cannot be fenced for the workers: grade it with -j 1, or give it as a `completion`"
                ),
                sandbox,
            );
        }
        Text::Code(c) => areal_tasks::code::fence(&c),
    };
    let item_id = job.id.clone().unwrap_or_else(|| format!("line-{line}"));
    match verify_record(verifier, line as u64, item_id, completion, job.record) {
        Ok(reward) => result_line(line, job.id.as_deref(), &reward),
        Err(e) => error_line(
            line,
            &format!("line {line}: {}", areal_core::chain(&e)),
            sandbox,
        ),
    }
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
    result_line(
        line,
        job.id.as_deref(),
        &reward_of(&grade, options, sandbox),
    )
}

/// `completion` graded on the LiveCodeBench `record` by `verifier` (the `lcb` reward in
/// workers), under a deadline of a day: the reward's own limits bound each test.
pub fn verify_record(
    verifier: &dyn areal_sdk::RewardVerifier,
    sample_id: u64,
    item_id: String,
    completion: String,
    record: Value,
) -> Result<Reward, areal_sdk::PluginError> {
    let input = areal_sdk::RewardInput {
        sample_id,
        item_id,
        prompt: String::new(),
        completion,
        completion_ids: Vec::new(),
        finish_reason: areal_sdk::FinishReason::Stop,
        reference: record,
        metadata: Default::default(),
    };
    let ctx = areal_sdk::VerifyContext::with_timeout(std::time::Duration::from_secs(86_400));
    verifier.verify(&input, &ctx)
}

/// The output line of a graded input line: the `lcb` reward's value, verdict, tests passed
/// and total, wall time and provenance (graded here or in a worker, the same).
fn result_line(line: usize, id: Option<&str>, reward: &Reward) -> Value {
    let count = |key: &str| {
        reward
            .provenance
            .details
            .get(key)
            .cloned()
            .unwrap_or(0.into())
    };
    json!({
        "line": line,
        "id": id,
        "reward": reward.value,
        "verdict": reward.verdict,
        "passed": count("passed"),
        "total": count("total"),
        "wall_ms": reward.provenance.wall_ms,
        "provenance": reward.provenance,
    })
}

fn error_line(line: usize, message: &str, sandbox: &Sandbox) -> Value {
    let mut reward = Reward::new(0.0, Verdict::Error);
    reward.provenance = Provenance {
        verifier: "lcb".into(),
        verifier_version: areal_reward_code::verifier_version(sandbox),
        ..Provenance::default()
    };
    reward
        .provenance
        .details
        .insert("message".into(), message.into());
    result_line(line, None, &reward)
}
