//! LiveCodeBench grading in the wasm sandbox: real records, real programs, real limits.
//!
//! Needs the WASI interpreter (`make python-wasi`); `make test` builds it first.

mod guest_python;
mod hostile;
mod program;
mod second_pass;

use std::path::PathBuf;
use std::sync::Arc;

use areal_reward_code::{
    GradeOptions, Problem, TestCase, TestKind, grade_code, grade_completion, reward_of,
    shared_sandbox,
};
use areal_sandbox::{Mode, Pool, Sandbox};
use areal_sdk::Verdict;
use serde_json::{Value, json};

pub(crate) fn sandbox() -> Arc<Sandbox> {
    shared_sandbox(Mode::Fast).expect("the WASI interpreter: run `make python-wasi`")
}

/// Short limits so that hostile programs end quickly.
pub(crate) fn quick() -> GradeOptions {
    GradeOptions {
        timeout_s: 1.0,
        time_scale: 1.5,
        memory_mb: 256,
        output_bytes: 1 << 20,
        ..GradeOptions::default()
    }
}

/// Copied from `shared/data/lcb/`: the official record, and 46 public-test records (23 in
/// `lcb_reference.jsonl`, the bench's set, 23 more in `lcb_agreement.jsonl`), each with a
/// reference solution written here (`code`), in `areal grade code`'s input format.
fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn official_record() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(fixture("lcb_official_record_1873A.json")).unwrap(),
    )
    .unwrap()
}

fn reference_records() -> Vec<Value> {
    ["lcb_reference.jsonl", "lcb_agreement.jsonl"]
        .iter()
        .flat_map(|name| {
            std::fs::read_to_string(fixture(name))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<Value>>()
        })
        .collect()
}

fn record(id: &str) -> Value {
    reference_records()
        .into_iter()
        .find(|r| r["question_id"] == id)
        .unwrap_or_else(|| panic!("no record {id}"))
}

pub(crate) fn stdin_problem(tests: &[(&str, &str)]) -> Problem {
    problem(TestKind::Stdin, None, tests)
}

pub(crate) fn call_problem(func: &str, tests: &[(&str, &str)]) -> Problem {
    problem(TestKind::Functional, Some(func), tests)
}

fn problem(kind: TestKind, func_name: Option<&str>, tests: &[(&str, &str)]) -> Problem {
    Problem {
        id: None,
        tests: tests
            .iter()
            .map(|(i, o)| TestCase {
                input: (*i).into(),
                output: (*o).into(),
                kind,
            })
            .collect(),
        func_name: func_name.map(str::to_owned),
    }
}

const SOLVE_1873A: &str = r#"
t = int(input())
for _ in range(t):
    s = input().strip()
    diff = sum(1 for a, b in zip(s, "abc") if a != b)
    print("YES" if diff in (0, 2) else "NO")
"#;

#[test]
fn the_official_record_decodes_and_grades() {
    let record = official_record();
    let problem = Problem::from_record(&record).unwrap();
    let public = 1;
    assert!(problem.tests.len() > public, "private tests decoded");
    assert!(problem.tests.iter().all(|t| t.kind == TestKind::Stdin));
    let sb = sandbox();
    let grade = grade_code(&sb, &problem, SOLVE_1873A, &quick());
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
    assert_eq!(grade.passed, problem.tests.len());

    // Hard-coding the public answer passes the public test and fails the private ones.
    let public_output = problem.tests[0].output.clone();
    let cheat = format!("print({public_output:?}, end='')");
    let grade = grade_code(&sb, &problem, &cheat, &quick());
    assert_eq!(grade.verdict, Verdict::WrongAnswer);
    assert_eq!((grade.passed, grade.failed_test), (1, Some(1)));

    let reward = reward_of(&grade, &quick(), &sb);
    assert_eq!(reward.value, 0.0);
    assert_eq!(reward.provenance.verifier, "lcb");
    assert!(
        reward
            .provenance
            .verifier_version
            .contains(sb.guest_sha256())
    );
    assert_eq!(reward.provenance.limits["time_scale"], json!(1.5));
    assert_eq!(reward.provenance.details["passed"], json!(1));
    let partial = GradeOptions {
        partial_credit: true,
        ..quick()
    };
    assert_eq!(
        reward_of(&grade, &partial, &sb).value,
        1.0 / problem.tests.len() as f64
    );
}

#[test]
fn records_with_bad_fields_are_rejected_by_name() {
    let mut r = official_record();
    r["private_test_cases"] = json!("gASVBQAAAAAAAACMAXiULg==x");
    let err = Problem::from_record(&r).unwrap_err();
    assert_eq!(err.field, "private_test_cases");
    // pickle.dumps of an object whose __reduce__ calls os.system("echo pwned"), compressed
    // as LiveCodeBench compresses: refused before anything is built.
    r["private_test_cases"] =
        json!("eJxrYJmqygABPawF+cWZFVN62Iori0tSc6dMntLDlZqcka9QUJ6XmjKldUrQFD0AXoEQvQ==");
    let err = Problem::from_record(&r).unwrap_err();
    assert_eq!(err.field, "private_test_cases");
    assert!(err.message.contains("pickle"), "{err}");
    let mut r = record("lcb-007");
    r["metadata"] = json!("{}");
    let err = Problem::from_record(&r).unwrap_err();
    assert_eq!(err.field, "metadata");
}

/// The lower bounds of the options are honest: a program that does little still passes at
/// each of them.
#[test]
fn the_least_limits_still_grade_an_honest_program() {
    use areal_reward_code::bounds;
    let problem = stdin_problem(&[("1 2\n", "3\n")]);
    let code = "a, b = map(int, input().split())\nprint(a + b)";
    let least = GradeOptions {
        memory_mb: bounds::MIN_MEMORY_MB,
        output_bytes: bounds::MIN_OUTPUT_BYTES,
        ..quick()
    };
    assert!(least.check().is_empty());
    let grade = grade_code(&sandbox(), &problem, code, &least);
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
    let deterministic = GradeOptions {
        mode: Mode::Deterministic,
        fuel: bounds::MIN_FUEL,
        ..least
    };
    let sb = shared_sandbox(Mode::Deterministic).unwrap();
    let grade = grade_code(&sb, &problem, code, &deterministic);
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
}

#[test]
fn zero_tests_is_an_error_never_a_pass() {
    let problem = stdin_problem(&[]);
    let grade = grade_code(&sandbox(), &problem, "print(1)", &quick());
    assert_eq!(grade.verdict, Verdict::Error);
    assert_eq!(reward_of(&grade, &quick(), &sandbox()).value, 0.0);
}

/// What the hostile pass found a program could game, each a regression test: a wrapped
/// decimal exponent, a depth limit that failed correct answers, and a quadratic comparison.
#[test]
fn rewards_a_program_cannot_game() {
    let sb = sandbox();
    // A decimal exponent once wrapped in i64, making these two "equal".
    let tiny = stdin_problem(&[("\n", "0.1e-9223372036854775807\n")]);
    let grade = grade_code(&sb, &tiny, "print('10e9223372036854775807')", &quick());
    assert_eq!(grade.verdict, Verdict::WrongAnswer, "{grade:?}");
    let grade = grade_code(&sb, &tiny, "print('0.1e-9223372036854775807')", &quick());
    assert_eq!(
        grade.verdict,
        Verdict::Accepted,
        "equal lines match as text"
    );

    // Nested return values: right at 150 and 10 000 levels, wrong one level off.
    let nest = "def nest(n):\n    v = 1\n    for _ in range(n):\n        v = [v]\n    return v";
    for depth in [150usize, 10_000] {
        let want = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let problem = call_problem("nest", &[(&depth.to_string(), &want)]);
        let grade = grade_code(&sb, &problem, nest, &quick());
        assert_eq!(grade.verdict, Verdict::Accepted, "depth {depth}: {grade:?}");
        let off = call_problem("nest", &[(&(depth + 1).to_string(), &want)]);
        let grade = grade_code(&sb, &off, nest, &quick());
        assert_eq!(grade.verdict, Verdict::WrongAnswer, "depth {depth} + 1");
    }

    // A dict of 100 000 keys, expected in the opposite order (once 108 s, quadratic).
    let n = 100_000;
    let want: Vec<String> = (0..n).rev().map(|i| format!("\"{i}\": {i}")).collect();
    let want = format!("{{{}}}", want.join(", "));
    let problem = call_problem("table", &[(&n.to_string(), &want)]);
    let code = "def table(n):\n    return {str(i): i for i in range(n)}";
    let roomy = GradeOptions {
        output_bytes: 16 << 20,
        ..quick()
    };
    let grade = grade_code(&sb, &problem, code, &roomy);
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
    let wrong =
        "def table(n):\n    d = {str(i): i for i in range(n)}\n    d['7'] = 8\n    return d";
    let grade = grade_code(&sb, &problem, wrong, &roomy);
    assert_eq!(grade.verdict, Verdict::WrongAnswer);
}

#[test]
fn code_comes_from_the_last_fenced_block() {
    let problem = stdin_problem(&[("1 2\n", "3\n")]);
    let sb = sandbox();
    let completion = "First try:\n```python\nprint(0)\n```\nBetter:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\n";
    let grade = grade_completion(&sb, &problem, completion, &quick());
    assert_eq!(grade.verdict, Verdict::Accepted);
    let grade = grade_completion(&sb, &problem, "print(3)", &quick());
    assert_eq!(grade.verdict, Verdict::NoCode);
}

#[test]
fn stdin_programs_see_the_prelude_main_block_and_real_stdin() {
    let problem = stdin_problem(&[("3\n1 2 3\n", "6\n"), ("2\n10 -4\n", "6\n")]);
    let sb = sandbox();
    for code in [
        // `if __name__ == "__main__"` runs; prelude names (`List`, `accumulate`) are there.
        "def main():\n    n = int(input())\n    xs: List[int] = list(map(int, input().split()))\n    print(list(accumulate(xs))[-1])\nif __name__ == '__main__':\n    main()",
        // open(0), sys.stdin.buffer and os.read all read the test input.
        "print(sum(map(int, open(0).read().split()[1:])))",
        "import sys\ndata = sys.stdin.buffer.read().split()\nprint(sum(map(int, data[1:])))",
        "import os\nprint(sum(map(int, os.read(0, 1 << 20).split()[1:])))",
        // SystemExit is swallowed and what was printed is graded.
        "import sys\nn = int(input())\nprint(sum(map(int, input().split())))\nsys.exit(0)",
        "n = int(input())\nprint(sum(map(int, input().split())))\nexit()",
    ] {
        let grade = grade_code(&sb, &problem, code, &quick());
        assert_eq!(grade.verdict, Verdict::Accepted, "{code}\n{grade:?}");
    }
    // LCB's comparison: decimals compare exactly, whitespace around lines does not matter.
    let problem = stdin_problem(&[("", "0.50 1\nYes\n")]);
    let grade = grade_code(
        &sb,
        &problem,
        "print('  0.5 1.0 ')\nprint('Yes')\nprint()",
        &quick(),
    );
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
    let grade = grade_code(
        &sb,
        &problem,
        "print('0.5000001 1')\nprint('Yes')",
        &quick(),
    );
    assert_eq!(grade.verdict, Verdict::WrongAnswer);
}

#[test]
fn functional_problems_compare_return_values_like_python() {
    let sb = sandbox();
    let problem = call_problem("f", &[("[1, 2]\n3", "[1, 2, 3]"), ("[]\n0", "[0]")]);
    let cases = [
        ("def f(xs, x):\n    return xs + [x]", Verdict::Accepted),
        // A returned tuple compares as a list (top level), as in LiveCodeBench.
        (
            "def f(xs, x):\n    return tuple(xs + [x])",
            Verdict::Accepted,
        ),
        // 1.0 == 1 and True == 1.
        (
            "def f(xs, x):\n    return [float(v) for v in xs + [x]]",
            Verdict::Accepted,
        ),
        (
            "def f(xs, x):\n    return [tuple(xs + [x])]",
            Verdict::WrongAnswer,
        ),
        (
            "def f(xs, x):\n    print('noise')\n    return xs + [x]",
            Verdict::Accepted,
        ),
        ("def f(xs, x):\n    return None", Verdict::WrongAnswer),
        ("def g(xs, x):\n    return xs", Verdict::RuntimeError),
        ("def f(xs, x):\n    return xs[5]", Verdict::RuntimeError),
    ];
    for (code, want) in cases {
        let grade = grade_code(&sb, &problem, code, &quick());
        assert_eq!(grade.verdict, want, "{code}\n{grade:?}");
    }
    // class Solution is instantiated and its method called; starter code's `List` works.
    let problem = call_problem("twoSum", &[("[2, 7, 11]\n9", "[0, 1]")]);
    let code = "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        seen = {}\n        for i, v in enumerate(nums):\n            if target - v in seen:\n                return [seen[target - v], i]\n            seen[v] = i";
    assert_eq!(
        grade_code(&sb, &problem, code, &quick()).verdict,
        Verdict::Accepted
    );
    // Big integers, dicts, strings, floats: exact.
    let problem = call_problem(
        "g",
        &[(
            "30",
            "{\"a\": 1073741824, \"s\": \"\\u00e9\", \"big\": 1000000000000000000000000000000}",
        )],
    );
    let code = "def g(n):\n    return {'s': 'é', 'a': 2 ** n, 'big': 10 ** n}";
    assert_eq!(
        grade_code(&sb, &problem, code, &quick()).verdict,
        Verdict::Accepted
    );
    // Exact numbers compare by value, as Python's == does: Fraction(3, 2) == 1.5 ==
    // Decimal("1.5"); a Fraction of a tenth is not the float 0.1.
    let problem = call_problem("half", &[("3", "1.5"), ("4", "2")]);
    for (code, want) in [
        (
            "from fractions import Fraction\ndef half(n):\n    return Fraction(n, 2)",
            Verdict::Accepted,
        ),
        (
            "from decimal import Decimal\ndef half(n):\n    return [Decimal(n) / 2][0]",
            Verdict::Accepted,
        ),
        (
            "from fractions import Fraction\ndef half(n):\n    return Fraction(n, 3)",
            Verdict::WrongAnswer,
        ),
    ] {
        let grade = grade_code(&sb, &problem, code, &quick());
        assert_eq!(grade.verdict, want, "{code}\n{grade:?}");
    }
    let problem = call_problem("tenth", &[("1", "0.1")]);
    let code = "from fractions import Fraction\ndef tenth(n):\n    return Fraction(n, 10)";
    assert_eq!(
        grade_code(&sb, &problem, code, &quick()).verdict,
        Verdict::WrongAnswer
    );
}

/// A package the guest does not have: a program importing it is a runtime error whose message
/// names the module and says what the guest has.
#[test]
fn a_missing_module_is_named_with_the_reason() {
    let sb = sandbox();
    let problem = stdin_problem(&[("3\n", "6\n")]);
    let grade = grade_code(
        &sb,
        &problem,
        "import pandas as pd\nprint(pd.Series([int(input())]).sum() * 2)",
        &quick(),
    );
    assert_eq!(grade.verdict, Verdict::RuntimeError);
    let message = grade.message.unwrap();
    assert!(
        message.contains("No module named 'pandas'")
            && message.contains("the standard library, numpy, sympy and mpmath"),
        "{message}"
    );
}

#[test]
fn real_functional_record_grades() {
    let problem = Problem::from_record(&record("lcb-007")).unwrap();
    assert_eq!(problem.func_name.as_deref(), Some("finalPositionOfSnake"));
    let code = "class Solution:\n    def finalPositionOfSnake(self, n: int, commands: List[str]) -> int:\n        r = c = 0\n        for cmd in commands:\n            if cmd == 'UP': r -= 1\n            elif cmd == 'DOWN': r += 1\n            elif cmd == 'LEFT': c -= 1\n            else: c += 1\n        return r * n + c";
    let grade = grade_code(&sandbox(), &problem, code, &quick());
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
    assert_eq!(grade.passed, problem.tests.len());
}

#[test]
fn deep_recursion_survives() {
    // Python-to-Python calls keep their frames on the heap: 49 000 deep, just under the
    // prelude's recursion limit of 50 000. Memoised recursion goes through functools' C wrapper and the C
    // stack (64 MiB here; the PyPI WASI build's 512 KiB traps at ~100): 10 000 deep works, as
    // it does natively (natively 50 000 segfaults; here it is a runtime error).
    let plain = "def s(n):\n    return 0 if n == 0 else n + s(n - 1)\nprint(s(int(input())))";
    let memo = format!("from functools import lru_cache\n@lru_cache(None)\n{plain}");
    let memo = memo.replacen("print(s(int(input())))", "", 1) + "print(s(int(input())))";
    let options = GradeOptions {
        timeout_s: 10.0,
        time_scale: 1.0,
        ..quick()
    };
    let sb = sandbox();
    let deep = stdin_problem(&[("49000\n", "1200524500\n")]);
    let grade = grade_code(&sb, &deep, plain, &options);
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
    let memo_10k = stdin_problem(&[("10000\n", "50005000\n")]);
    let grade = grade_code(&sb, &memo_10k, &memo, &options);
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
    let grade = grade_code(&sb, &deep, &memo, &options);
    assert_eq!(grade.verdict, Verdict::RuntimeError, "{grade:?}");
}

#[test]
fn the_32_bit_guest_is_patched_where_verdicts_would_differ() {
    let sb = sandbox();
    // sys.maxsize as "infinity" must stay above sums of real values, as on 64-bit CPython.
    let problem = stdin_problem(&[("3000000000\n", "3000000000\n")]);
    let code = "import sys\nbest = sys.maxsize\nbest = min(best, int(input()))\nprint(best)";
    assert_eq!(
        grade_code(&sb, &problem, code, &quick()).verdict,
        Verdict::Accepted
    );
    let problem = stdin_problem(&[("", "9223372036854775807\n")]);
    let code = "import sys\nprint(sys.maxsize)";
    assert_eq!(
        grade_code(&sb, &problem, code, &quick()).verdict,
        Verdict::Accepted
    );
    // The deep-recursion idiom: a big thread stack and main() in a thread.
    let problem = stdin_problem(&[("20000\n", "200010000\n")]);
    let code = "import sys, threading\nsys.setrecursionlimit(1 << 25)\nthreading.stack_size(1 << 27)\ndef s(n):\n    return 0 if n == 0 else n + s(n - 1)\ndef main():\n    print(s(int(input())))\nthreading.Thread(target=main).start()";
    let grade = grade_code(&sb, &problem, code, &quick());
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
}

#[test]
fn deterministic_mode_gives_identical_verdicts_and_fuel() {
    let sb = shared_sandbox(Mode::Deterministic).unwrap();
    let options = GradeOptions {
        mode: Mode::Deterministic,
        fuel: 2_000_000_000,
        ..quick()
    };
    let problem = stdin_problem(&[("1 2\n", "3\n"), ("5 7\n", "12\n")]);
    let programs = [
        // hashing, random, time and set order: all fixed in this mode
        (
            "a, b = map(int, input().split())\nimport random, time\nrandom.random(); time.time()\nprint(a + b)",
            Verdict::Accepted,
        ),
        (
            "print(hash('areal'), list({str(i) for i in range(20)}))",
            Verdict::WrongAnswer,
        ),
        (
            "import random\nprint(random.randint(0, 10**9))",
            Verdict::WrongAnswer,
        ),
        ("while True:\n    pass", Verdict::TimeLimit),
        ("x = 1 / 0", Verdict::RuntimeError),
    ];
    let mut first: Vec<(Verdict, Option<u64>, usize)> = Vec::new();
    for round in 0..20 {
        for (i, (code, want)) in programs.iter().enumerate() {
            let grade = grade_code(&sb, &problem, code, &options);
            assert_eq!(grade.verdict, *want, "{code}\n{grade:?}");
            let fuel = grade.fuel();
            assert!(fuel.is_some_and(|f| f > 0));
            let seen = (grade.verdict, fuel, grade.passed);
            if round == 0 {
                first.push(seen);
            } else {
                assert_eq!(seen, first[i], "round {round} differs for {code}");
            }
        }
    }
    // What the guest sees is fixed too: hashes, set order, random numbers, the clock.
    let code = "import random, time, os, numpy\nprint(hash('areal'), list({str(i) for i in range(20)}), random.random(), numpy.random.randint(2**62), os.urandom(4).hex(), time.time(), time.monotonic())";
    let mut stdin = format!("{{\"kind\": \"stdin\", \"code\": {}}}\n", code.len()).into_bytes();
    stdin.extend_from_slice(code.as_bytes());
    let probe = areal_sandbox::Run {
        stdin,
        limits: options.limits(),
        ..areal_sandbox::Run::default()
    };
    let runs: Vec<_> = (0..20).map(|_| sb.run_blocking(&probe).unwrap()).collect();
    assert!(
        runs.iter()
            .all(|r| r.stdout == runs[0].stdout && r.fuel == runs[0].fuel)
    );
    assert!(!runs[0].stdout.is_empty());
    // The budget is the limit: the infinite loop spent exactly its fuel (per test).
    assert_eq!(first[3].1, Some(options.fuel));
    let reward = reward_of(
        &grade_code(&sb, &problem, programs[0].0, &options),
        &options,
        &sb,
    );
    assert_eq!(reward.provenance.limits["mode"], json!("deterministic"));
    assert_eq!(reward.provenance.limits["fuel"], json!(2_000_000_000u64));
    assert!(reward.provenance.fuel.is_some());
}

#[test]
fn reference_solutions_are_accepted_and_misplaced_ones_are_not() {
    let records = reference_records();
    assert!(records.len() >= 40);
    let kinds: Vec<bool> = records
        .iter()
        .map(|r| Problem::from_record(r).unwrap().func_name.is_some())
        .collect();
    assert!(
        kinds.iter().filter(|f| **f).count() >= 8,
        "functional problems"
    );
    assert!(kinds.iter().filter(|f| !**f).count() >= 8, "stdin problems");
    let pool = Pool::new(sandbox(), 2);
    let n = records.len();
    // Each problem with its own solution, then with the next problem's.
    let jobs: Vec<(Value, String, bool)> = (0..n)
        .map(|i| {
            (
                records[i].clone(),
                records[i]["code"].as_str().unwrap().to_owned(),
                true,
            )
        })
        .chain((0..n).map(|i| {
            let other = records[(i + 1) % n]["code"].as_str().unwrap().to_owned();
            (records[i].clone(), other, false)
        }))
        .collect();
    let grades = pool.map(jobs.clone(), |sb, (record, code, _)| {
        grade_code(sb, &Problem::from_record(&record).unwrap(), &code, &quick())
    });
    for ((record, _, own), grade) in jobs.iter().zip(grades) {
        let grade = grade.unwrap();
        let id = &record["question_id"];
        if *own {
            assert_eq!(grade.verdict, Verdict::Accepted, "{id}: {grade:?}");
            assert_eq!(grade.passed, grade.total);
        } else {
            assert_ne!(
                grade.verdict,
                Verdict::Accepted,
                "{id} accepted another's code"
            );
        }
    }
}

#[test]
fn the_plain_interpreter_runs_python_with_arguments() {
    // Without pre-initialisation the sandbox runs python.wasm as a command, `python -c ...`,
    // with the same limits.
    let sb = Sandbox::new(&areal_sandbox::Settings::default()).unwrap();
    let run = |code: &str| {
        sb.run_blocking(&areal_sandbox::Run {
            args: vec!["-c".into(), code.into()],
            stdin: b"41\n".to_vec(),
            limits: areal_sandbox::Limits {
                cpu: std::time::Duration::from_secs(1),
                wall: std::time::Duration::from_secs(2),
                ..areal_sandbox::Limits::default()
            },
            ..areal_sandbox::Run::default()
        })
        .unwrap()
    };
    let report = run("import sys; print(int(input()) + 1, sys.argv)");
    assert_eq!(report.outcome, areal_sandbox::Outcome::Exited(0));
    assert_eq!(String::from_utf8_lossy(&report.stdout), "42 ['-c']\n");
    assert_eq!(
        run("raise SystemExit(7)").outcome,
        areal_sandbox::Outcome::Exited(7)
    );
    assert_eq!(
        run("while True: pass").outcome,
        areal_sandbox::Outcome::TimeLimit
    );
}

#[test]
fn the_lcb_plugin_builds_from_config_and_grades_a_sample() {
    use areal_sdk::registry::RewardPlugin;
    use areal_sdk::{BuildContext, PluginConfig, RewardInput, VerifyContext};
    let ctx = BuildContext::new(1, 1);
    let build = |cfg: PluginConfig| RewardPlugin::build_from(&cfg, &ctx);
    let error = |cfg: PluginConfig| build(cfg).err().expect("a config error").to_string();
    let err = error(PluginConfig::new("reward", "lcb").with("timeout_s", -1.0));
    assert!(err.contains("reward.timeout_s"), "{err}");
    let err = error(PluginConfig::new("reward", "lcb").with("timeout", 2.0));
    assert!(err.contains("timeout"), "{err}");
    let err = error(PluginConfig::new("reward", "lcb").with("mode", "quick"));
    assert!(err.contains("reward.mode"), "{err}");
    // Values that once panicked, wrapped or were taken without a word: each is named.
    for (key, value, shown) in [
        ("timeout_s", json!(1e300), "1e300"),
        ("time_scale", json!(1e300), "1e300"),
        ("memory_mb", json!(17_592_186_044_416u64), "17592186044416"),
        ("memory_mb", json!(0), "0 MiB"),
        ("output_bytes", json!(0), "0 bytes"),
        ("fuel", json!(0), "0 is below"),
        ("max_tests_mb", json!(0), "0 MiB"),
    ] {
        let err = error(PluginConfig::new("reward", "lcb").with(key, value.clone()));
        assert!(
            err.contains(&format!("reward.{key}")) && err.contains(shown),
            "{key} = {value}: {err}"
        );
    }

    let verifier = build(PluginConfig::new("reward", "lcb").with("timeout_s", 1.0)).unwrap();
    let input = RewardInput {
        metadata: Default::default(),
        sample_id: 1,
        item_id: "1873_A".into(),
        prompt: String::new(),
        completion: format!("```python\n{SOLVE_1873A}\n```"),
        completion_ids: Vec::new(),
        finish_reason: areal_sdk::FinishReason::Stop,
        reference: official_record(),
    };
    let reward = verifier
        .verify(
            &input,
            &VerifyContext::with_timeout(std::time::Duration::from_secs(30)),
        )
        .unwrap();
    assert_eq!((reward.value, reward.verdict), (1.0, Verdict::Accepted));
    assert_eq!(reward.provenance.limits["cpu_s"], json!(4.0));
    // The engine's deadline bounds the grading: a program that would run for its full 24 s
    // CPU limit is stopped at the deadline. That is the program's time_limit, never the
    // grader's `error`: training drops errors without penalty, so a policy that learned to
    // loop forever would escape every penalty.
    let default = build(PluginConfig::new("reward", "lcb")).unwrap();
    let slow = RewardInput {
        completion: "```python\nwhile True:\n    pass\n```".into(),
        ..input.clone()
    };
    let started = std::time::Instant::now();
    let reward = default
        .verify(
            &slow,
            &VerifyContext::with_timeout(std::time::Duration::from_secs(1)),
        )
        .unwrap();
    assert_eq!(
        (reward.value, reward.verdict),
        (0.0, Verdict::TimeLimit),
        "{reward:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // A reference that is not a record is the task's fault: an error, not a wrong answer.
    let bad = RewardInput {
        reference: json!({"answer": 3}),
        ..input
    };
    assert!(
        verifier
            .verify(
                &bad,
                &VerifyContext::with_timeout(std::time::Duration::from_secs(5))
            )
            .is_err()
    );
}

/// The `lcb` reward as the engine builds and calls it passes the verifier conformance checks:
/// a right program is 1, a wrong one 0 (a reward, not an error), repeatable, with provenance,
/// and a deadline already past stops it.
#[test]
fn the_lcb_reward_conforms() {
    use areal_sdk::{BuildContext, FinishReason, PluginConfig, RewardInput, RewardPlugin};
    let verifier = RewardPlugin::build_from(
        &PluginConfig::new("reward", "lcb"),
        &BuildContext::new(1, 1),
    )
    .expect("the lcb reward builds");
    let rec = reference_records().into_iter().next().expect("a record");
    let code = rec["code"]
        .as_str()
        .expect("a reference solution")
        .to_owned();
    let input = |id: u64, program: &str| RewardInput {
        metadata: Default::default(),
        sample_id: id,
        item_id: format!("lcb-{id}"),
        prompt: rec["question_content"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        completion: format!("Here is my solution.\n```python\n{program}\n```\n"),
        completion_ids: Vec::new(),
        finish_reason: FinishReason::Stop,
        reference: rec.clone(),
    };
    areal_testkit::conformance::check_verifier(
        verifier,
        &[(input(1, &code), 1.0), (input(2, "print(0)"), 0.0)],
    );
}
