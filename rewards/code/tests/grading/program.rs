//! How the harness compiles a stdin program (`program.py`): as a function's body, with fast
//! locals, only where that changes nothing the program can see. Each program's expected
//! output is what native CPython prints running it as a module after LiveCodeBench's prelude.

use areal_reward_code::{grade_code, reward_of};
use areal_sdk::Verdict;

use crate::{quick, sandbox, stdin_problem};

/// (what it shows, program, input, output as a module, whether it may run as a function)
const PROGRAMS: &[(&str, &str, &str, &str, bool)] = &[
    (
        "a loop over a module variable",
        "n = int(input())\ns = 0\nfor i in range(n):\n    s += i\nprint(s)\n",
        "10\n",
        "45\n",
        true,
    ),
    (
        "global declared in a function",
        "c = 0\ndef f():\n    global c\n    c += 1\nf()\nf()\nprint(c)\n",
        "",
        "2\n",
        false,
    ),
    (
        "input rebound to readline first",
        "import sys\ninput = sys.stdin.readline\nN, M = map(int, input().split())\nprint(N + M)\n",
        "3 4\n",
        "7\n",
        true,
    ),
    (
        "a prelude name read before it is bound",
        "print(M is re.M)\nM = 3\nprint(M)\n",
        "",
        "True\n3\n",
        false,
    ),
    (
        "a prelude name bound only on one branch",
        "if int(input()) > 0:\n    S = 'positive'\nprint(S)\n",
        "-1\n",
        "re.DOTALL\n",
        false,
    ),
    (
        "a prelude name bound by a loop that never runs",
        "for e in []:\n    pass\nprint(round(e, 2))\n",
        "",
        "2.72\n",
        false,
    ),
    (
        "functions that call each other before both exist",
        "def f():\n    return g(1)\ndef g(x):\n    return x + 1\nprint(f())\n",
        "",
        "2\n",
        true,
    ),
    (
        "a class body reading the name it assigns",
        "x = 1\nclass A:\n    x = x + 1\nprint(A.x, x)\n",
        "",
        "2 1\n",
        false,
    ),
    (
        "a class body reading a module name",
        "x = 1\nclass A:\n    y = x + 1\nprint(A.y)\n",
        "",
        "2\n",
        true,
    ),
    (
        "classes and functions keep their module names",
        "from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\n    def m(self):\n        return self.x\nprint(P(1), P, str(P.m).split(' at ')[0], type(P(2)).__name__)\n",
        "",
        "P(x=1) <class '__main__.P'> <function P.m P\n",
        true,
    ),
    (
        "globals()",
        "x = 1\nprint(globals()['x'])\n",
        "",
        "1\n",
        false,
    ),
    (
        "eval of a module name",
        "x = 2\nprint(eval('x + 1'))\n",
        "",
        "3\n",
        false,
    ),
    (
        "a star import after a statement",
        "print(1)\nfrom math import *\nprint(floor(2.5))\n",
        "",
        "1\n2\n",
        false,
    ),
    (
        "an annotated module variable",
        "x: int = 3\nprint(x, __annotations__)\n",
        "",
        "3 {'x': <class 'int'>}\n",
        false,
    ),
    (
        "exit() ends it",
        "print(1)\nexit()\nprint(2)\n",
        "",
        "1\n",
        true,
    ),
    (
        "a main guard",
        "def main():\n    print(int(input()) * 2)\nif __name__ == '__main__':\n    main()\n",
        "21\n",
        "42\n",
        true,
    ),
    (
        "deep recursion",
        "import sys\nsys.setrecursionlimit(10000)\ndef f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\nprint(f(5000))\n",
        "",
        "5000\n",
        true,
    ),
    (
        "maxsize from the prelude is 64-bit",
        "print(maxsize == 2**63 - 1, sys.maxsize == 2**63 - 1)\n",
        "",
        "True True\n",
        true,
    ),
    (
        "a comprehension over module names",
        "n = 4\nprint([i * n for i in range(n)], {k: n for k in 'ab'})\n",
        "",
        "[0, 4, 8, 12] {'a': 4, 'b': 4}\n",
        true,
    ),
    (
        "a lambda closing over a name rebound later",
        "k = 1\nf = lambda: k\nk = 2\nprint(f())\n",
        "",
        "2\n",
        true,
    ),
];

#[test]
fn stdin_programs_run_as_functions_only_where_nothing_changes() {
    let sb = sandbox();
    let mut wrong = Vec::new();
    for (name, code, input, output, as_function) in PROGRAMS {
        let problem = stdin_problem(&[(input, output)]);
        let grade = grade_code(&sb, &problem, code, &quick());
        let ran_as = grade.runs.first().and_then(|r| r.as_function);
        let provenance = reward_of(&grade, &quick(), &sb).provenance.details["ran_as"].clone();
        let said = if *as_function { "function" } else { "module" };
        if grade.verdict != Verdict::Accepted || ran_as != Some(*as_function) || provenance != said
        {
            wrong.push(format!(
                "{name}: {} ({:?}), ran as a function: {ran_as:?}, want {as_function}",
                grade.verdict.as_str(),
                grade.message
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// What does not compile fails as it does as a module (a module may not `return`), and a
/// traceback names the program's frame `<module>` either way.
#[test]
fn errors_read_as_a_module_s() {
    let sb = sandbox();
    let problem = stdin_problem(&[("", "1\n")]);
    let grade = grade_code(&sb, &problem, "print(1)\nreturn\n", &quick());
    assert_eq!(grade.verdict, Verdict::RuntimeError);
    let message = grade.message.unwrap_or_default();
    assert!(message.contains("'return' outside function"), "{message}");
    assert_eq!(grade.runs[0].as_function, Some(false));

    let grade = grade_code(&sb, &problem, "x = 1\nraise ValueError('boom')\n", &quick());
    assert_eq!(grade.verdict, Verdict::RuntimeError);
    assert_eq!(grade.runs[0].as_function, Some(true));
    let message = grade.message.unwrap_or_default();
    assert!(
        message.contains("line 2, in <module>") && message.contains("ValueError: boom"),
        "{message}"
    );
}

/// A program is compiled in its first test and the harness passes the code on to the next
/// ones: every test still runs it as it must, whichever way it was compiled.
#[test]
fn later_tests_run_the_code_the_first_one_compiled() {
    let sb = sandbox();
    let tests = [("1\n", "2\n"), ("5\n", "10\n"), ("21\n", "42\n")];
    let problem = stdin_problem(&tests);
    for (code, as_function) in [
        ("n = int(input())\nprint(n * 2)\n", true),
        (
            "n = 0\ndef read():\n    global n\n    n = int(input())\nread()\nprint(n * 2)\n",
            false,
        ),
    ] {
        let grade = grade_code(&sb, &problem, code, &quick());
        assert_eq!(
            grade.verdict,
            Verdict::Accepted,
            "{code}: {:?}",
            grade.message
        );
        let ran: Vec<_> = grade.runs.iter().map(|r| r.as_function).collect();
        assert_eq!(ran, vec![Some(as_function); 3], "{code}");
    }
    // What does not compile fails in every test alike.
    let grade = grade_code(&sb, &problem, "print(1\n", &quick());
    assert_eq!(grade.verdict, Verdict::RuntimeError);
    assert!(grade.message.unwrap_or_default().contains("SyntaxError"));
}

/// A program too big for its compiled code to be passed on is compiled in every test, and the
/// harness's marks still precede it: its exit statuses remain its own (status 2 after it
/// started is the program's `runtime_error`, never the grader's `error`).
#[test]
fn a_program_too_big_to_pass_on_still_owns_its_exit_status() {
    let sb = sandbox();
    let problem = stdin_problem(&[("", "1\n"), ("", "1\n")]);
    let big = format!(
        "{}print(1)\n",
        "x = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n".repeat(4000)
    );
    let grade = grade_code(&sb, &problem, &big, &quick());
    assert_eq!(grade.verdict, Verdict::Accepted, "{:?}", grade.message);
    let forged = format!("{big}import os\nos._exit(2)\n");
    let grade = grade_code(&sb, &problem, &forged, &quick());
    assert_eq!(grade.verdict, Verdict::RuntimeError, "{:?}", grade.message);
}
