//! What equals what, case by case, with the default options: the rules of
//! docs/math-verifier.md §3, and answers that must not be accepted.

use std::time::{Duration, Instant};

use areal_reward_math::{Deadline, Options, Timeout, verify};

fn check(cases: &[(&str, &str, bool)]) {
    let options = Options::default();
    let mut wrong = Vec::new();
    for (gold, pred, expected) in cases {
        let dl = Deadline::after(Duration::from_secs(5));
        let v = verify(gold, &format!("${pred}$"), &options, &dl).expect("within 5 s");
        if v.equal != *expected {
            wrong.push(format!(
                "{gold:?} vs {pred:?}: expected {expected}, got {} ({:?} vs {:?})",
                v.equal,
                v.gold.math.map(|m| m.to_string()),
                v.pred.math.map(|m| m.to_string())
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn numbers_exact_and_rounded() {
    check(&[
        ("\\frac{1}{3}", "0.333333", true),
        ("\\frac{1}{3}", "0.33", false),
        ("2", "2.0000001", true),
        ("2", "2.00001", false),
        ("\\pi", "3.141593", true),
        ("\\pi", "3.14", false),
        ("0.0000672", "0.0000673", false),
        ("2^{100}", "1267650600228229401496703205376", true),
        ("2^{100}", "1267650600228229401496703205377", false),
        ("\\frac{14}{3}", "\\frac{28}{6}", true),
        ("-\\frac{1}{2}", "\\frac{-1}{2}", true),
        ("-\\frac{1}{2}", "\\frac{1}{2}", false),
        ("10\\%", "0.1", true),
        ("10\\%", "10", true),
        ("10\\%", "0.2", false),
        ("\\sqrt{12}", "2\\sqrt{3}", true),
        ("\\sqrt{12}", "3\\sqrt{2}", false),
        ("e^{i\\pi}", "-1", true),
        ("\\ln 8", "3\\ln 2", true),
        ("\\infty", "\\infty", true),
        ("-\\infty", "\\infty", false),
        ("\\binom{5}{2}", "10", true),
        ("5!", "120", true),
    ]);
}

#[test]
fn expressions_with_variables() {
    check(&[
        ("x+1", "1+x", true),
        ("x+1", "x+2", false),
        ("\\frac{x}{2}", "0.5x", true),
        ("\\sin^2 x + \\cos^2 x", "1", true),
        ("\\tan^2(y)+1", "\\sec^2(y)", true),
        ("\\sqrt{x^2}", "x", false),
        ("\\sqrt{x^2}", "|x|", true),
        ("(x+1)^2", "x^2+2x+1", true),
        ("(x+1)^2", "x^2+x+1", false),
        ("\\frac{\\pi r}{h+r}", "\\frac{r\\pi}{r+h}", true),
        ("f(x)", "f(y)", false),
        ("f(x)+1", "1+f(x)", true),
    ]);
}

#[test]
fn structures() {
    check(&[
        ("(1,2)", "[1,2]", false),
        ("[1,2)", "[1,2)", true),
        ("[1,2)", "[1,2]", false),
        ("\\{1,2\\}", "\\{2,1\\}", true),
        ("(1,2,3)", "(3,2,1)", false),
        ("1,2,3", "3,2,1", true),
        ("1,2,3", "1,2", false),
        (
            "(-\\infty, 3) \\cup (3, \\infty)",
            "(3, \\infty) \\cup (-\\infty, 3)",
            true,
        ),
        ("[0,2]", "[0,1] \\cup [1,2]", true),
        ("[0,2]", "[0,1) \\cup (1,2]", false),
        (
            "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
            "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
            true,
        ),
        (
            "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
            "\\begin{pmatrix}1\\\\3\\end{pmatrix}",
            false,
        ),
        ("1 \\pm \\sqrt{2}", "1+\\sqrt{2}, 1-\\sqrt{2}", true),
        ("1 \\pm \\sqrt{2}", "1+\\sqrt{2}", false),
    ]);
}

#[test]
fn relations_and_assignments() {
    check(&[
        ("x=2", "2", true),
        ("2", "x=2", true),
        ("y = 2x+1", "2x+1", true),
        ("x = 2", "y = 2", false),
        ("x^2 - 1 = 0", "(x-1)(x+1)=0", true),
        ("x > 2", "2 < x", true),
        ("x > 2", "x < 2", false),
        ("x > 2", "-x < -2", true),
        ("x > 2", "-x > -2", false),
        ("2x + z = 1", "1", false),
        ("-2 \\le x \\le 7", "[-2, 7]", true),
        ("-2 \\le x \\le 7", "[-2, 7)", false),
        ("x^2 < 4", "(-2, 2)", true),
        ("x^2 < 4", "(0, 2)", false),
    ]);
}

#[test]
fn words_and_choices() {
    check(&[
        ("\\text{(B)}", "B", true),
        ("\\text{(B)}", "\\text{B}", true),
        ("\\text{(B)}", "C", false),
        ("\\text{odd}", "\\text{Odd}", true),
        ("\\text{odd}", "\\text{even}", false),
        ("5 \\text{ cm}", "5", true),
        ("90^\\circ", "90", true),
    ]);
}

#[test]
fn nothing_is_found_in_an_empty_or_garbled_completion() {
    let options = Options::default();
    for pred in ["", "I do not know.", "$$", "\\boxed{}"] {
        let v = verify(
            "3",
            pred,
            &options,
            &Deadline::after(Duration::from_secs(5)),
        )
        .unwrap();
        assert!(!v.equal, "{pred:?}");
    }
}

#[test]
fn the_deadline_stops_a_verification_on_any_thread() {
    // An answer whose canonical form takes long: a sum over a wide range of a nasty body.
    let heavy = format!(
        "$\\boxed{{{}}}$",
        (0..400)
            .map(|k| format!("\\frac{{x^{{{k}}}}}{{{}}}", k + 1))
            .collect::<Vec<_>>()
            .join("+")
    );
    let options = Options::default();
    let on_thread = options.clone();
    let handle = std::thread::spawn(move || {
        let started = Instant::now();
        let result = verify(
            &heavy,
            &heavy.replace("x^{7}", "x^{8}"),
            &on_thread,
            &Deadline::after(Duration::from_millis(1)),
        );
        (result.map(|v| v.equal), started.elapsed())
    });
    let (result, took) = handle.join().unwrap();
    assert_eq!(result, Err(Timeout));
    assert!(took < Duration::from_millis(500), "stopped after {took:?}");
    // Nesting too deep is refused, not a stack overflow.
    let deep = format!("${}1{}$", "(".repeat(100_000), ")".repeat(100_000));
    let v = verify(
        "1",
        &deep,
        &options,
        &Deadline::after(Duration::from_secs(5)),
    )
    .unwrap();
    assert!(!v.equal);
    // Huge powers are not computed exactly.
    check(&[
        ("10^{10^{10}}", "10^{10^{10}}", true),
        ("10^{10^{10}}", "10^{10^{10}}+1", false),
    ]);
}

/// Answers with tens of thousands of digits once took 12 to 111 s past a 5 s deadline (a
/// quadratic back-off in extraction; a gcd on 660 000-bit numbers). Now they are decided
/// well inside it: numbers of up to 10 000 digits exactly, longer ones as exact text.
#[test]
fn huge_numbers_are_decided_inside_the_deadline() {
    let ones = |n: usize| "1".repeat(n);
    let cases = [
        (ones(50_000), ones(50_000), true),
        (ones(50_000), format!("{}2", ones(49_999)), false),
        (
            format!("0.{}", ones(200_000)),
            format!("0.{}", ones(200_000)),
            true,
        ),
        (
            format!("0.{}", ones(200_000)),
            format!("0.{}2", ones(199_999)),
            false,
        ),
        (ones(10_000), ones(10_000), true),
        (ones(10_000), format!("{}2", ones(9_999)), false),
        (format!("0.{}", ones(9_999)), "0.111111".to_owned(), true),
    ];
    for (gold, pred, expected) in cases {
        let dl = Deadline::after(Duration::from_secs(5));
        let v = verify(
            &gold,
            &format!("$\\boxed{{{pred}}}$"),
            &Options::default(),
            &dl,
        )
        .unwrap_or_else(|_| panic!("{} digits: past the deadline", gold.len()));
        assert_eq!(
            v.equal,
            expected,
            "{} digits against {}",
            gold.len(),
            pred.len()
        );
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Arbitrary text, and text made of the characters answers are made of, never panics the
    /// verifier, and it always comes back (its deadline).
    #[test]
    fn arbitrary_answers_are_read_or_refused(
        gold in "\\PC{0,60}",
        pred in "[0-9x+\\-*/^(){}\\[\\]\\\\a-z$.,= ]{0,60}",
    ) {
        let dl = || Deadline::after(Duration::from_secs(2));
        let _ = verify(&gold, &pred, &Options::default(), &dl());
        let _ = verify(&pred, &gold, &Options::default(), &dl());
        let _ = verify(&pred, &pred, &Options::default(), &dl());
    }
}
