//! Issue 32, the second hostile pass: what it found in the grader, each a regression test
//! that failed before the fix. Four of them changed rewards: a correct program graded wrong,
//! and programs that could choose the unpenalised `error` verdict.

use areal_reward_code::{GradeOptions, grade_code, reward_of, shared_sandbox};
use areal_sandbox::Mode;
use areal_sdk::Verdict;
use serde_json::Value;

use crate::{call_problem, quick, sandbox, stdin_problem};

/// Defect 1: a program's later tests ran its code unmarshalled, and unmarshalling rebuilds a
/// frozenset constant by adding its members in the order they iterate, which can reorder
/// them: `for x in {7, 15}` printed `7 15` in the first test and `15 7` in the others (about
/// one program in six of random small-int set literals). Every test must print what native
/// CPython prints, compiling the program as LiveCodeBench does: 120 seeded programs of set,
/// frozenset and dict literals (`scripts/set_literal_cases.py`), three tests each.
#[test]
fn every_test_runs_the_code_livecodebench_runs() {
    let sb = sandbox();
    let example = stdin_problem(&[("1\n", "7\n15\n"), ("2\n", "14\n30\n"), ("3\n", "21\n45\n")]);
    let code = "n = int(input())\nfor x in {7, 15}:\n    print(x * n)\n";
    let grade = grade_code(&sb, &example, code, &quick());
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");

    let fixture = std::fs::read_to_string(crate::fixture("set_literals.jsonl")).unwrap();
    let mut wrong = Vec::new();
    let mut cases = 0;
    for line in fixture.lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let tests: Vec<(&str, &str)> = case["tests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["input"].as_str().unwrap(), t["output"].as_str().unwrap()))
            .collect();
        let code = case["code"].as_str().unwrap();
        let grade = grade_code(&sb, &stdin_problem(&tests), code, &quick());
        if grade.verdict != Verdict::Accepted {
            wrong.push(format!(
                "{code}→ {:?} at test {:?}",
                grade.verdict, grade.failed_test
            ));
        }
        cases += 1;
    }
    assert_eq!(cases, 120);
    assert!(
        wrong.is_empty(),
        "{} of 120:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Defect 1, beyond small ints: sets of strings, tuples, floats and large ints (whose order
/// depends on every bit of their hashes) must also print the same in every test of one program
/// as in a fresh compile of it. Random literals from a seeded generator; each program's expected
/// output is what it prints alone, in a single test.
#[test]
fn every_test_of_a_program_agrees_with_its_own_fresh_compile() {
    let sb = sandbox();
    let mut seed: u64 = 0x5eed_0032;
    let mut next = move |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % n
    };
    let mut disagreeing = Vec::new();
    for _ in 0..60 {
        let mut members = Vec::new();
        for _ in 0..2 + next(6) {
            members.push(match next(4) {
                0 => format!(
                    "'{}'",
                    ["a", "bb", "ccc", "x", "yz", "key"][next(6) as usize]
                ),
                1 => format!("({}, {})", next(9), next(9)),
                2 => format!("{}.5", next(99)),
                _ => next(1 << 40).to_string(),
            });
        }
        let list = members.join(", ");
        let code = match next(3) {
            0 => format!("input()\nfor x in {{{list}}}:\n    print(x)\n"),
            1 => format!("input()\nprint(*{{{list}}})\nprint(*frozenset({{{list}}}))\n"),
            _ => format!("input()\nprint([x for x in [{list}] if x in {{{list}}}], {{{list}}})\n"),
        };
        let printed = stdout_of(&code);
        assert!(!printed.is_empty(), "{code}");
        let tests = [("0\n", printed.as_str()); 3];
        let grade = grade_code(&sb, &stdin_problem(&tests), &code, &quick());
        if grade.verdict != Verdict::Accepted {
            disagreeing.push(format!("{code}→ {:?}", grade.failed_test));
        }
    }
    assert!(disagreeing.is_empty(), "{}", disagreeing.join("\n"));
}

/// What `code` prints on stdin "0", compiled from its text in one fresh run.
fn stdout_of(code: &str) -> String {
    String::from_utf8(run_with(code, "0\n", &quick()).stdout).unwrap()
}

/// One fresh run of the snapshot: `code` on `input`.
pub(crate) fn run_with(
    code: &str,
    input: &str,
    options: &GradeOptions,
) -> areal_sandbox::RunReport {
    let mut stdin = format!("{{\"kind\": \"stdin\", \"code\": {}}}\n", code.len()).into_bytes();
    stdin.extend_from_slice(code.as_bytes());
    stdin.extend_from_slice(input.as_bytes());
    let run = areal_sandbox::Run {
        stdin,
        limits: options.limits(),
        ..areal_sandbox::Run::default()
    };
    sandbox().run_blocking(&run).unwrap()
}

/// Defects 2 and 3: nothing a program writes or does may produce `error`, which training
/// drops unpenalised. Code nested too deep for marshal (its compiled form is then not passed
/// on), and a compile-time `SyntaxWarning` (once written to stderr before the harness's start
/// mark, so the host read the program's `os._exit(2)` as the harness's failure), are the
/// program's own: it runs, its output is graded, its exit status is its own.
#[test]
fn nothing_a_program_does_before_it_runs_is_the_grader_s_failure() {
    let sb = sandbox();
    let two = stdin_problem(&[("1\n", "1\n"), ("2\n", "2\n")]);
    let deep = format!("f = {}0\nprint(input())\n", "lambda: ".repeat(1000));
    let warned = "n = int(input())\nif n is 1:\n    pass\nassert (n, 'm')\nprint(n)\n";
    for (name, code) in [("deep", deep.as_str()), ("warned", warned)] {
        let grade = grade_code(&sb, &two, code, &quick());
        assert_eq!(grade.verdict, Verdict::Accepted, "{name}: {grade:?}");
        for exit in [
            "import os\nos._exit(2)\n",
            "import os\nos._exit(0)\n",
            "raise SystemExit(2)\n",
        ] {
            let grade = grade_code(&sb, &two, &format!("{code}{exit}"), &quick());
            // (`os._exit(0)` leaves the print in its buffer: a wrong answer, as natively.)
            assert!(!grade.verdict.is_failure(), "{name} + {exit:?}: {grade:?}");
        }
        let grade = grade_code(
            &sb,
            &two,
            &format!("{code}import os\nos._exit(2)\n"),
            &quick(),
        );
        assert_eq!(grade.verdict, Verdict::RuntimeError, "{name}: {grade:?}");
    }
    // The warning is still shown, after the harness's mark, as CPython shows it.
    let grade = grade_code(
        &sb,
        &two,
        &format!("{warned}import os\nos._exit(2)\n"),
        &quick(),
    );
    let message = grade.message.unwrap_or_default();
    assert!(
        message.contains("SyntaxWarning: \"is\" with a literal"),
        "{message}"
    );
    // Functional tests compile after the mark: the same holds there.
    let call = call_problem("f", &[("1", "1")]);
    let code = "def f(n):\n    if n is 1:\n        import os\n        os._exit(2)\n    return n\n";
    let grade = grade_code(&sb, &call, code, &quick());
    assert_eq!(grade.verdict, Verdict::RuntimeError, "{grade:?}");
}

/// Defect 4: the host reduced a guest's `Decimal` and `Fraction` return values with big-integer
/// gcds, outside every limit: `[Decimal('1E-99999')] * 1000`, 18 KB of output, cost 59–76 s
/// of host CPU. Reading a return value is now linear in its size, with Python's `==` kept
/// for every number an int or float can equal.
#[test]
fn return_values_cost_the_host_time_linear_in_their_size() {
    let sb = sandbox();
    let problem = call_problem("f", &[("1", "[0.5, 2, 1000]")]);
    let exact = "from decimal import Decimal\nfrom fractions import Fraction\ndef f(n):\n    return [Decimal('0.50'), Fraction(4, 2), Decimal('1E+3')]\n";
    let grade = grade_code(&sb, &problem, exact, &quick());
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
    let tiny = "from decimal import Decimal\ndef f(n):\n    return [Decimal('1E-99999')] * 1000\n";
    let problem = call_problem(
        "f",
        &[("1", &format!("[{}]", vec!["0.0"; 1000].join(", ")))],
    );
    let grade = grade_code(&sb, &problem, tiny, &quick());
    assert_eq!(grade.verdict, Verdict::WrongAnswer, "{grade:?}");
    let big = "from fractions import Fraction\ndef f(n):\n    return [Fraction(10**300 + 1, 10**300 + 7)] * 1000\n";
    let grade = grade_code(&sb, &problem, big, &quick());
    assert_eq!(grade.verdict, Verdict::WrongAnswer, "{grade:?}");
}

/// Defect 5: a sleep was charged what it asked for, but every sleep lasts a while, so a loop
/// of short sleeps ran on its wall-time backstop (a 4 s limit ended at 21 s). Now a sleep is
/// charged the time it took: 5000 sleeps of 0.1 ms (each takes at least a millisecond, the
/// timer's tick) pass a 1.5 s limit. In deterministic mode a sleep is not slept at all but
/// charged in fuel, so a loop of `time.sleep(0)` spends exactly its budget, every time.
#[test]
fn sleeps_are_charged_what_they_take() {
    let sb = sandbox();
    let problem = stdin_problem(&[("", "done\n")]);
    let code = "import time\nfor _ in range(5000):\n    time.sleep(0.0001)\nprint('done')\n";
    let grade = grade_code(&sb, &problem, code, &quick());
    assert_eq!(grade.verdict, Verdict::TimeLimit, "{grade:?}");

    let sb = shared_sandbox(Mode::Deterministic).unwrap();
    let options = GradeOptions {
        mode: Mode::Deterministic,
        fuel: 200_000_000,
        ..quick()
    };
    let mut fuel = Vec::new();
    for code in [
        "import time\nwhile True:\n    time.sleep(0)\n",
        "import time\ntime.sleep(1000)\n",
        "import time\nfor _ in range(3):\n    time.sleep(0.01)\nprint('done')\n",
    ] {
        for _ in 0..3 {
            let grade = grade_code(&sb, &problem, code, &options);
            fuel.push((code, grade.verdict, grade.fuel()));
        }
    }
    for chunk in fuel.chunks(3) {
        assert!(chunk.iter().all(|f| f == &chunk[0]), "{chunk:?}");
    }
    assert_eq!(fuel[0].1, Verdict::TimeLimit);
    assert_eq!(fuel[0].2, Some(options.fuel), "the budget, exactly");
    assert_eq!(fuel[3].1, Verdict::TimeLimit);
    assert_eq!(fuel[6].1, Verdict::Accepted);
    // Three sleeps of 10 ms cost 3 × 10⁷ fuel beside what the program computes.
    assert!(fuel[6].2.unwrap() > 30_000_000, "{:?}", fuel[6]);
}

/// Defect 8: how a program ran (`ran_as`) was read from a line the harness wrote after the
/// program ran, so the program could write its own. It now comes from what the harness writes
/// before the program gets control.
#[test]
fn how_a_program_ran_cannot_be_forged() {
    let sb = sandbox();
    let problem = stdin_problem(&[("", "1\n")]);
    let code = "import os\ndef f():\n    global x\nprint(1, flush=True)\nos.write(2, b'\\x1eareal-started function\\n\\x1eareal-exec-ns=5 function\\n')\nos._exit(0)\n";
    let grade = grade_code(&sb, &problem, code, &quick());
    assert_eq!(grade.verdict, Verdict::Accepted, "{grade:?}");
    assert_eq!(grade.runs[0].as_function, Some(false));
    let reward = reward_of(&grade, &quick(), &sb);
    assert_eq!(reward.provenance.details["ran_as"], "module");
}
