//! `areal bench async-vs-sync`: the paper's claims measured on this engine. The same workload,
//! seeds and sample budget are trained with `rollout.max_staleness` η = 0 (synchronous RL)
//! and η > 0; every run's weights are evaluated after it, on the whole held-out split, at
//! fixed step intervals, so that evaluation costs no run any time; the accuracy curves against
//! RL wall time give the time to a target accuracy fixed in advance (90 % of the synchronous
//! runs' mean final accuracy).
//!
//! Results go to `DIR/results.json` after every run; a second call with the same `--out`
//! runs only what is missing.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

mod plan;
mod report;
mod results;
mod runs;
#[cfg(test)]
mod tests;

use plan::Plan;
use report::{plot, table};
use results::{Results, RunKey};
use runs::one_run;

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
    /// `--staleness` with no value for none (to run only the ablation's other algorithms).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    staleness: Option<Vec<u64>>,
    /// Values of `train.minibatches` (optimizer steps per batch): every setting runs at each
    /// [default: 1]. With one mini-batch, decoupled PPO's ratio π_θ/π_prox is exactly 1 at
    /// its only gradient evaluation, so its clip never acts.
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = clap::value_parser!(u64).range(1..))]
    minibatches: Vec<u64>,
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

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(crate) fn run(args: AsyncVsSyncArgs) -> anyhow::Result<()> {
    for set in &args.set {
        let key = set.split('=').next().unwrap_or_default().trim();
        if let Some(flag) = [
            ("train.minibatches", "--minibatches"),
            ("rollout.max_staleness", "--staleness"),
            ("seed", "--seeds"),
            ("algorithm.kind", "--ablation / --log-linear"),
        ]
        .iter()
        .find_map(|(k, flag)| (key == *k).then_some(flag))
        {
            bail!("--set {set}: {key} is a dimension of the bench; use {flag}");
        }
    }
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
    let runtime = areal_cli::internal::runtime()?;
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
            "[{}/{}] {} {} mini-batches {} η = {} seed {} (threads: generation {}, training {})",
            i + 1,
            todo.len(),
            key.workload.name(),
            key.algorithm,
            key.minibatches,
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
        report::staleness_plot(&results, workload, &args.out)?;
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
