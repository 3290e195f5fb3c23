//! Tests of the bench's plan, targets and tables.

use super::plan::Plan;
use super::report::table;
use super::results::{CurvePoint, Results, RunKey, RunRecord};
use super::*;

fn record(
    workload: Workload,
    algorithm: &str,
    eta: u64,
    seed: u64,
    curve: &[(f64, f64)],
) -> RunRecord {
    RunRecord {
        key: RunKey {
            workload,
            algorithm: algorithm.into(),
            minibatches: 1,
            max_staleness: eta,
            seed,
        },
        time_to_target_s: None,
        reached: None,
        final_accuracy: curve.last().unwrap().1,
        gen_busy: Some(0.5),
        train_busy: 0.9,
        tokens_per_s: 1000.0,
        steps: 30,
        wall_s: curve.last().unwrap().0 + 1.0,
        stopped_early: false,
        gen_threads: 1,
        train_threads: 1,
        token_lag_mean: 1.0,
        token_lag_max: 2,
        weight_sync_ms: 1.0,
        resume_ms: None,
        staleness_abs_mean: None,
        curve: curve
            .iter()
            .enumerate()
            .map(|(i, &(wall_s, accuracy))| CurvePoint {
                step: 10 * i as u64,
                wall_s,
                accuracy,
            })
            .collect(),
    }
}

#[test]
fn target_is_ninety_percent_of_the_synchronous_mean_and_times_come_from_the_curves() {
    let mut results = Results {
        runs: vec![
            record(
                Workload::Default,
                "decoupled-ppo",
                0,
                1,
                &[(0.0, 0.1), (10.0, 0.5), (20.0, 0.8)],
            ),
            record(
                Workload::Default,
                "decoupled-ppo",
                0,
                2,
                &[(0.0, 0.1), (10.0, 0.7), (20.0, 0.6)],
            ),
            record(
                Workload::Default,
                "decoupled-ppo",
                4,
                1,
                &[(0.0, 0.1), (5.0, 0.64), (12.0, 0.7)],
            ),
            record(
                Workload::Default,
                "ppo",
                4,
                1,
                &[(0.0, 0.1), (5.0, 0.3), (12.0, 0.4)],
            ),
            record(
                Workload::LongTail,
                "decoupled-ppo",
                4,
                1,
                &[(0.0, 0.1), (5.0, 0.3)],
            ),
        ],
        ..Results::default()
    };
    results.settle();
    // (0.8 + 0.6) / 2 · 0.9
    let target = results.target_accuracy.unwrap();
    assert!((target - 0.63).abs() < 1e-12);
    let ttt: Vec<(Option<f64>, Option<bool>)> = results
        .runs
        .iter()
        .map(|r| (r.time_to_target_s, r.reached))
        .collect();
    assert_eq!(
        ttt,
        [
            (Some(20.0), Some(true)),
            (Some(10.0), Some(true)),
            (Some(5.0), Some(true)),
            // never reached: the whole RL time
            (Some(13.0), Some(false)),
            // no synchronous runs of this workload: no target yet
            (None, None),
        ]
    );
    let table = table(&results);
    assert!(table.contains("target accuracy 0.630"), "{table}");
    // sync mean 15 s, η = 4 took 5 s
    assert!(
        table.contains(
            "| decoupled-ppo | 1 | 4 | 1 | 5.0 ± 0.0 | 1/1 | 3.00× | 3.00× | 0.700 ± 0.000 | 0.700 – 0.700 | 0.480 ± 0.000 |"
        ),
        "{table}"
    );
    assert!(
        table.contains("| 1 | 4 | 0.400 ± 0.000 | 0.700 ± 0.000 | +0.300 ± 0.000 | 0.267 ± 0.000 | 0.480 ± 0.000 | +0.213 ± 0.000 |"),
        "{table}"
    );
}

#[test]
fn plan_runs_synchronous_runs_first_and_the_ablation_on_the_first_workload() {
    let plan = Plan {
        workloads: vec![Workload::Default, Workload::LongTail],
        staleness: vec![4, 0],
        minibatches: vec![1],
        seeds: vec![1, 2],
        ablation: vec![8],
        log_linear: vec![4],
    };
    let keys: Vec<(Workload, String, u64, u64)> = plan
        .runs()
        .into_iter()
        .map(|k| (k.workload, k.algorithm, k.max_staleness, k.seed))
        .collect();
    let d = |w, a: &str, e, s| (w, a.to_owned(), e, s);
    use Workload::{Default as D, LongTail as L};
    assert_eq!(
        keys,
        [
            d(D, "decoupled-ppo", 0, 1),
            d(D, "decoupled-ppo", 0, 2),
            d(D, "decoupled-ppo", 4, 1),
            d(D, "decoupled-ppo", 4, 2),
            d(D, "ppo", 8, 1),
            d(D, "ppo", 8, 2),
            d(D, LOG_LINEAR, 4, 1),
            d(D, LOG_LINEAR, 4, 2),
            d(L, "decoupled-ppo", 0, 1),
            d(L, "decoupled-ppo", 0, 2),
            d(L, "decoupled-ppo", 4, 1),
            d(L, "decoupled-ppo", 4, 2),
        ]
    );
}

/// With several mini-batch counts every setting runs at each, and the target comes from the
/// synchronous runs with the fewest; the tables show each count apart.
#[test]
fn minibatches_are_a_dimension_of_the_plan_and_the_tables() {
    let plan = Plan {
        workloads: vec![Workload::Default],
        staleness: vec![0, 4],
        minibatches: vec![1, 4],
        seeds: vec![1],
        ablation: vec![4],
        log_linear: vec![],
    };
    let keys: Vec<(usize, String, u64)> = plan
        .runs()
        .into_iter()
        .map(|k| (k.minibatches, k.algorithm, k.max_staleness))
        .collect();
    let d = |m, a: &str, e| (m, a.to_owned(), e);
    assert_eq!(
        keys,
        [
            d(1, "decoupled-ppo", 0),
            d(1, "decoupled-ppo", 4),
            d(1, "ppo", 4),
            d(4, "decoupled-ppo", 0),
            d(4, "decoupled-ppo", 4),
            d(4, "ppo", 4),
        ]
    );
    let with = |mb: usize, algorithm: &str, eta: u64, curve: &[(f64, f64)]| {
        let mut r = record(Workload::Default, algorithm, eta, 1, curve);
        r.key.minibatches = mb;
        r
    };
    let mut results = Results {
        runs: vec![
            with(1, "decoupled-ppo", 0, &[(0.0, 0.1), (10.0, 0.5)]),
            with(4, "decoupled-ppo", 0, &[(0.0, 0.1), (10.0, 0.9)]),
            with(1, "ppo", 4, &[(0.0, 0.1), (10.0, 0.3)]),
            with(4, "ppo", 4, &[(0.0, 0.1), (10.0, 0.6)]),
            with(1, "decoupled-ppo", 4, &[(0.0, 0.1), (10.0, 0.4)]),
            with(4, "decoupled-ppo", 4, &[(0.0, 0.1), (10.0, 0.8)]),
        ],
        ..Results::default()
    };
    results.settle();
    // 90 % of the one-mini-batch synchronous run's 0.5
    assert!((results.target_accuracy.unwrap() - 0.45).abs() < 1e-12);
    let table = table(&results);
    assert!(table.contains("| decoupled-ppo | 4 | 0 | 1 |"), "{table}");
    assert!(
        table.contains("| 4 | 4 | 0.600 ± 0.000 | 0.800 ± 0.000 | +0.200 ± 0.000 |"),
        "{table}"
    );
    assert!(
        table.contains("| 1 | 4 | 0.300 ± 0.000 | 0.400 ± 0.000 | +0.100 ± 0.000 |"),
        "{table}"
    );
}

/// The staleness plot is drawn when a workload ran at several η, from the runs' late
/// accuracy, and not at all for one η.
#[test]
fn the_staleness_plot_is_drawn_for_several_values_of_eta_only() {
    let dir = tempfile::tempdir().unwrap();
    let one = Results {
        runs: vec![record(
            Workload::Default,
            "decoupled-ppo",
            0,
            1,
            &[(0.0, 0.1), (10.0, 0.5)],
        )],
        ..Results::default()
    };
    super::report::staleness_plot(&one, Workload::Default, dir.path()).unwrap();
    let path = dir.path().join("staleness-default.png");
    assert!(!path.exists());
    let mut several = one.clone();
    for (algorithm, eta) in [("decoupled-ppo", 4), ("ppo", 4), ("ppo", 8)] {
        several.runs.push(record(
            Workload::Default,
            algorithm,
            eta,
            1,
            &[(0.0, 0.1), (10.0, 0.3)],
        ));
    }
    super::report::staleness_plot(&several, Workload::Default, dir.path()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
}
