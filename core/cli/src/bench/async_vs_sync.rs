//! `areal bench async-vs-sync`: the paper's claims measured on this engine. The same workload,
//! seeds and sample budget are trained with `rollout.max_staleness` η = 0 (synchronous RL)
//! and η > 0; every run's weights are evaluated after it, on the whole held-out split, at
//! fixed step intervals, so that evaluation costs no run any time; the accuracy curves against
//! RL wall time give the time to a target accuracy fixed in advance (90 % of the synchronous
//! runs' mean final accuracy).
//!
//! Results go to `DIR/results.json` after every run; a second call with the same `--out`
//! runs only what is missing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, bail};
use areal_core::eval::{EvalSpec, Evaluator};
use areal_core::plot::{Series, accuracy_plot};
use areal_core::{ConfigLoader, Observer, RunOptions, RunSummary};
use areal_sdk::{Split, WeightUpdate};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use super::stats::{mean, sd};

/// A workload: the default job, or the default job with heavy-tailed response lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Workload {
    /// `areal train`'s built-in job.
    Default,
    /// Chain-sum with 2 to 40 terms, P(n terms) ∝ (n − 1)^−1.5: the median prompt has 3
    /// terms (a response of 17 characters), one in a hundred has 35 or more (over 230); a
    /// 384-position context.
    LongTail,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::LongTail => "long-tail",
        }
    }

    /// Config overrides on top of the built-in job.
    fn overrides(self) -> &'static [&'static str] {
        match self {
            Self::Default => &[],
            Self::LongTail => &[
                "task.max_terms=40",
                "task.decay=1.0",
                "task.power=1.5",
                "policy.max_positions=384",
                "rollout.max_new_tokens=300",
            ],
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct AsyncVsSyncArgs {
    /// Folder for `results.json`, the plots, `table.md` and each run's folder; runs already
    /// in its `results.json` are not run again.
    #[arg(long)]
    out: PathBuf,
    /// η ∈ {0, 4}, seed 1, the default workload, no ablation: a few minutes (at most 12 with
    /// a warm-up to train first).
    #[arg(long)]
    quick: bool,
    /// Workloads [default: default,long-tail; --quick: default].
    #[arg(long, value_delimiter = ',')]
    workloads: Option<Vec<Workload>>,
    /// Values of `rollout.max_staleness` for decoupled PPO [default: 0,2,4,8; --quick: 0,4].
    #[arg(long, value_delimiter = ',')]
    staleness: Option<Vec<u64>>,
    /// Seeds [default: 1,2,3; --quick: 1].
    #[arg(long, value_delimiter = ',')]
    seeds: Option<Vec<u64>>,
    /// Values of η at which naive PPO (`ppo`: π_prox = π_behav) also runs, on the first
    /// workload: the staleness ablation [default: 0,4,8; --quick: none]. `--ablation` with no
    /// value for none.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    ablation: Option<Vec<u64>>,
    /// Values of η at which decoupled PPO also runs with the log-linear proximal
    /// approximation instead of the recompute, on the first workload [default: 4; --quick:
    /// none]. `--log-linear` with no value for none.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    log_linear: Option<Vec<u64>>,
    /// Evaluate the weights after every this many steps.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    eval_every: u64,
    /// Wall-time budget of each run's RL in seconds (`train.max_seconds`); a run that has not
    /// trained all its steps by then stops and is reported as it stands.
    #[arg(long, default_value_t = 300.0)]
    budget_s: f64,
    /// Threads of each side in asynchronous runs (generation, training); synchronous runs
    /// give all cores to whichever side runs.
    #[arg(long, default_value = "1,1", value_delimiter = ',')]
    async_threads: Vec<usize>,
    /// A config override for every run (repeatable), e.g. `--set train.steps=200`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// The algorithms compared: decoupled PPO, naive PPO (the ablation) and decoupled PPO with
/// the log-linear proximal approximation.
const DECOUPLED: &str = "decoupled-ppo";
const NAIVE: &str = "ppo";
const LOG_LINEAR: &str = "decoupled-ppo-log-linear";

/// Config overrides of one of the algorithms compared.
fn algorithm_sets(algorithm: &str) -> Vec<String> {
    match algorithm {
        LOG_LINEAR => vec![
            format!("algorithm.kind=\"{DECOUPLED}\""),
            "algorithm.proximal=\"log-linear\"".into(),
        ],
        kind => vec![format!("algorithm.kind=\"{kind}\"")],
    }
}

/// What a run is: everything that tells two runs apart.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct RunKey {
    workload: Workload,
    /// `decoupled-ppo`, `ppo`, or `decoupled-ppo-log-linear`.
    algorithm: String,
    max_staleness: u64,
    seed: u64,
}

/// One evaluated point of a run's learning curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct CurvePoint {
    step: u64,
    /// Seconds of RL when these weights were ready.
    wall_s: f64,
    accuracy: f64,
}

/// One run in `results.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct RunRecord {
    #[serde(flatten)]
    key: RunKey,
    /// Seconds of RL to the first evaluated weights at or above the target; the whole RL
    /// time when never (`reached` false). `None` until the workload's target is known.
    time_to_target_s: Option<f64>,
    reached: Option<bool>,
    final_accuracy: f64,
    /// Fraction of RL time the generator spent computing.
    gen_busy: Option<f64>,
    /// Fraction of RL time the trainer spent computing.
    train_busy: f64,
    /// Generated tokens trained on per second of RL.
    tokens_per_s: f64,
    steps: u64,
    /// Seconds of RL in all.
    wall_s: f64,
    stopped_early: bool,
    gen_threads: usize,
    train_threads: usize,
    token_lag_mean: f64,
    token_lag_max: u64,
    /// Mean milliseconds of the weight-update protocol.
    weight_sync_ms: f64,
    /// Mean milliseconds from an interruption to decoding running again.
    resume_ms: Option<f64>,
    curve: Vec<CurvePoint>,
}

/// `results.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Results {
    /// The default workload's target (also in `targets`).
    target_accuracy: Option<f64>,
    /// Each workload's target: 90 % of its synchronous decoupled-PPO runs' mean final
    /// accuracy.
    targets: BTreeMap<String, f64>,
    /// What every run shares; a second call must agree.
    settings: serde_json::Value,
    runs: Vec<RunRecord>,
}

impl RunRecord {
    /// Mean accuracy of the evaluations in the last `steps` steps of the run: the end of the
    /// curve with less of one evaluation's noise.
    fn late_accuracy(&self, steps: u64) -> f64 {
        let last = self.curve.last().map_or(0, |p| p.step);
        let late: Vec<f64> = self
            .curve
            .iter()
            .filter(|p| p.step + steps >= last)
            .map(|p| p.accuracy)
            .collect();
        mean(&late)
    }
}

impl Results {
    fn has(&self, key: &RunKey) -> bool {
        self.runs.iter().any(|r| &r.key == key)
    }

    /// Targets from the synchronous runs, and every run's time to target.
    fn settle(&mut self) {
        self.targets.clear();
        let mut finals: BTreeMap<Workload, Vec<f64>> = BTreeMap::new();
        for r in &self.runs {
            if r.key.max_staleness == 0 && r.key.algorithm == DECOUPLED {
                finals
                    .entry(r.key.workload)
                    .or_default()
                    .push(r.final_accuracy);
            }
        }
        let targets: BTreeMap<Workload, f64> = finals
            .into_iter()
            .map(|(w, a)| (w, 0.9 * mean(&a)))
            .collect();
        for (w, t) in &targets {
            self.targets.insert(w.name().to_owned(), *t);
        }
        self.target_accuracy = targets.get(&Workload::Default).copied();
        for r in &mut self.runs {
            match targets.get(&r.key.workload) {
                Some(&target) => {
                    let hit = r.curve.iter().find(|p| p.accuracy >= target);
                    r.reached = Some(hit.is_some());
                    r.time_to_target_s = Some(hit.map_or(r.wall_s, |p| p.wall_s));
                }
                None => (r.reached, r.time_to_target_s) = (None, None),
            }
        }
    }

    fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join("results.json");
        let tmp = dir.join("results.json.tmp");
        let text = serde_json::to_string_pretty(self).expect("results serialise");
        std::fs::write(&tmp, text + "\n")
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
    }
}

/// Keeps the weights RL starts from and every `every`-th step's, with the RL time each was
/// ready at.
struct Snapshots {
    every: u64,
    started: Mutex<Option<Instant>>,
    taken: Mutex<Vec<(u64, f64, WeightUpdate)>>,
    last: Mutex<Option<(u64, f64, WeightUpdate)>>,
}

impl Snapshots {
    fn new(every: u64) -> Self {
        Self {
            every,
            started: Mutex::new(None),
            taken: Mutex::new(Vec::new()),
            last: Mutex::new(None),
        }
    }

    /// Take every kept snapshot, the last weights included, in step order. (The run may
    /// still hold the observer for a moment while its tasks wind down.)
    fn take(&self) -> Vec<(u64, f64, WeightUpdate)> {
        let mut taken = std::mem::take(&mut *self.taken.lock().expect("snapshot lock"));
        if let Some(last) = self.last.lock().expect("snapshot lock").take()
            && taken.last().is_none_or(|t| t.0 != last.0)
        {
            taken.push(last);
        }
        taken
    }
}

impl Observer for Snapshots {
    fn on_weights(&self, update: &WeightUpdate) {
        let now = Instant::now();
        let started = *self
            .started
            .lock()
            .expect("snapshot lock")
            .get_or_insert(now);
        let step = update.version;
        let point = (step, (now - started).as_secs_f64(), update.clone());
        if step.is_multiple_of(self.every) {
            self.taken
                .lock()
                .expect("snapshot lock")
                .push(point.clone());
        }
        *self.last.lock().expect("snapshot lock") = Some(point);
    }
}

struct Plan {
    workloads: Vec<Workload>,
    staleness: Vec<u64>,
    seeds: Vec<u64>,
    ablation: Vec<u64>,
    log_linear: Vec<u64>,
}

impl Plan {
    fn from(args: &AsyncVsSyncArgs) -> Self {
        let quick = args.quick;
        Self {
            workloads: args.workloads.clone().unwrap_or_else(|| {
                if quick {
                    vec![Workload::Default]
                } else {
                    vec![Workload::Default, Workload::LongTail]
                }
            }),
            staleness: args
                .staleness
                .clone()
                .unwrap_or_else(|| if quick { vec![0, 4] } else { vec![0, 2, 4, 8] }),
            seeds: args
                .seeds
                .clone()
                .unwrap_or_else(|| if quick { vec![1] } else { vec![1, 2, 3] }),
            ablation: args
                .ablation
                .clone()
                .unwrap_or_else(|| if quick { vec![] } else { vec![0, 4, 8] }),
            log_linear: args
                .log_linear
                .clone()
                .unwrap_or_else(|| if quick { vec![] } else { vec![4] }),
        }
    }

    /// Every run, synchronous ones first (they fix the target), then by seed.
    fn runs(&self) -> Vec<RunKey> {
        let mut keys = Vec::new();
        for &workload in &self.workloads {
            let mut etas = self.staleness.clone();
            etas.sort_by_key(|&e| e != 0);
            for &eta in &etas {
                for &seed in &self.seeds {
                    keys.push(RunKey {
                        workload,
                        algorithm: DECOUPLED.into(),
                        max_staleness: eta,
                        seed,
                    });
                }
            }
            if Some(&workload) == self.workloads.first() {
                for (algorithm, etas) in [(NAIVE, &self.ablation), (LOG_LINEAR, &self.log_linear)] {
                    for &eta in etas {
                        for &seed in &self.seeds {
                            keys.push(RunKey {
                                workload,
                                algorithm: algorithm.into(),
                                max_staleness: eta,
                                seed,
                            });
                        }
                    }
                }
            }
        }
        keys
    }
}

#[allow(clippy::print_stderr, clippy::print_stdout)]
pub(crate) fn run(args: AsyncVsSyncArgs) -> anyhow::Result<()> {
    let plan = Plan::from(&args);
    let [gen_threads, train_threads] = <[usize; 2]>::try_from(args.async_threads.clone())
        .map_err(|_| anyhow::anyhow!("--async-threads takes two numbers"))?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let settings = serde_json::json!({
        "eval_every": args.eval_every,
        "budget_s": args.budget_s,
        "async_threads": {"generation": gen_threads, "training": train_threads},
        "sync_threads": {"generation": 0, "training": 0},
        "set": args.set,
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
    });
    let path = args.out.join("results.json");
    let mut results = if path.exists() {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let results: Results = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a results file of this bench", path.display()))?;
        if results.settings != settings {
            bail!(
                "{} holds runs made with other settings ({}); use another --out",
                path.display(),
                results.settings
            );
        }
        results
    } else {
        Results {
            settings,
            ..Results::default()
        }
    };
    let runtime = crate::runtime()?;
    let todo: Vec<RunKey> = plan
        .runs()
        .into_iter()
        .filter(|k| !results.has(k))
        .collect();
    eprintln!(
        "{} runs to do ({} already in {}); RL budget {} s each, weights evaluated every {} steps",
        todo.len(),
        results.runs.len(),
        path.display(),
        args.budget_s,
        args.eval_every
    );
    for (i, key) in todo.iter().enumerate() {
        let sync = key.max_staleness == 0;
        let threads = if sync {
            (0, 0)
        } else {
            (gen_threads, train_threads)
        };
        eprintln!(
            "[{}/{}] {} {} η = {} seed {} (threads: generation {}, training {})",
            i + 1,
            todo.len(),
            key.workload.name(),
            key.algorithm,
            key.max_staleness,
            key.seed,
            show_threads(threads.0),
            show_threads(threads.1),
        );
        let record = one_run(&args, key, threads, &runtime)?;
        eprintln!(
            "    {} steps in {:.1} s of RL, final accuracy {:.3}, generation busy {}, training busy {:.0}%",
            record.steps,
            record.wall_s,
            record.final_accuracy,
            record
                .gen_busy
                .map_or("-".into(), |b| format!("{:.0}%", 100.0 * b)),
            100.0 * record.train_busy
        );
        results.runs.push(record);
        results.runs.sort_by(|a, b| a.key.cmp(&b.key));
        results.settle();
        results.write(&args.out)?;
    }
    results.settle();
    results.write(&args.out)?;
    for &workload in &plan.workloads {
        plot(&results, workload, &args.out)?;
    }
    let table = table(&results);
    std::fs::write(args.out.join("table.md"), &table)
        .with_context(|| format!("cannot write {}", args.out.join("table.md").display()))?;
    println!("{table}");
    Ok(())
}

fn show_threads(n: usize) -> String {
    if n == 0 { "all".into() } else { n.to_string() }
}

fn one_run(
    args: &AsyncVsSyncArgs,
    key: &RunKey,
    (gen_threads, train_threads): (usize, usize),
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<RunRecord> {
    let name = format!(
        "{}-{}-eta{}-seed{}",
        key.workload.name(),
        key.algorithm,
        key.max_staleness,
        key.seed
    );
    let mut sets: Vec<String> = key
        .workload
        .overrides()
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    sets.extend([
        format!("seed={}", key.seed),
        format!("rollout.max_staleness={}", key.max_staleness),
        format!("generator.threads={gen_threads}"),
        format!("train.threads={train_threads}"),
        format!("train.max_seconds={}", args.budget_s),
        "eval.enabled=false".into(),
    ]);
    sets.extend(algorithm_sets(&key.algorithm));
    sets.extend(args.set.iter().cloned());
    let (config, plugins) = areal_core::resolve(&ConfigLoader::new().set_all(&sets)?)?;
    let snapshots = Arc::new(Snapshots::new(args.eval_every));
    let summary: RunSummary = runtime.block_on(areal_core::run(
        config,
        plugins,
        RunOptions {
            out_dir: Some(args.out.join("runs").join(&name)),
            observer: snapshots.clone(),
            started: Instant::now(),
            ..RunOptions::default()
        },
    ))?;
    // evaluation after the run, on all cores: it costs the run nothing
    let (eval_config, eval_plugins) = areal_core::resolve(
        &ConfigLoader::new()
            .set_all(&sets)?
            .set("generator.threads=0")?,
    )?;
    let spec = EvalSpec::greedy(&eval_config, Split::Eval, 0);
    let evaluator = Evaluator::new(&eval_config, eval_plugins);
    let mut curve = Vec::new();
    for (step, wall_s, weights) in snapshots.take() {
        let outcome = runtime.block_on(evaluator.evaluate(weights, &spec))?;
        curve.push(CurvePoint {
            step,
            wall_s,
            accuracy: outcome.accuracy,
        });
    }
    Ok(RunRecord {
        key: key.clone(),
        time_to_target_s: None,
        reached: None,
        final_accuracy: curve.last().map_or(0.0, |p| p.accuracy),
        gen_busy: summary.gen_busy,
        train_busy: summary.train_busy,
        tokens_per_s: summary.trained_tokens_per_s,
        steps: summary.steps,
        wall_s: summary.rl_seconds,
        stopped_early: summary.stopped_early,
        gen_threads,
        train_threads,
        token_lag_mean: summary.token_lag_mean,
        token_lag_max: summary.token_lag_max,
        weight_sync_ms: summary.weight_sync_ms_mean,
        resume_ms: summary.resume_ms_mean,
        curve,
    })
}

const COLOURS: [[u8; 3]; 8] = [
    [40, 40, 40],
    [30, 90, 200],
    [20, 160, 80],
    [200, 60, 40],
    [150, 60, 180],
    [230, 150, 20],
    [120, 170, 230],
    [240, 120, 160],
];

/// Accuracy against RL wall time, every run of `workload`, coloured by algorithm and η.
fn plot(results: &Results, workload: Workload, dir: &Path) -> anyhow::Result<()> {
    let runs: Vec<&RunRecord> = results
        .runs
        .iter()
        .filter(|r| r.key.workload == workload)
        .collect();
    if runs.is_empty() {
        return Ok(());
    }
    let mut kinds: Vec<(String, u64)> = runs
        .iter()
        .map(|r| (r.key.algorithm.clone(), r.key.max_staleness))
        .collect();
    let order = |a: &str| [DECOUPLED, NAIVE, LOG_LINEAR].iter().position(|x| *x == a);
    kinds.sort_by_key(|k| (order(&k.0), k.1));
    kinds.dedup();
    let mut series: Vec<Series> = runs
        .iter()
        .map(|r| {
            let k = kinds
                .iter()
                .position(|k| k.0 == r.key.algorithm && k.1 == r.key.max_staleness)
                .expect("listed");
            let short = match r.key.algorithm.as_str() {
                DECOUPLED => "dppo",
                LOG_LINEAR => "dppo-loglin",
                other => other,
            };
            Series {
                label: format!("{short} eta={}", r.key.max_staleness),
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

/// `mean ± sd` of `xs` with `digits` decimals.
fn mean_sd(xs: &[f64], digits: usize) -> String {
    if xs.is_empty() {
        return "-".into();
    }
    format!("{:.digits$} ± {:.digits$}", mean(xs), sd(xs))
}

/// Markdown tables: per workload, every algorithm and η against time to target and the rest
/// (means ± sample sd over seeds); then the staleness ablation.
fn table(results: &Results) -> String {
    let mut out = String::new();
    let mut workloads: Vec<Workload> = results.runs.iter().map(|r| r.key.workload).collect();
    workloads.sort_unstable();
    workloads.dedup();
    for workload in workloads {
        let runs = |algorithm: &str, eta: u64| -> Vec<&RunRecord> {
            results
                .runs
                .iter()
                .filter(|r| {
                    r.key.workload == workload
                        && r.key.algorithm == algorithm
                        && r.key.max_staleness == eta
                })
                .collect()
        };
        let etas = |algorithm: &str| -> Vec<u64> {
            let mut e: Vec<u64> = results
                .runs
                .iter()
                .filter(|r| r.key.workload == workload && r.key.algorithm == algorithm)
                .map(|r| r.key.max_staleness)
                .collect();
            e.sort_unstable();
            e.dedup();
            e
        };
        let target = results.targets.get(workload.name()).copied();
        out.push_str(&format!(
            "\n**{}** — target accuracy {} (90 % of the synchronous decoupled-ppo runs' mean final accuracy)\n\n",
            workload.name(),
            target.map_or("-".into(), |t| format!("{t:.3}"))
        ));
        out.push_str("| algorithm | η | seeds | time to target (s) | reached | sync ÷ this | best sync ÷ this | final accuracy | min – max | last 50 steps | s / step | generation busy | training busy | trained tokens/s | token lag (mean) | resume after interruption (ms) |\n");
        out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        let ttt_of = |rs: &[&RunRecord]| -> Vec<f64> {
            rs.iter().filter_map(|r| r.time_to_target_s).collect()
        };
        // the synchronous reference, and the fastest synchronous setting of any algorithm
        let sync_ttt = ttt_of(&runs(DECOUPLED, 0));
        let best_sync = [DECOUPLED, NAIVE, LOG_LINEAR]
            .iter()
            .map(|a| ttt_of(&runs(a, 0)))
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
        for algorithm in [DECOUPLED, NAIVE, LOG_LINEAR] {
            for eta in etas(algorithm) {
                let rs = runs(algorithm, eta);
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
                    "| {algorithm} | {eta} | {} | {} | {reached}/{} | {speedup} | {best} | {} | {lo:.3} – {hi:.3} | {} | {} | {} | {} | {} | {} | {} |\n",
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
                    mean_sd(&col(&|r| r.resume_ms), 1),
                ));
            }
        }
        let ablation = etas(NAIVE);
        if !ablation.is_empty() {
            out.push_str(&format!(
                "\n**{}: staleness ablation** — final accuracy and the mean of the last 50 steps' evaluations, mean ± sd over seeds; differences paired by seed\n\n",
                workload.name()
            ));
            out.push_str("| η | ppo (π_prox = π_behav) | decoupled-ppo | decoupled − ppo | last 50 steps: ppo | decoupled-ppo | decoupled − ppo |\n|---|---|---|---|---|---|---|\n");
            for eta in ablation {
                let late = |r: &RunRecord| r.late_accuracy(50);
                let last = |r: &RunRecord| r.final_accuracy;
                let of = |a: &str, f: &dyn Fn(&RunRecord) -> f64| -> Vec<f64> {
                    runs(a, eta).iter().map(|r| f(r)).collect()
                };
                let paired = |f: &dyn Fn(&RunRecord) -> f64| -> String {
                    let diffs: Vec<f64> = runs(DECOUPLED, eta)
                        .iter()
                        .filter_map(|d| {
                            runs(NAIVE, eta)
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
                    "| {eta} | {} | {} | {} | {} | {} | {} |\n",
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

#[cfg(test)]
mod tests {
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
                "| decoupled-ppo | 4 | 1 | 5.0 ± 0.0 | 1/1 | 3.00× | 3.00× | 0.700 ± 0.000 | 0.700 – 0.700 | 0.480 ± 0.000 |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| 4 | 0.400 ± 0.000 | 0.700 ± 0.000 | +0.300 ± 0.000 | 0.267 ± 0.000 | 0.480 ± 0.000 | +0.213 ± 0.000 |"),
            "{table}"
        );
    }

    #[test]
    fn plan_runs_synchronous_runs_first_and_the_ablation_on_the_first_workload() {
        let plan = Plan {
            workloads: vec![Workload::Default, Workload::LongTail],
            staleness: vec![4, 0],
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
}
