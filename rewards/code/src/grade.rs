//! Grading one program against a problem's tests, one fresh sandbox per test.

use std::time::{Duration, Instant};

use areal_sandbox::{Limits, Mode, Outcome, Run, RunReport, Sandbox, SandboxError};
use areal_sdk::Verdict;
use serde::{Deserialize, Serialize};

use crate::compare::{PyValue, parse_python_json, stdout_matches};
use crate::record::{Problem, TestKind, extract_code};

const HARNESS: &str = include_str!("harness.py");

/// What a grading sandbox is pre-initialised with: the harness, the prelude imported.
pub(crate) fn harness_source() -> String {
    format!(
        "PRELUDE = {}\n{HARNESS}",
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

/// Limits and scoring of a grading.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GradeOptions {
    /// Which sandbox grades: `fast` (CPU time limits) or `deterministic` (fuel, fixed clock
    /// and random source). Grading follows the sandbox it is given; this picks the shared one.
    pub mode: Mode,
    /// LiveCodeBench's time limit per test, for native CPython (seconds).
    pub timeout_s: f64,
    /// Factor applied to `timeout_s` for the WASI interpreter, which runs CPU-bound Python
    /// ~3–4× slower than native (recorded in every provenance).
    pub time_scale: f64,
    /// Linear memory per test, in MiB.
    pub memory_mb: usize,
    /// Stdout per test, in bytes; more is `output_limit`.
    pub output_bytes: usize,
    /// Reward = fraction of tests passed instead of 1 iff accepted.
    pub partial_credit: bool,
    /// Deterministic mode's fuel budget per test (replaces the time limit there).
    pub fuel: u64,
}

impl Default for GradeOptions {
    fn default() -> Self {
        Self {
            mode: Mode::Fast,
            timeout_s: 6.0,
            time_scale: 3.0,
            memory_mb: 1024,
            output_bytes: 16 << 20,
            partial_credit: false,
            fuel: 40_000_000_000,
        }
    }
}

impl GradeOptions {
    /// The CPU limit of one test in the sandbox.
    pub fn cpu_limit(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s * self.time_scale)
    }

    /// The sandbox limits of one test.
    pub fn limits(&self) -> Limits {
        let cpu = self.cpu_limit();
        Limits {
            cpu,
            // Room for start-up and a busy machine; a sleeping guest is stopped here.
            wall: cpu + cpu / 2 + Duration::from_secs(1),
            memory_bytes: self.memory_mb << 20,
            stdout_bytes: self.output_bytes,
            stderr_bytes: 64 << 10,
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
    /// Of which the program itself (compile included), as the guest measured it: the rest is
    /// start-up (instantiating the snapshot, reading the job). `None` when the program never
    /// ran to its end or drowned the measurement in stderr.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec_ms: Option<f64>,
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

    /// Fuel spent over all runs (deterministic mode).
    pub fn fuel(&self) -> Option<u64> {
        if self.runs.is_empty() {
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
    };
    for (i, test) in problem.tests.iter().enumerate() {
        let mut limits = options.limits();
        let mut cut_short = false;
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                grade.verdict = Verdict::Error;
                grade.failed_test = Some(i);
                grade.message = Some(format!(
                    "the verification deadline passed after {i} of {total} tests"
                ));
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
            &test.input,
            limits,
        );
        let (verdict, message, report) = match run {
            Ok(report) if cut_short && report.outcome == Outcome::TimeLimit => (
                Verdict::Error,
                Some(format!("the verification deadline passed during test {i}")),
                Some((report, None)),
            ),
            Ok(mut report) => {
                let exec_ns = take_exec_mark(&mut report.stderr);
                let (verdict, message) = judge(&report, test.kind, &test.output);
                (verdict, message, Some((report, exec_ns)))
            }
            Err(e) => (Verdict::Error, Some(e.to_string()), None),
        };
        grade.runs.push(TestRun {
            verdict,
            wall_ms: report.as_ref().map_or(0.0, |(r, _)| ms(r.wall)),
            instantiate_ms: report.as_ref().map_or(0.0, |(r, _)| ms(r.startup)),
            exec_ms: report
                .as_ref()
                .and_then(|(_, ns)| ns.map(|ns| ns as f64 / 1e6)),
            fuel: report.as_ref().and_then(|(r, _)| r.fuel),
        });
        if verdict != Verdict::Accepted {
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

/// Remove the harness's timing line from the end of stderr and return its nanoseconds.
fn take_exec_mark(stderr: &mut Vec<u8>) -> Option<u64> {
    let at = stderr
        .windows(EXEC_MARK.len())
        .rposition(|w| w == EXEC_MARK)?;
    let value = std::str::from_utf8(&stderr[at + EXEC_MARK.len()..])
        .ok()?
        .trim()
        .parse()
        .ok();
    stderr.truncate(at);
    value
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn run_test(
    sandbox: &Sandbox,
    kind: TestKind,
    func: Option<&str>,
    code: &str,
    input: &str,
    limits: Limits,
) -> Result<RunReport, SandboxError> {
    let header = serde_json::json!({
        "kind": match kind { TestKind::Stdin => "stdin", TestKind::Functional => "call" },
        "func": func,
        "code": code.len(),
    });
    let mut stdin = serde_json::to_vec(&header).expect("a JSON header");
    stdin.push(b'\n');
    stdin.extend_from_slice(code.as_bytes());
    stdin.extend_from_slice(input.as_bytes());
    let run = Run {
        stdin,
        limits,
        ..Run::default()
    };
    sandbox.run_blocking(&run)
}

/// The verdict of one run; expected outputs are only ever seen here, on the host.
fn judge(report: &RunReport, kind: TestKind, expected: &str) -> (Verdict, Option<String>) {
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
        Outcome::Exited(2) => (
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
            Some(stderr_tail().unwrap_or_else(|| format!("exited with status {code}"))),
        ),
    }
}

fn judge_return(stdout: &[u8], expected: &str) -> (Verdict, Option<String>) {
    let Some(at) = stdout.windows(MARK.len()).rposition(|w| w == MARK) else {
        return (
            Verdict::RuntimeError,
            Some("the program exited before its function returned".into()),
        );
    };
    let encoded = &stdout[at + MARK.len()..];
    let got = serde_json::from_slice::<serde_json::Value>(encoded)
        .map_err(|e| e.to_string())
        .and_then(|v| PyValue::from_guest(&v));
    let want = match parse_python_json(expected) {
        Ok(v) => v,
        Err(e) => {
            return (
                Verdict::Error,
                Some(format!("expected output is not JSON: {e}")),
            );
        }
    };
    match got {
        Ok(got) if got.py_eq(&want) => (Verdict::Accepted, None),
        Ok(_) => (Verdict::WrongAnswer, None),
        Err(e) => (
            Verdict::WrongAnswer,
            Some(format!("unreadable return value: {e}")),
        ),
    }
}
