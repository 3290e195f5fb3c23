//! Grading one program against a problem's tests, one fresh sandbox per test.

use std::time::{Duration, Instant};

use areal_sandbox::{Limits, Mode, Outcome, Run, RunReport, Sandbox, SandboxError};
use areal_sdk::Verdict;
use serde::{Deserialize, Serialize};

use crate::compare::{parse_guest_value, parse_python_json, stdout_matches};
use crate::record::{Problem, TestKind, extract_code};

const HARNESS: &str = include_str!("harness.py");
/// How the harness compiles a stdin program (Python: `known_names(globals)`,
/// `compile_program(source, filename, known)`, `run_program(program, globals)`): as a
/// function's body where that changes nothing but speed, else as written. Also what
/// `areal bench sandbox`'s native baseline runs programs with.
pub const PROGRAM: &str = include_str!("program.py");

/// What a grading sandbox is pre-initialised with: the harness, the prelude imported.
pub(crate) fn harness_source() -> String {
    format!(
        "PRELUDE = {}\n{PROGRAM}\n{HARNESS}",
        serde_json::to_string(PRELUDE).expect("a JSON string is a Python string literal")
    )
}

/// LiveCodeBench's import prelude, run before every program (`sys.setrecursionlimit(50000)`
/// included), so that starter code using `List` or `accumulate` without imports works.
pub const PRELUDE: &str = "from string import *\nfrom re import *\nfrom datetime import *\n\
from collections import *\nfrom heapq import *\nfrom bisect import *\nfrom copy import *\n\
from math import *\nfrom random import *\nfrom statistics import *\nfrom itertools import *\n\
from functools import *\nfrom operator import *\nfrom io import *\nfrom sys import *\n\
from json import *\nfrom builtins import *\nfrom typing import *\nimport string\nimport re\n\
import datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\nimport math\n\
import random\nimport statistics\nimport itertools\nimport functools\nimport operator\n\
import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n";
const MARK: &[u8] = b"\x1eareal-result\x1e";
const EXEC_MARK: &[u8] = b"\x1eareal-exec-ns=";
/// Before the start mark, a stdin program's compiled code: `<m> function|module\n` and the m
/// bytes of a marshalled code object, at most `COMPILED_MAX`, passed to the program's next
/// tests so that only its first test compiles it (the harness sends none where loading it
/// back would not give exactly the code the text compiles to).
const COMPILED_MARK: &[u8] = b"\x1eareal-compiled=";
const COMPILED_MAX: usize = 16 << 10;
/// The harness writes this (then `function\n` or `module\n`: how the program runs) on
/// stderr just before the program runs, after the compiled code and in the same write: what
/// stderr starts with was written before the program had control, so the program cannot
/// forge it.
const STARTED_MARK: &[u8] = b"\x1eareal-started ";

/// Limits and scoring of a grading.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GradeOptions {
    /// Which sandbox grades: `fast` (CPU time limits) or `deterministic` (fuel, fixed clock
    /// and random source). Grading follows the sandbox it is given; this picks the shared one.
    pub mode: Mode,
    /// LiveCodeBench's time limit per test, for native CPython (seconds).
    pub timeout_s: f64,
    /// Factor applied to `timeout_s` for the WASI interpreter (recorded in every
    /// provenance). By default 4: on the CPU-heavy set of `areal bench sandbox --set heavy`
    /// (LiveCodeBench's private-test sizes) the guest took 0.8–3.5× native CPython's time,
    /// 1.7× in the geometric mean; the slowest are tight loops of fast locals, which is how
    /// LiveCodeBench runs module-level code. 4 leaves room above 3.5, so a program
    /// LiveCodeBench accepts just under its limit is accepted here too (docs/benchmarks.md).
    pub time_scale: f64,
    /// Linear memory per test, in MiB.
    pub memory_mb: usize,
    /// Stdout per test, in bytes; more is `output_limit`.
    pub output_bytes: usize,
    /// Reward = fraction of tests passed instead of 1 iff accepted.
    pub partial_credit: bool,
    /// Deterministic mode's fuel budget per test (replaces the time limit there).
    pub fuel: u64,
    /// The most a record's compressed tests may decompress to, in MiB.
    pub max_tests_mb: usize,
}

impl Default for GradeOptions {
    fn default() -> Self {
        Self {
            mode: Mode::Fast,
            timeout_s: 6.0,
            time_scale: 4.0,
            memory_mb: 1024,
            output_bytes: 16 << 20,
            partial_credit: false,
            fuel: 40_000_000_000,
            max_tests_mb: crate::record::DEFAULT_MAX_TESTS_BYTES >> 20,
        }
    }
}

/// Bounds of [`GradeOptions`], checked by [`GradeOptions::check`].
pub mod bounds {
    /// The longest CPU limit of one test, `timeout_s × time_scale`, in seconds (one hour).
    pub const MAX_CPU_S: f64 = 3600.0;
    /// The largest `time_scale`: the interpreter in wasm is 2–4× slower than native.
    pub const MAX_TIME_SCALE: f64 = 100.0;
    /// The least memory per test, in MiB: the interpreter's snapshot starts at ~90 MiB
    /// (64 MiB of it the C stack).
    pub const MIN_MEMORY_MB: usize = 128;
    /// The most memory per test, in MiB: a wasm32 guest addresses 4 GiB.
    pub const MAX_MEMORY_MB: usize = 4096;
    /// The least stdout per test, in bytes (a call test's encoded return value needs room).
    pub const MIN_OUTPUT_BYTES: usize = 1 << 10;
    /// The most stdout per test, in bytes (1 GiB): it is held in the host's memory.
    pub const MAX_OUTPUT_BYTES: usize = 1 << 30;
    /// The least fuel per test in deterministic mode (a trivial program spends ~1.1 × 10⁶).
    pub const MIN_FUEL: u64 = 10_000_000;
    /// The most a record's tests may decompress to, in MiB.
    pub const MAX_TESTS_MB: usize = 16 << 10;
}

impl GradeOptions {
    /// Check every option against [`bounds`]; each problem as (option, message naming the
    /// value). Callers name the option their own way (`reward.memory_mb`, `--memory-mb`).
    pub fn check(&self) -> Vec<(&'static str, String)> {
        use bounds::*;
        let mut problems = Vec::new();
        let mut check = |ok: bool, key: &'static str, message: String| {
            if !ok {
                problems.push((key, message));
            }
        };
        let timeout_ok = self.timeout_s > 0.0 && self.timeout_s.is_finite();
        let scale_ok = self.time_scale > 0.0 && self.time_scale <= MAX_TIME_SCALE;
        check(
            timeout_ok,
            "timeout_s",
            format!("{:?} is not a positive number of seconds", self.timeout_s),
        );
        check(
            scale_ok,
            "time_scale",
            format!(
                "{:?} is not a factor in (0, {MAX_TIME_SCALE}]",
                self.time_scale
            ),
        );
        if timeout_ok && scale_ok {
            let cpu = self.timeout_s * self.time_scale;
            check(
                cpu <= MAX_CPU_S,
                "timeout_s",
                format!(
                    "{:?} s × time_scale {:?} = {cpu:?} s per test is past the limit of {MAX_CPU_S} s",
                    self.timeout_s, self.time_scale
                ),
            );
        }
        check(
            (MIN_MEMORY_MB..=MAX_MEMORY_MB).contains(&self.memory_mb),
            "memory_mb",
            format!(
                "{} MiB is outside {MIN_MEMORY_MB}..={MAX_MEMORY_MB} (the interpreter needs {MIN_MEMORY_MB}; a wasm32 guest addresses at most 4 GiB)",
                self.memory_mb
            ),
        );
        check(
            (MIN_OUTPUT_BYTES..=MAX_OUTPUT_BYTES).contains(&self.output_bytes),
            "output_bytes",
            format!(
                "{} bytes is outside {MIN_OUTPUT_BYTES}..={MAX_OUTPUT_BYTES}",
                self.output_bytes
            ),
        );
        check(
            self.fuel >= MIN_FUEL,
            "fuel",
            format!(
                "{} is below {MIN_FUEL}: a trivial program spends ~1 100 000 per test",
                self.fuel
            ),
        );
        check(
            (1..=MAX_TESTS_MB).contains(&self.max_tests_mb),
            "max_tests_mb",
            format!("{} MiB is outside 1..={MAX_TESTS_MB}", self.max_tests_mb),
        );
        problems
    }

    /// [`GradeOptions::max_tests_mb`] in bytes.
    pub fn max_tests_bytes(&self) -> usize {
        self.max_tests_mb.saturating_mul(1 << 20)
    }

    /// The CPU limit of one test in the sandbox.
    pub fn cpu_limit(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s * self.time_scale)
    }

    /// The sandbox limits of one test.
    pub fn limits(&self) -> Limits {
        let cpu = self.cpu_limit();
        Limits {
            cpu,
            // The last resort: the CPU limit counts the guest's own time (CPU and sleep), so
            // wall time only has to bound what escapes it, with room for a machine so busy
            // that the guest gets a quarter of a core.
            wall: cpu * 4 + Duration::from_secs(5),
            memory_bytes: self.memory_mb.saturating_mul(1 << 20),
            stdout_bytes: self.output_bytes,
            // The program's 64 KiB, after the compiled code the harness may write first.
            stderr_bytes: (64 << 10) + COMPILED_MAX + 64,
            fuel: self.fuel,
        }
    }
}

/// One test's run, for reports and benchmarks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TestRun {
    /// The test's verdict (`accepted` when it passed).
    pub verdict: Verdict,
    /// Wall time of the run, start-up included (ms).
    pub wall_ms: f64,
    /// Of which instantiation (ms).
    pub instantiate_ms: f64,
    /// Of which the program itself, as the guest reported it: the rest is start-up
    /// (instantiating the snapshot, reading the job, compiling a stdin program). `None` when
    /// the program never ran to its end or drowned the measurement in stderr. A figure for
    /// benchmarks: the program could write a report of its own, so no verdict or reward
    /// reads it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec_ms: Option<f64>,
    /// Whether the program's statements ran as the body of a function (fast locals), which
    /// the harness does to a stdin program where that changes nothing but its speed, or as
    /// written, as a module (`program.py`); from what the harness wrote before the program
    /// ran. `None` when the program never ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_function: Option<bool>,
    /// Fuel spent (deterministic mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
}

/// The verdict on one program.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Grade {
    /// `accepted`, `wrong_answer`, `runtime_error`, `time_limit`, `memory_limit`,
    /// `output_limit`, `no_code` or `error` (the grader failed, not the program).
    pub verdict: Verdict,
    /// Tests passed before the first failure.
    pub passed: usize,
    /// Tests of the problem.
    pub total: usize,
    /// Index of the failing test.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_test: Option<usize>,
    /// Why: the end of the program's traceback, or what went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Every test that ran, in order.
    pub runs: Vec<TestRun>,
    /// Wall time of the whole grading (ms).
    pub wall_ms: f64,
    /// The verification deadline ended the grading: its verdict then depends on wall time,
    /// as no other verdict does (not even a `time_limit` in deterministic mode, which is
    /// fuel's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_deadline: bool,
}

impl Grade {
    fn without_runs(verdict: Verdict, total: usize, message: impl Into<String>) -> Self {
        Self {
            verdict,
            passed: 0,
            total,
            failed_test: None,
            message: Some(message.into()),
            runs: Vec::new(),
            wall_ms: 0.0,
            by_deadline: false,
        }
    }

    /// The reward this grade is worth.
    pub fn reward(&self, options: &GradeOptions) -> f64 {
        if options.partial_credit {
            if self.total == 0 {
                0.0
            } else {
                self.passed as f64 / self.total as f64
            }
        } else if self.verdict == Verdict::Accepted {
            1.0
        } else {
            0.0
        }
    }

    /// Fuel spent over all runs (deterministic mode); `None` also where the verification
    /// deadline decided the verdict (the reward cache keeps a `time_limit` with fuel as
    /// deterministic).
    pub fn fuel(&self) -> Option<u64> {
        if self.runs.is_empty() || self.by_deadline {
            return None;
        }
        self.runs.iter().map(|r| r.fuel).sum()
    }
}

/// Grade a model's whole response: its last fenced code block, or `no_code`.
pub fn grade_completion(
    sandbox: &Sandbox,
    problem: &Problem,
    completion: &str,
    options: &GradeOptions,
) -> Grade {
    grade_completion_before(sandbox, problem, completion, options, None)
}

/// [`grade_completion`] that gives up at `deadline` (the engine's verification deadline):
/// no test starts after it, and a test's wall-time limit ends at it. Giving up is an `error`
/// verdict (the grader's failure, not the program's).
pub fn grade_completion_before(
    sandbox: &Sandbox,
    problem: &Problem,
    completion: &str,
    options: &GradeOptions,
    deadline: Option<Instant>,
) -> Grade {
    match extract_code(completion) {
        Some(code) => grade(sandbox, problem, &code, options, deadline),
        None => Grade::without_runs(
            Verdict::NoCode,
            problem.tests.len(),
            "no fenced code block (fewer than two lines with ```)",
        ),
    }
}

/// Grade `code` on every test of `problem`, stopping at the first failure. Zero tests is an
/// `error`, never a pass.
pub fn grade_code(
    sandbox: &Sandbox,
    problem: &Problem,
    code: &str,
    options: &GradeOptions,
) -> Grade {
    grade(sandbox, problem, code, options, None)
}

fn grade(
    sandbox: &Sandbox,
    problem: &Problem,
    code: &str,
    options: &GradeOptions,
    deadline: Option<Instant>,
) -> Grade {
    let started = Instant::now();
    let total = problem.tests.len();
    if total == 0 {
        return Grade::without_runs(Verdict::Error, 0, "the problem has no tests");
    }
    let mut grade = Grade {
        verdict: Verdict::Accepted,
        passed: 0,
        total,
        failed_test: None,
        message: None,
        runs: Vec::with_capacity(total),
        wall_ms: 0.0,
        by_deadline: false,
    };
    // The program as the harness compiled it in its first stdin test.
    let mut compiled: Option<Compiled> = None;
    for (i, test) in problem.tests.iter().enumerate() {
        let mut limits = options.limits();
        let mut cut_short = false;
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Before any test ran it is the grader's failure; after, the program's own
                // tests took the sample's time (an `error` would let a slow program escape
                // its penalty, as above).
                grade.verdict = if i == 0 {
                    Verdict::Error
                } else {
                    Verdict::TimeLimit
                };
                grade.failed_test = Some(i);
                grade.message = Some(format!(
                    "the verification deadline passed after {i} of {total} tests"
                ));
                grade.by_deadline = true;
                break;
            }
            if left < limits.wall {
                limits.wall = left;
                cut_short = true;
            }
        }
        let run = run_test(
            sandbox,
            test.kind,
            problem.func_name.as_deref(),
            code,
            compiled.as_ref(),
            &test.input,
            limits,
        );
        let (verdict, message, report) = match run {
            // The program was still running when the sample's time ran out: it is the
            // program's slowness, not the grader's failure (an `error` would let a policy
            // escape every penalty by never finishing).
            Ok(report) if cut_short && report.outcome == Outcome::TimeLimit => (
                Verdict::TimeLimit,
                Some(format!(
                    "the verification deadline passed during test {i}, {:.1} s into it",
                    report.wall.as_secs_f64()
                )),
                Some((report, None, None)),
            ),
            Ok(mut report) => {
                if let Some(c) = take_compiled_mark(&mut report.stderr) {
                    compiled.get_or_insert(c);
                }
                let ran_as = take_started_mark(&mut report.stderr);
                let exec = ran_as.and(take_exec_mark(&mut report.stderr));
                let (verdict, message) = judge(&report, ran_as.is_some(), test.kind, &test.output);
                (verdict, message, Some((report, exec, ran_as)))
            }
            Err(e) => (Verdict::Error, Some(e.to_string()), None),
        };
        grade.runs.push(TestRun {
            verdict,
            wall_ms: report.as_ref().map_or(0.0, |(r, ..)| ms(r.wall)),
            instantiate_ms: report.as_ref().map_or(0.0, |(r, ..)| ms(r.startup)),
            exec_ms: report
                .as_ref()
                .and_then(|(_, exec, _)| exec.map(|ns| ns as f64 / 1e6)),
            as_function: report.as_ref().and_then(|(.., ran_as)| *ran_as),
            fuel: report.as_ref().and_then(|(r, ..)| r.fuel),
        });
        if verdict != Verdict::Accepted {
            grade.by_deadline = cut_short && verdict == Verdict::TimeLimit;
            grade.verdict = verdict;
            grade.failed_test = Some(i);
            grade.message = message;
            break;
        }
        grade.passed += 1;
    }
    grade.wall_ms = ms(started.elapsed());
    grade
}

/// A stdin program as the harness compiled it (`COMPILED_MARK`).
struct Compiled {
    code: Vec<u8>,
    as_function: bool,
}

/// Remove the harness's compiled program from the front of stderr and return it.
fn take_compiled_mark(stderr: &mut Vec<u8>) -> Option<Compiled> {
    let rest = stderr.strip_prefix(COMPILED_MARK)?;
    let line_end = rest.iter().position(|&b| b == b'\n')?;
    let (len, how) = std::str::from_utf8(&rest[..line_end])
        .ok()?
        .split_once(' ')?;
    let len: usize = len.parse().ok().filter(|&n| n <= COMPILED_MAX)?;
    let as_function = match how {
        "function" => true,
        "module" => false,
        _ => return None,
    };
    let code = rest.get(line_end + 1..line_end + 1 + len)?.to_vec();
    stderr.drain(..COMPILED_MARK.len() + line_end + 1 + len);
    Some(Compiled { code, as_function })
}

/// Remove the harness's start mark from the front of stderr: `None` when the program never
/// ran, else whether it ran as a function's body (`program.py`).
fn take_started_mark(stderr: &mut Vec<u8>) -> Option<bool> {
    let rest = stderr.strip_prefix(STARTED_MARK)?;
    let (as_function, len) = if rest.starts_with(b"function\n") {
        (true, "function\n".len())
    } else if rest.starts_with(b"module\n") {
        (false, "module\n".len())
    } else {
        return None;
    };
    stderr.drain(..STARTED_MARK.len() + len);
    Some(as_function)
}

/// Remove the harness's timing line from the end of stderr and return the nanoseconds the
/// program ran, as the guest reported them.
fn take_exec_mark(stderr: &mut Vec<u8>) -> Option<u64> {
    let at = stderr
        .windows(EXEC_MARK.len())
        .rposition(|w| w == EXEC_MARK)?;
    let ns = std::str::from_utf8(&stderr[at + EXEC_MARK.len()..])
        .ok()?
        .trim()
        .parse()
        .ok();
    stderr.truncate(at);
    ns
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn run_test(
    sandbox: &Sandbox,
    kind: TestKind,
    func: Option<&str>,
    code: &str,
    compiled: Option<&Compiled>,
    input: &str,
    limits: Limits,
) -> Result<RunReport, SandboxError> {
    let compiled = compiled.filter(|_| kind == TestKind::Stdin);
    let header = serde_json::json!({
        "kind": match kind { TestKind::Stdin => "stdin", TestKind::Functional => "call" },
        "func": func,
        "code": code.len(),
        "compiled": compiled.map_or(0, |c| c.code.len()),
        "as_function": compiled.is_some_and(|c| c.as_function),
    });
    let mut stdin = serde_json::to_vec(&header).expect("a JSON header");
    stdin.push(b'\n');
    stdin.extend_from_slice(code.as_bytes());
    if let Some(c) = compiled {
        stdin.extend_from_slice(&c.code);
    }
    stdin.extend_from_slice(input.as_bytes());
    let run = Run {
        stdin,
        limits,
        ..Run::default()
    };
    sandbox.run_blocking(&run)
}

/// The verdict of one run; expected outputs are only ever seen here, on the host. `ran`: the
/// program started (the harness said so before running it), so every exit status from then
/// on is the program's doing and none is the grader's failure.
fn judge(
    report: &RunReport,
    ran: bool,
    kind: TestKind,
    expected: &str,
) -> (Verdict, Option<String>) {
    let stderr_tail = || {
        let text = String::from_utf8_lossy(&report.stderr);
        let lines: Vec<&str> = text.trim_end().lines().collect();
        let tail = lines[lines.len().saturating_sub(6)..].join("\n");
        (!tail.is_empty()).then_some(tail)
    };
    match &report.outcome {
        Outcome::TimeLimit => (Verdict::TimeLimit, None),
        Outcome::MemoryLimit | Outcome::Exited(3) => (Verdict::MemoryLimit, stderr_tail()),
        Outcome::OutputLimit => (Verdict::OutputLimit, None),
        Outcome::Trapped(why) => (
            Verdict::RuntimeError,
            Some(format!("the interpreter trapped: {why}")),
        ),
        Outcome::Exited(2) if !ran => (
            Verdict::Error,
            Some(format!(
                "the harness was misused: {}",
                stderr_tail().unwrap_or_default()
            )),
        ),
        Outcome::Exited(5) => (Verdict::WrongAnswer, stderr_tail()),
        Outcome::Exited(0) => match kind {
            TestKind::Stdin => {
                let got = String::from_utf8_lossy(&report.stdout);
                if stdout_matches(&got, expected) {
                    (Verdict::Accepted, None)
                } else {
                    (Verdict::WrongAnswer, None)
                }
            }
            TestKind::Functional => judge_return(&report.stdout, expected),
        },
        Outcome::Exited(code) => (
            Verdict::RuntimeError,
            Some(stderr_tail().map_or_else(|| format!("exited with status {code}"), with_hint)),
        ),
    }
}

/// What the guest's Python lacks, said where a traceback shows it missing.
const MISSING_MODULE_HINT: &str = "(the sandbox's CPython 3.11 has the standard library, numpy, sympy and mpmath: other packages are not importable there; docs/sandbox.md)";

fn with_hint(tail: String) -> String {
    if tail.contains("ModuleNotFoundError: No module named") {
        format!("{tail}\n{MISSING_MODULE_HINT}")
    } else {
        tail
    }
}

fn judge_return(stdout: &[u8], expected: &str) -> (Verdict, Option<String>) {
    let Some(at) = stdout.windows(MARK.len()).rposition(|w| w == MARK) else {
        return (
            Verdict::RuntimeError,
            Some("the program exited before its function returned".into()),
        );
    };
    let encoded = stdout[at + MARK.len()..].trim_ascii_end();
    let want = match parse_python_json(expected) {
        Ok(v) => v,
        Err(e) => {
            return (
                Verdict::Error,
                Some(format!("expected output is not JSON: {e}")),
            );
        }
    };
    match parse_guest_value(encoded) {
        Ok(got) if got.py_eq(&want) => (Verdict::Accepted, None),
        Ok(_) => (Verdict::WrongAnswer, None),
        Err(e) => (
            Verdict::WrongAnswer,
            Some(format!("unreadable return value: {e}")),
        ),
    }
}
