//! Agreement with Math-Verify's own test cases (tests/fixtures/math_verify_cases.jsonl):
//! every case graded with its own config, the verdict against the one Math-Verify's tests
//! assert. Math-Verify 0.9.0 under its default settings agrees with 262 of the 268.

#![allow(clippy::print_stderr, reason = "the tests print what they measured")]

use std::collections::BTreeMap;
use std::time::Duration;

use areal_reward_math::{Deadline, Options, verify};
use serde_json::Value;

struct Case {
    index: usize,
    gold: String,
    pred: String,
    expected: bool,
    group: String,
    options: Options,
}

fn cases() -> Vec<Case> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/math_verify_cases.jsonl");
    let text = std::fs::read_to_string(&path).expect("the cases fixture");
    text.lines()
        .enumerate()
        .map(|(index, line)| {
            let v: Value = serde_json::from_str(line).expect("a JSON case");
            let source = v["source"].as_str().expect("a source");
            // `...tests/test_all.py::test_latex_notation[3]` → `test_latex_notation`
            let group = source
                .rsplit("::")
                .next()
                .and_then(|s| s.split('[').next())
                .expect("a test name")
                .to_string();
            Case {
                index,
                gold: v["gold"].as_str().expect("gold").to_string(),
                pred: v["pred"].as_str().expect("pred").to_string(),
                expected: v["expected"].as_bool().expect("expected"),
                group,
                options: Options::default()
                    .with_math_verify_config(&v["config"])
                    .expect("a config in Math-Verify's terms"),
            }
        })
        .collect()
}

#[test]
fn agrees_with_math_verify_on_its_own_cases() {
    let cases = cases();
    assert_eq!(cases.len(), 268);
    let mut per_group: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut disagreements = Vec::new();
    let mut false_accepts = 0;
    for case in &cases {
        let dl = Deadline::after(Duration::from_secs(5));
        let v = verify(&case.gold, &case.pred, &case.options, &dl)
            .unwrap_or_else(|_| panic!("case {} ran past 5 s", case.index));
        let entry = per_group.entry(&case.group).or_default();
        entry.1 += 1;
        if v.equal == case.expected {
            entry.0 += 1;
        } else {
            if v.equal {
                false_accepts += 1;
            }
            let shown = |s: &str| s.chars().take(80).collect::<String>().replace('\n', " ");
            disagreements.push(format!(
                "case {} ({}): expected {}, got {}; gold {:?} -> {:?}; pred {:?} -> {:?}",
                case.index,
                case.group,
                case.expected,
                v.equal,
                shown(&case.gold),
                v.gold.math.as_ref().map(ToString::to_string),
                shown(&case.pred),
                v.pred.math.as_ref().map(ToString::to_string),
            ));
        }
    }
    let agreed = cases.len() - disagreements.len();
    for (group, (ok, n)) in &per_group {
        eprintln!("{group:45} {ok:3} / {n:3}");
    }
    for d in &disagreements {
        eprintln!("{d}");
    }
    eprintln!(
        "agreement {agreed} / {}; false accepts {false_accepts}",
        cases.len()
    );
    assert!(
        agreed >= 262,
        "agreement {agreed} / 268 is below Math-Verify's 262"
    );
    assert!(false_accepts <= 2, "{false_accepts} false accepts");
}

#[test]
fn verdicts_repeat_exactly() {
    let cases = cases();
    for case in cases.iter().step_by(7) {
        let run = || {
            verify(&case.gold, &case.pred, &case.options, &Deadline::none())
                .expect("no deadline")
                .equal
        };
        assert_eq!(run(), run(), "case {}", case.index);
    }
}
