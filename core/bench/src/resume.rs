//! `areal bench resume`: a job killed K times at random moments with SIGKILL and resumed each
//! time (`areal train --resume`), against the same job left alone: the final weights' sha256,
//! the sample ids lost, trained twice or trained in another step, the steps trained again,
//! and the time and size of one checkpoint for the job's model and a model of ~10 M
//! parameters. Every run is a child process of this binary.

// progress goes to stderr, the tables to stdout
#![allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::Value;
use sha2::{Digest, Sha256};

use areal_cli::internal::ConfigArgs;

#[derive(Debug, Args)]
pub(crate) struct BenchResumeArgs {
    /// Kills per run, each at a random moment.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// The job (by default the built-in one).
    #[command(flatten)]
    config: ConfigArgs,
    /// Which modes to run: `deterministic` (the weights must come out bit for bit the same),
    /// `default` (no sample may be lost or trained twice), or `both`.
    #[arg(long, default_value = "both", value_parser = ["both", "deterministic", "default"])]
    modes: String,
    /// Seed of the kill moments.
    #[arg(long, default_value_t = 1)]
    kill_seed: u64,
    /// Parameters of the larger model whose checkpoints are timed (0 skips it).
    #[arg(long, default_value_t = 10_000_000)]
    params: u64,
    /// Folder of the runs and the report; by default `runs/bench-resume-<UTC timestamp>`.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One mode's pair of runs, compared.
struct Row {
    mode: &'static str,
    kills: usize,
    /// Kills before RL started (in the warm-up or the baseline evaluation).
    early_kills: usize,
    resumes: usize,
    resume_errors: usize,
    steps: usize,
    steps_twice: usize,
    redone: u64,
    weights_alone: String,
    weights_killed: String,
    other_steps: usize,
    lost: i64,
    duplicated: usize,
    alone_s: f64,
    killed_s: f64,
    checkpoint_ms: f64,
    checkpoint_ms_max: f64,
    checkpoint_bytes: u64,
}

pub(crate) fn run(args: BenchResumeArgs) -> anyhow::Result<()> {
    let out = args.out.clone().unwrap_or_else(|| {
        Path::new("runs").join(format!(
            "bench-resume-{}",
            areal_cli::internal::utc_timestamp()
        ))
    });
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let exe = std::env::current_exe().context("cannot find the areal binary")?;
    let base = args.config.to_args();
    let mut rng = StdRng::seed_from_u64(args.kill_seed);
    let modes: &[(&str, bool)] = match args.modes.as_str() {
        "deterministic" => &[("deterministic", true)],
        "default" => &[("default", false)],
        _ => &[("deterministic", true), ("default", false)],
    };
    // Both runs of a pair must start alike: with a warm-up cache, it is filled first, so that
    // the run left alone and the killed one both reuse it (and the kills fall in RL).
    let config = areal_cli::internal::loader(&args.config)?.load()?;
    if config.warmup.enabled && !config.warmup.cache_dir.is_empty() {
        eprintln!(
            "[warm-up] filling the warm-up cache ({})",
            config.warmup.cache_dir
        );
        let mut warm: Vec<String> = base
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        warm.extend(
            ["train.steps=1", "eval.enabled=false", "checkpoint.every=0"]
                .iter()
                .flat_map(|s| ["--set".to_owned(), (*s).to_owned()]),
        );
        let dir = out.join("warm-up");
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        if !train(&exe, &warm, Some(&dir), None)?.wait()?.success() {
            bail!("the warm-up run failed: see {}", dir.display());
        }
    }
    let mut rows = Vec::new();
    for &(mode, deterministic) in modes {
        let mut config: Vec<String> = base
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        config.extend(["--set".into(), format!("deterministic={deterministic}")]);
        rows.push(compare(
            &exe,
            &out.join(mode),
            mode,
            &config,
            args.kills,
            &mut rng,
        )?);
    }
    let large = if args.params > 0 {
        Some(large_model(&exe, &out.join("large"), args.params)?)
    } else {
        None
    };
    let report = report(&args, &rows, large.as_ref());
    println!("{report}");
    std::fs::write(out.join("report.md"), &report)?;
    eprintln!("runs and report in {}", out.display());
    Ok(())
}

/// The job run alone, then killed `kills` times and resumed; the comparison.
fn compare(
    exe: &Path,
    dir: &Path,
    mode: &'static str,
    config: &[String],
    kills: usize,
    rng: &mut StdRng,
) -> anyhow::Result<Row> {
    let (alone, killed) = (dir.join("alone"), dir.join("killed"));
    for old in [&alone, &killed] {
        if old.exists() {
            std::fs::remove_dir_all(old)?;
        }
    }
    eprintln!("[{mode}] the job alone");
    let started = Instant::now();
    let status = train(exe, config, Some(&alone), None)?.wait()?;
    let alone_s = started.elapsed().as_secs_f64();
    if !status.success() {
        bail!("the {mode} run alone failed: see {}", alone.display());
    }
    // The kill moments: points of the run's own clock (the time of the run left alone: a
    // resumed process goes on from its checkpoint's time), uniform over the length of the run
    // left alone, each a random part of a second later, so that they fall in warm-up,
    // generation, training and checkpoints alike, wherever the run spends its time.
    let mut moments: Vec<f64> = (0..kills).map(|_| rng.random_range(0.0..alone_s)).collect();
    moments.sort_by(f64::total_cmp);
    let (mut done, mut early_kills, mut resumes, mut resume_errors) = (0, 0, 0, 0);
    // every step record ever written, told apart by its wall time: those written again after
    // a kill are the steps trained again
    let mut written = HashSet::new();
    let started = Instant::now();
    let mut finished = false;
    // each moment a process killed, then one that runs to the end
    let plan = moments.iter().copied().map(Some).chain([None]);
    for (k, moment) in plan.enumerate() {
        // killed before it made its run folder: started again, as its first command
        let mut child = if !killed.join("config.toml").exists() {
            train(exe, config, Some(&killed), None)?
        } else {
            resumes += 1;
            train(exe, &[], None, Some(&killed))?
        };
        let Some(moment) = moment else {
            let status = child.wait()?;
            resume_errors += usize::from(!status.success());
            finished = status.success();
            break;
        };
        let extra = Duration::from_secs_f64(rng.random_range(0.0..1.0));
        let started_at = Instant::now();
        // this process's clock starts where its checkpoint's left off
        let from = checkpoint_clock(&killed);
        match kill_at(&mut child, moment - from, extra)? {
            Some(status) => {
                // it ended before the kill: the run is done (or a resume failed)
                resume_errors += usize::from(!status.success());
                finished = status.success();
                eprintln!("[{mode}] ended by itself after {k} kills");
                break;
            }
            None => {
                done += 1;
                let recorded = step_records(&killed);
                let steps = recorded.len();
                early_kills += usize::from(steps == 0);
                written.extend(recorded);
                eprintln!(
                    "[{mode}] kill {done}: at {:.1} s of the run, {:.1} s into its process, {steps} steps recorded, newest checkpoint at step {}",
                    moment,
                    started_at.elapsed().as_secs_f64(),
                    newest_step(&killed)
                );
            }
        }
    }
    if !finished {
        bail!(
            "the {mode} run killed {done} times did not end: see {}",
            killed.display()
        );
    }
    let killed_s = started.elapsed().as_secs_f64();
    let last = step_records(&killed);
    let final_steps = last.len();
    written.extend(last);
    let redone = (written.len() - final_steps) as u64;
    let (a, b) = (steps(&alone)?, steps(&killed)?);
    let numbers: Vec<u64> = b.iter().map(|s| s.0).collect();
    let mut unique = numbers.clone();
    unique.sort_unstable();
    unique.dedup();
    let mut seen = HashSet::new();
    let duplicated = b
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .filter(|id| !seen.insert(*id))
        .count();
    let other_steps =
        a.iter().zip(&b).filter(|(x, y)| x.1 != y.1).count() + a.len().abs_diff(b.len());
    let summary = read_json(&killed.join("summary.json"))?;
    let n = |s: &Value, k: &str| s[k].as_u64().unwrap_or(0);
    let lost = n(&summary, "samples_admitted") as i64
        - (n(&summary, "samples_trained")
            + n(&summary, "samples_dropped")
            + n(&summary, "samples_pending")) as i64;
    let alone_summary = read_json(&alone.join("summary.json"))?;
    Ok(Row {
        mode,
        kills: done,
        early_kills,
        resumes,
        resume_errors,
        steps: numbers.len(),
        steps_twice: numbers.len() - unique.len(),
        redone,
        weights_alone: weights_sha256(&alone)?,
        weights_killed: weights_sha256(&killed)?,
        other_steps,
        lost,
        duplicated,
        alone_s,
        killed_s,
        checkpoint_ms: alone_summary["checkpoint_ms_mean"].as_f64().unwrap_or(0.0),
        checkpoint_ms_max: alone_summary["checkpoint_ms_max"].as_f64().unwrap_or(0.0),
        checkpoint_bytes: n(&alone_summary, "checkpoint_bytes"),
    })
}

/// `areal train -q` of `config` into `out`, or `--resume` of `resume`, in the background.
fn train(
    exe: &Path,
    config: &[String],
    out: Option<&Path>,
    resume: Option<&Path>,
) -> anyhow::Result<Child> {
    let mut command = Command::new(exe);
    command.args(["train", "-q"]).args(config);
    if let Some(out) = out {
        command.arg("--out").arg(out);
    }
    if let Some(run) = resume {
        command.arg("--resume").arg(run);
    }
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .env_remove("AREAL_FAILPOINT")
        .spawn()
        .context("cannot start areal train")
}

/// Wait `after` seconds (none if it is negative), then `extra` more, and SIGKILL `child`;
/// its status if it ended first.
fn kill_at(
    child: &mut Child,
    after: f64,
    extra: Duration,
) -> anyhow::Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + Duration::from_secs_f64(after.max(0.0)) + extra;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill()?;
    child.wait()?;
    Ok(None)
}

/// The run's clock at its newest checkpoint (its `elapsed_s`; 0 without one): where a
/// resumed process's clock starts.
fn checkpoint_clock(run: &Path) -> f64 {
    let newest = std::fs::read_dir(run.join("checkpoints"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (kind, n) = name.split_once('-')?;
            let rank = match kind {
                "warmup" => 0,
                "step" => 1,
                _ => return None,
            };
            Some(((rank, n.parse::<u64>().ok()?), e.path()))
        })
        .max_by_key(|(key, _)| *key);
    newest
        .and_then(|(_, dir)| read_json(&dir.join("state.json")).ok())
        .and_then(|state| state["elapsed_s"].as_f64())
        .unwrap_or(0.0)
}

/// The step records in a run's `metrics.jsonl` now, as (step, bits of its wall time).
fn step_records(run: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["event"] == "step")
        .map(|r| {
            let wall = r["wall_s"].as_f64().unwrap_or(0.0);
            (r["step"].as_u64().unwrap_or(0), wall.to_bits())
        })
        .collect()
}

/// The step of a run's newest RL checkpoint (0 when it has none).
fn newest_step(run: &Path) -> u64 {
    std::fs::read_dir(run.join("checkpoints"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_prefix("step-")?.parse::<u64>().ok()
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Each step's number and the sample ids it trained.
fn steps(run: &Path) -> anyhow::Result<Vec<(u64, Vec<u64>)>> {
    let path = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let record: Value = serde_json::from_str(line)
            .with_context(|| format!("{}: a line is not JSON", path.display()))?;
        if record["event"] != "step" {
            continue;
        }
        let ids = record["sample_ids"]
            .as_array()
            .map(|ranges| {
                ranges
                    .iter()
                    .flat_map(|r| r[0].as_u64().unwrap_or(0)..r[1].as_u64().unwrap_or(0))
                    .collect()
            })
            .unwrap_or_default();
        out.push((record["step"].as_u64().unwrap_or(0), ids));
    }
    Ok(out)
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// The sha256 of the final model's files (`checkpoint/`, in name order).
fn weights_sha256(run: &Path) -> anyhow::Result<String> {
    let dir = run.join("checkpoint");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let mut hash = Sha256::new();
    for file in files {
        hash.update(std::fs::read(&file)?);
    }
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A short run of a transformer of about `params` parameters with a checkpoint at every step:
/// its checkpoint time and size, and its parameter count.
fn large_model(exe: &Path, dir: &Path, params: u64) -> anyhow::Result<(u64, f64, f64, u64)> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    // ~11.3 · hidden² parameters a layer (attention with 2 key/value heads, SwiGLU), 6 layers
    let layers = 6u64;
    let hidden = (((params / layers) as f64 / 11.3).sqrt() / 64.0)
        .round()
        .max(1.0) as u64
        * 64;
    eprintln!("[large] a transformer of hidden size {hidden}, {layers} layers");
    let sets = [
        format!("policy.hidden_size={hidden}"),
        format!("policy.layers={layers}"),
        format!("policy.heads={}", hidden / 64),
        "policy.kv_heads=2".to_owned(),
        "warmup.enabled=false".to_owned(),
        "eval.enabled=false".to_owned(),
        "train.steps=4".to_owned(),
        "checkpoint.every=1".to_owned(),
        "rollout.batch_size=2".to_owned(),
        "rollout.group_size=2".to_owned(),
        "rollout.max_new_tokens=16".to_owned(),
    ];
    let config: Vec<String> = sets
        .iter()
        .flat_map(|s| ["--set".to_owned(), s.clone()])
        .collect();
    let status = train(exe, &config, Some(dir), None)?.wait()?;
    if !status.success() {
        bail!("the large-model run failed: see {}", dir.display());
    }
    let summary = read_json(&dir.join("summary.json"))?;
    let parameters = std::fs::metadata(dir.join("checkpoint/model.safetensors"))?.len() / 4;
    Ok((
        parameters,
        summary["checkpoint_ms_mean"].as_f64().unwrap_or(0.0),
        summary["checkpoint_ms_max"].as_f64().unwrap_or(0.0),
        summary["checkpoint_bytes"].as_u64().unwrap_or(0),
    ))
}

fn report(args: &BenchResumeArgs, rows: &[Row], large: Option<&(u64, f64, f64, u64)>) -> String {
    let mut r = String::new();
    let _ = writeln!(
        r,
        "## areal bench resume: {} random SIGKILLs per run (kill seed {})\n",
        args.kills, args.kill_seed
    );
    let _ = writeln!(
        r,
        "| mode | kills (before RL) | resumes (failed) | steps (twice) | steps trained again | final weights sha256, alone / killed | same | steps with other samples | samples lost | trained twice | alone s | killed s |"
    );
    let _ = writeln!(r, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let _ = writeln!(
            r,
            "| {} | {} ({}) | {} ({}) | {} ({}) | {} | {}… / {}… | {} | {} | {} | {} | {:.0} | {:.0} |",
            row.mode,
            row.kills,
            row.early_kills,
            row.resumes,
            row.resume_errors,
            row.steps,
            row.steps_twice,
            row.redone,
            &row.weights_alone[..12],
            &row.weights_killed[..12],
            if row.weights_alone == row.weights_killed {
                "yes"
            } else {
                "no"
            },
            row.other_steps,
            row.lost,
            row.duplicated,
            row.alone_s,
            row.killed_s
        );
    }
    let _ = writeln!(
        r,
        "\nsteps trained again: step records written by a process after the checkpoint it was later resumed from. steps with other samples: steps whose sample ids differ from the run left alone (0 in deterministic mode; by default which samples make a batch depends on timing). samples lost: admitted but neither trained, dropped nor pending at the end. trained twice: sample ids in two steps' batches."
    );
    let _ = writeln!(
        r,
        "\n| model | parameters | checkpoint ms (mean / max) | largest checkpoint MB |"
    );
    let _ = writeln!(r, "|---|---|---|---|");
    if let Some(row) = rows.first() {
        let _ = writeln!(
            r,
            "| the job's | — | {:.1} / {:.1} | {:.2} |",
            row.checkpoint_ms,
            row.checkpoint_ms_max,
            row.checkpoint_bytes as f64 / 1e6
        );
    }
    if let Some((params, mean, max, bytes)) = large {
        let _ = writeln!(
            r,
            "| transformer | {:.1} M | {mean:.1} / {max:.1} | {:.2} |",
            *params as f64 / 1e6,
            *bytes as f64 / 1e6
        );
    }
    r
}
