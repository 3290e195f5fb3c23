//! The chain-sum task: disjoint splits, long-tailed lengths, imperfect demonstrations, verifier.

use std::collections::HashSet;

use areal_sdk::{FinishReason, RewardInput, Split, Task};
use areal_tasks::chain_sum::{
    ChainSum, ChainSumOptions, ChainSumVerifier, final_answer, prompt, response, split_of, terms_of,
};
use areal_testkit::conformance;

fn task() -> ChainSum {
    ChainSum::new(ChainSumOptions::default(), 7)
}

#[test]
fn held_out_splits_are_fixed_distinct_and_disjoint_from_training() {
    let t = task();
    let eval: Vec<String> = (0..500)
        .map(|i| t.item(Split::Eval, i).unwrap().prompt)
        .collect();
    let validation: Vec<String> = (0..200)
        .map(|i| t.item(Split::Validation, i).unwrap().prompt)
        .collect();
    assert_eq!(
        eval.iter().collect::<HashSet<_>>().len(),
        500,
        "eval prompts are distinct"
    );
    assert_eq!(validation.iter().collect::<HashSet<_>>().len(), 200);
    assert!(eval.iter().all(|p| split_of(p) == Split::Eval));
    assert!(validation.iter().all(|p| split_of(p) == Split::Validation));
    let held_out: HashSet<&String> = eval.iter().chain(&validation).collect();
    for i in 0..50_000 {
        let p = t.item(Split::Train, i).unwrap().prompt;
        assert!(!held_out.contains(&p), "train item {i} {p} is held out");
    }
    // the same seed gives the same held-out set; another seed another
    assert_eq!(
        ChainSum::new(ChainSumOptions::default(), 7)
            .item(Split::Eval, 99)
            .unwrap()
            .prompt,
        eval[99]
    );
    let other: Vec<String> = (0..500)
        .map(|i| {
            ChainSum::new(ChainSumOptions::default(), 8)
                .item(Split::Eval, i)
                .unwrap()
                .prompt
        })
        .take(20)
        .collect();
    assert_ne!(other, eval[..20].to_vec());
    assert!(t.item(Split::Eval, 500).is_err());
}

#[test]
fn response_lengths_have_a_long_tail() {
    let t = task();
    let mut lengths: Vec<usize> = (0..2000)
        .map(|i| {
            let item = t.item(Split::Train, i).unwrap();
            let terms = terms_of(&item).unwrap();
            response(&terms, || false).len()
        })
        .collect();
    lengths.sort_unstable();
    let (p10, median, max) = (lengths[200], lengths[1000], lengths[1999]);
    assert!(max >= 4 * p10, "longest {max} vs 10th percentile {p10}");
    assert!(
        median < max / 2,
        "most responses are short: median {median}, max {max}"
    );
    assert_eq!(response(&[9; 12], || false).len(), 75);
    assert_eq!(response(&[1, 2], || false), "a1=1,b2=3>3");
}

/// The power-law option: P(n) ∝ (n − 1)^−1.5 on 2..=40 terms (the long-tail workload).
#[test]
fn power_law_term_counts_have_a_heavy_tail() {
    let t = ChainSum::new(
        ChainSumOptions {
            max_terms: 40,
            decay: 1.0,
            power: 1.5,
            ..ChainSumOptions::default()
        },
        7,
    );
    let draws = 20_000;
    let mut count = [0usize; 41];
    for i in 0..draws {
        count[terms_of(&t.item(Split::Train, i).unwrap()).unwrap().len()] += 1;
    }
    // P(2) / P(3) = 2^1.5; P(n ≥ 30) = 2.46 % (exact sums over 2..=40)
    let ratio = count[2] as f64 / count[3] as f64;
    assert!((ratio - 2f64.powf(1.5)).abs() < 0.25, "P(2)/P(3) = {ratio}");
    let tail = count[30..].iter().sum::<usize>() as f64 / draws as f64;
    assert!((tail - 0.0246).abs() < 0.005, "P(n ≥ 30) = {tail}");
    assert!(count[40] > 0, "the longest prompts occur");
    let median = (2..=40)
        .find(|&n| count[..=n].iter().sum::<usize>() * 2 >= draws as usize)
        .unwrap();
    assert_eq!(median, 3);
}

#[test]
fn demonstrations_forget_carries_and_nothing_else() {
    let t = task();
    let (mut crossings, mut forgotten, mut correct_without_crossing) = (0, 0, 0);
    for i in 0..3000 {
        let item = t.item(Split::Train, i).unwrap();
        let demo = t.demonstration(&item).unwrap().unwrap();
        assert_eq!(
            demo,
            t.demonstration(&item).unwrap().unwrap(),
            "demonstrations are deterministic"
        );
        let terms = terms_of(&item).unwrap();
        // replay the demonstration's steps
        let mut total = 0;
        let steps = demo.split_once('>').unwrap().0;
        assert_eq!(steps.split(',').count(), terms.len());
        let mut crossed_any = false;
        for (i, (step, &term)) in steps.split(',').zip(&terms).enumerate() {
            let letter = char::from(b'a' + i as u8);
            assert!(
                step.starts_with(&format!("{letter}{term}=")),
                "{step} in {demo}"
            );
            let written: u32 = step.rsplit_once('=').unwrap().1.parse().unwrap();
            if total % 10 + term >= 10 {
                crossings += 1;
                crossed_any = true;
                if written == total + term - 10 {
                    forgotten += 1;
                } else {
                    assert_eq!(written, total + term);
                }
            } else {
                assert_eq!(written, total + term, "only carries are ever wrong");
            }
            total = written;
        }
        assert_eq!(final_answer(&demo), Some(u64::from(total)));
        if !crossed_any {
            correct_without_crossing += 1;
            assert_eq!(total, terms.iter().sum::<u32>());
        }
    }
    let rate = forgotten as f64 / crossings as f64;
    assert!(
        (rate - 0.6).abs() < 0.03,
        "forgot {forgotten} of {crossings} carries"
    );
    assert!(correct_without_crossing > 100);
}

fn input(prompt_text: &str, completion: &str, answer: u64) -> RewardInput {
    RewardInput {
        metadata: Default::default(),
        sample_id: 1,
        item_id: "x".into(),
        prompt: prompt_text.into(),
        completion: completion.into(),
        completion_ids: vec![],
        finish_reason: FinishReason::Stop,
        reference: serde_json::json!({"terms": [5, 8, 3], "answer": answer}),
    }
}

#[test]
fn verifier_checks_the_final_answer() {
    let p = prompt(&[5, 8, 3]);
    assert_eq!(p, "a5b8c3=");
    conformance::check_verifier(
        std::sync::Arc::new(ChainSumVerifier),
        &[
            (input(&p, "a5=5,b8=13,c3=16>16", 16), 1.0),
            (input(&p, "a5=5,b8=3,c3=6>6", 16), 0.0),
            (input(&p, "a5=5,b8=13,c3=16", 16), 0.0),
            (input(&p, "garbage>16", 16), 1.0),
            (input(&p, ">16>15", 16), 0.0),
            (input(&p, "a5=5,b8=13>", 16), 0.0),
        ],
    );
    assert_eq!(final_answer("a1=1,b2=3>3"), Some(3));
    assert_eq!(final_answer("a1=1,b2=3>3x"), None);
    assert_eq!(final_answer("no answer"), None);
}

/// What the engine relies on of a task, and that the chain-sum reward grades every
/// demonstration the task gives.
#[test]
fn the_task_passes_the_task_conformance_check() {
    conformance::check_task(&task(), Some(&ChainSumVerifier));
}
