//! The bench's report: accuracy plots and markdown tables.

use std::path::Path;

use anyhow::Context;
use areal_core::plot::{Series, accuracy_plot, xy_plot};

use super::results::{Results, RunRecord};
use super::{DECOUPLED, LOG_LINEAR, NAIVE, Workload};
use crate::stats::{mean, sd};

pub(super) const COLOURS: [[u8; 3]; 8] = [
    [40, 40, 40],
    [30, 90, 200],
    [20, 160, 80],
    [200, 60, 40],
    [150, 60, 180],
    [230, 150, 20],
    [120, 170, 230],
    [240, 120, 160],
];

/// The algorithms in the order the plots and tables list them.
const ALGORITHMS: [&str; 3] = [DECOUPLED, NAIVE, LOG_LINEAR];

/// `algorithm`'s place in [`ALGORITHMS`].
fn rank(algorithm: &str) -> Option<usize> {
    ALGORITHMS.iter().position(|a| *a == algorithm)
}

/// `algorithm`'s name in a plot's legend.
fn short(algorithm: &str) -> &str {
    match algorithm {
        DECOUPLED => "dppo",
        LOG_LINEAR => "dppo-loglin",
        other => other,
    }
}

/// Accuracy against RL wall time, every run of `workload`, coloured by algorithm and η.
pub(super) fn plot(results: &Results, workload: Workload, dir: &Path) -> anyhow::Result<()> {
    let runs: Vec<&RunRecord> = results
        .runs
        .iter()
        .filter(|r| r.key.workload == workload)
        .collect();
    if runs.is_empty() {
        return Ok(());
    }
    let mut kinds: Vec<(String, usize, u64)> = runs
        .iter()
        .map(|r| {
            (
                r.key.algorithm.clone(),
                r.key.minibatches,
                r.key.max_staleness,
            )
        })
        .collect();
    kinds.sort_by_key(|k| (k.1, rank(&k.0), k.2));
    kinds.dedup();
    let mut series: Vec<Series> = runs
        .iter()
        .map(|r| {
            let k = kinds
                .iter()
                .position(|k| {
                    k.0 == r.key.algorithm && k.1 == r.key.minibatches && k.2 == r.key.max_staleness
                })
                .expect("listed");
            let mb = if r.key.minibatches == 1 {
                String::new()
            } else {
                format!(" mb={}", r.key.minibatches)
            };
            Series {
                label: format!(
                    "{}{mb} eta={}",
                    short(&r.key.algorithm),
                    r.key.max_staleness
                ),
                color: COLOURS[k % COLOURS.len()],
                points: r.curve.iter().map(|p| (p.wall_s, p.accuracy)).collect(),
            }
        })
        .collect();
    series.sort_by_key(|s| {
        COLOURS
            .iter()
            .position(|c| *c == s.color)
            .unwrap_or(usize::MAX)
    });
    if let Some(&target) = results.targets.get(workload.name()) {
        let end = runs.iter().map(|r| r.wall_s).fold(0.0, f64::max);
        series.push(Series {
            label: format!("target {target:.3}"),
            color: [170, 170, 170],
            points: vec![(0.0, target), (end, target)],
        });
    }
    let path = dir.join(format!("accuracy-{}.png", workload.name()));
    accuracy_plot(
        &path,
        &format!("{}: accuracy against rl time", workload.name()),
        &series,
        None,
    )
    .with_context(|| format!("cannot write {}", path.display()))
}

/// The staleness ablation as a plot: the mean over seeds of each run's last 50 steps'
/// evaluations against η, one line per algorithm and number of mini-batches (each seed's
/// value a small mark beside it), when `workload` ran at more than one η.
pub(super) fn staleness_plot(
    results: &Results,
    workload: Workload,
    dir: &Path,
) -> anyhow::Result<()> {
    let runs: Vec<&RunRecord> = results
        .runs
        .iter()
        .filter(|r| r.key.workload == workload)
        .collect();
    let mut etas: Vec<u64> = runs.iter().map(|r| r.key.max_staleness).collect();
    etas.sort_unstable();
    etas.dedup();
    if etas.len() < 2 {
        return Ok(());
    }
    let mut kinds: Vec<(usize, usize)> = runs
        .iter()
        .filter_map(|r| Some((r.key.minibatches, rank(&r.key.algorithm)?)))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    let mut series = Vec::new();
    for (k, &(mb, order)) in kinds.iter().enumerate() {
        let algorithm = ALGORITHMS[order];
        let color = COLOURS[(k + 1) % COLOURS.len()];
        let label = format!("{} mb={mb}", short(algorithm));
        let mut line = Vec::new();
        for &eta in &etas {
            // η = 0 is synchronous decoupled PPO: every algorithm's line starts from it
            let at: Vec<f64> = runs
                .iter()
                .filter(|r| {
                    r.key.minibatches == mb
                        && r.key.max_staleness == eta
                        && (r.key.algorithm == algorithm
                            || (eta == 0 && r.key.algorithm == DECOUPLED))
                })
                .map(|r| r.late_accuracy(50))
                .collect();
            if at.is_empty() {
                continue;
            }
            line.push((eta as f64, mean(&at)));
            // each seed a mark of its own, a little to the side of the line
            let x = eta as f64 + 0.15 * (order as f64 - 1.0);
            series.extend(at.iter().map(|&y| Series {
                label: label.clone(),
                color,
                points: vec![(x, y)],
            }));
        }
        series.push(Series {
            label,
            color,
            points: line,
        });
    }
    let path = dir.join(format!("staleness-{}.png", workload.name()));
    xy_plot(
        &path,
        &format!("{}: late accuracy by staleness", workload.name()),
        "max_staleness (eta)",
        "held-out accuracy, mean of the last 50 steps",
        &series,
    )
    .with_context(|| format!("cannot write {}", path.display()))
}

/// `mean ± sd` of `xs` with `digits` decimals.
pub(super) fn mean_sd(xs: &[f64], digits: usize) -> String {
    if xs.is_empty() {
        return "-".into();
    }
    format!("{:.digits$} ± {:.digits$}", mean(xs), sd(xs))
}

/// Markdown tables: per workload, every algorithm and η against time to target and the rest
/// (means ± sample sd over seeds); then the staleness ablation.
pub(super) fn table(results: &Results) -> String {
    let mut out = String::new();
    let mut workloads: Vec<Workload> = results.runs.iter().map(|r| r.key.workload).collect();
    workloads.sort_unstable();
    workloads.dedup();
    for workload in workloads {
        let runs = |algorithm: &str, mb: usize, eta: u64| -> Vec<&RunRecord> {
            results
                .runs
                .iter()
                .filter(|r| {
                    r.key.workload == workload
                        && r.key.algorithm == algorithm
                        && r.key.minibatches == mb
                        && r.key.max_staleness == eta
                })
                .collect()
        };
        // the (mini-batches, η) settings an algorithm ran at
        let settings = |algorithm: &str| -> Vec<(usize, u64)> {
            let mut e: Vec<(usize, u64)> = results
                .runs
                .iter()
                .filter(|r| r.key.workload == workload && r.key.algorithm == algorithm)
                .map(|r| (r.key.minibatches, r.key.max_staleness))
                .collect();
            e.sort_unstable();
            e.dedup();
            e
        };
        let mut minibatches: Vec<usize> = results
            .runs
            .iter()
            .filter(|r| r.key.workload == workload)
            .map(|r| r.key.minibatches)
            .collect();
        minibatches.sort_unstable();
        minibatches.dedup();
        let reference_mb = minibatches.first().copied().unwrap_or(1);
        let target = results.targets.get(workload.name()).copied();
        out.push_str(&format!(
            "\n**{}** — target accuracy {} (90 % of the synchronous decoupled-ppo runs' mean final accuracy, {reference_mb} mini-batch{}); *sync ÷ this* against those runs\n\n",
            workload.name(),
            target.map_or("-".into(), |t| format!("{t:.3}")),
            if reference_mb == 1 { "" } else { "es" },
        ));
        out.push_str("| algorithm | mini-batches | η | seeds | time to target (s) | reached | sync ÷ this | best sync ÷ this | final accuracy | min – max | last 50 steps | s / step | generation busy | training busy | trained tokens/s | token lag (mean) | staleness \\|Δ log π\\| | resume after interruption (ms) |\n");
        out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        let ttt_of = |rs: &[&RunRecord]| -> Vec<f64> {
            rs.iter().filter_map(|r| r.time_to_target_s).collect()
        };
        // the synchronous reference, and the fastest synchronous setting of any algorithm
        let sync_ttt = ttt_of(&runs(DECOUPLED, reference_mb, 0));
        let best_sync = ALGORITHMS
            .iter()
            .flat_map(|a| minibatches.iter().map(move |&mb| (a, mb)))
            .map(|(a, mb)| ttt_of(&runs(a, mb, 0)))
            .filter(|t| !t.is_empty())
            .map(|t| mean(&t))
            .fold(f64::INFINITY, f64::min);
        let ratio = |reference: f64, ttt: &[f64]| {
            if ttt.is_empty() || !reference.is_finite() || reference == 0.0 {
                "-".to_owned()
            } else {
                format!("{:.2}×", reference / mean(ttt))
            }
        };
        for algorithm in ALGORITHMS {
            for (mb, eta) in settings(algorithm) {
                let rs = runs(algorithm, mb, eta);
                let col = |f: &dyn Fn(&RunRecord) -> Option<f64>| -> Vec<f64> {
                    rs.iter().filter_map(|r| f(r)).collect()
                };
                let ttt = col(&|r| r.time_to_target_s);
                let finals = col(&|r| Some(r.final_accuracy));
                let reached = rs.iter().filter(|r| r.reached == Some(true)).count();
                let (lo, hi) = finals
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| {
                        (l.min(x), h.max(x))
                    });
                let sync_reference = if sync_ttt.is_empty() {
                    f64::NAN
                } else {
                    mean(&sync_ttt)
                };
                let (speedup, best) = (ratio(sync_reference, &ttt), ratio(best_sync, &ttt));
                let percent = |xs: Vec<f64>| {
                    if xs.is_empty() {
                        "-".into()
                    } else {
                        format!("{} %", mean_sd(&xs, 0))
                    }
                };
                out.push_str(&format!(
                    "| {algorithm} | {mb} | {eta} | {} | {} | {reached}/{} | {speedup} | {best} | {} | {lo:.3} – {hi:.3} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    rs.len(),
                    mean_sd(&ttt, 1),
                    rs.len(),
                    mean_sd(&finals, 3),
                    mean_sd(&col(&|r| Some(r.late_accuracy(50))), 3),
                    mean_sd(&col(&|r| Some(r.wall_s / r.steps.max(1) as f64)), 3),
                    percent(col(&|r| r.gen_busy.map(|b| 100.0 * b))),
                    percent(col(&|r| Some(100.0 * r.train_busy))),
                    mean_sd(&col(&|r| Some(r.tokens_per_s)), 0),
                    mean_sd(&col(&|r| Some(r.token_lag_mean)), 2),
                    mean_sd(&col(&|r| r.staleness_abs_mean), 4),
                    mean_sd(&col(&|r| r.resume_ms), 1),
                ));
            }
        }
        let ablation = settings(NAIVE);
        if !ablation.is_empty() {
            out.push_str(&format!(
                "\n**{}: staleness ablation** — final accuracy and the mean of the last 50 steps' evaluations, mean ± sd over seeds; differences paired by seed\n\n",
                workload.name()
            ));
            out.push_str("| mini-batches | η | ppo (π_prox = π_behav) | decoupled-ppo | decoupled − ppo | last 50 steps: ppo | decoupled-ppo | decoupled − ppo |\n|---|---|---|---|---|---|---|---|\n");
            for (mb, eta) in ablation {
                let late = |r: &RunRecord| r.late_accuracy(50);
                let last = |r: &RunRecord| r.final_accuracy;
                let of = |a: &str, f: &dyn Fn(&RunRecord) -> f64| -> Vec<f64> {
                    runs(a, mb, eta).iter().map(|r| f(r)).collect()
                };
                let paired = |f: &dyn Fn(&RunRecord) -> f64| -> String {
                    let diffs: Vec<f64> = runs(DECOUPLED, mb, eta)
                        .iter()
                        .filter_map(|d| {
                            runs(NAIVE, mb, eta)
                                .iter()
                                .find(|p| p.key.seed == d.key.seed)
                                .map(|p| f(d) - f(p))
                        })
                        .collect();
                    if diffs.is_empty() {
                        "-".into()
                    } else {
                        format!("{:+.3} ± {:.3}", mean(&diffs), sd(&diffs))
                    }
                };
                out.push_str(&format!(
                    "| {mb} | {eta} | {} | {} | {} | {} | {} | {} |\n",
                    mean_sd(&of(NAIVE, &last), 3),
                    mean_sd(&of(DECOUPLED, &last), 3),
                    paired(&last),
                    mean_sd(&of(NAIVE, &late), 3),
                    mean_sd(&of(DECOUPLED, &late), 3),
                    paired(&late),
                ));
            }
        }
    }
    out
}
