//! MATH-500's reference answers: each is read, equals itself, equals its rewritings (the same
//! answer written as a model would), and differs from a perturbed copy.

#![allow(clippy::print_stderr, reason = "the tests print what they measured")]

use std::time::Duration;

use areal_reward_math::rewrite::{Rewrite, perturb, rewrite};
use areal_reward_math::{Deadline, Options, read_reference, verify};
use serde_json::Value;

fn answers() -> Vec<String> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/math500.jsonl");
    std::fs::read_to_string(path)
        .expect("the MATH-500 fixture")
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("JSON");
            v["answer"].as_str().expect("an answer").to_string()
        })
        .collect()
}

fn equal(gold: &str, pred: &str) -> bool {
    verify(
        gold,
        pred,
        &Options::default(),
        &Deadline::after(Duration::from_secs(5)),
    )
    .expect("within 5 s")
    .equal
}

#[test]
fn every_reference_is_read_and_equals_itself() {
    let answers = answers();
    assert_eq!(answers.len(), 500);
    let options = Options::default();
    let mut unread = Vec::new();
    let mut unequal = Vec::new();
    for a in &answers {
        let dl = Deadline::after(Duration::from_secs(5));
        if read_reference(a, &options, &dl)
            .expect("in time")
            .math
            .is_none()
        {
            unread.push(a.clone());
        }
        if !equal(a, &format!("The answer is $\\boxed{{{a}}}$.")) {
            unequal.push(a.clone());
        }
    }
    eprintln!("not parsed: {unread:?}");
    eprintln!("not equal to itself: {unequal:?}");
    assert!(unread.len() <= 5, "{} references not parsed", unread.len());
    assert!(
        unequal.is_empty(),
        "{} references not equal to themselves",
        unequal.len()
    );
}

#[test]
fn rewritings_are_accepted_and_perturbations_rejected() {
    let answers = answers();
    for kind in Rewrite::ALL {
        let (mut tried, mut missed) = (0, Vec::new());
        for a in &answers {
            if let Some(pred) = rewrite(a, kind) {
                tried += 1;
                if !equal(a, &pred) {
                    missed.push(format!("{a} vs {pred}"));
                }
            }
        }
        eprintln!(
            "{}: {} of {tried} accepted; missed {missed:?}",
            kind.name(),
            tried - missed.len()
        );
        assert!(
            tried >= 20,
            "{}: only {tried} answers rewritten",
            kind.name()
        );
        assert!(
            missed.len() * 100 <= tried,
            "{}: {} of {tried} rejected",
            kind.name(),
            missed.len()
        );
    }
    let accepted: Vec<&String> = answers.iter().filter(|a| equal(a, &perturb(a))).collect();
    eprintln!("perturbed but accepted: {accepted:?}");
    assert!(
        accepted.len() <= 2,
        "{} perturbed answers accepted",
        accepted.len()
    );
}
