//! `areal train`: a run from its config, or a run resumed from its folder.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use areal_core::{Observer, RunOptions};
use clap::Args;

use crate::configs::{ConfigArgs, loader, resume_loader};
use crate::progress::Progress;
use crate::runtime;
use crate::signals::stop_on_signals;

#[derive(Debug, Args)]
pub(crate) struct TrainArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
    /// Run folder; by default `runs/<UTC timestamp>`. A folder that is not empty is refused
    /// (go on with the run there with --resume, or start it again with --overwrite).
    #[arg(long, conflicts_with = "resume")]
    pub(crate) out: Option<PathBuf>,
    /// Start the run afresh in an --out folder that already holds one: what a run writes there
    /// (records, events, plots, summary, checkpoints) is deleted first; nothing else is.
    #[arg(long, requires = "out")]
    pub(crate) overwrite: bool,
    /// Go on with the run in this folder from its newest sound checkpoint, with its own
    /// `config.toml` (a run killed, or stopped by a signal).
    #[arg(long, value_name = "RUN_DIR")]
    pub(crate) resume: Option<PathBuf>,
    /// With --resume: apply --config/--set although they change the run's config (each change
    /// is listed; `policy` and `rollout.group_size` can never change), and go on although the
    /// task's data changed.
    #[arg(long, requires = "resume")]
    pub(crate) allow_config_change: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

/// Run `areal train`; `started` is when the command started (the run's wall time counts
/// from it).
pub(crate) fn run(args: TrainArgs, started: Instant) -> anyhow::Result<()> {
    let loader = match &args.resume {
        Some(dir) => resume_loader(dir, &args.config, args.allow_config_change)?,
        None => loader(&args.config)?,
    };
    let (config, plugins) = areal_core::resolve(&loader)?;
    let out = match (&args.resume, args.out) {
        (Some(dir), _) => dir.clone(),
        (None, Some(out)) => out,
        (None, None) => Path::new("runs").join(utc_timestamp()),
    };
    let steps = config.train.steps;
    let observer: Arc<dyn Observer> = if args.quiet {
        Arc::new(areal_core::Quiet)
    } else {
        let warmup_steps = config.warmup.enabled.then_some(config.warmup.max_steps);
        Arc::new(Progress::new(steps, warmup_steps))
    };
    let runtime = runtime()?;
    let stop = areal_core::StopRequest::new();
    let watch_signals = {
        let _in_runtime = runtime.enter();
        stop_on_signals(stop.clone())
    };
    runtime.spawn(watch_signals);
    let summary = runtime.block_on(areal_core::run(
        config,
        plugins,
        RunOptions {
            out_dir: Some(out.clone()),
            observer: observer.clone(),
            started,
            stop,
            resume: args.resume.is_some(),
            allow_changes: args.allow_config_change,
            overwrite: args.overwrite,
        },
    ))?;
    drop(observer);
    #[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
    {
        let acc = |a: Option<f64>| a.map_or("-".to_owned(), |a| format!("{:.3}", a));
        let warmup = match &summary.warmup {
            Some(w) if w.cached => format!(", warm-up of {:.0} s reused", w.seconds),
            Some(w) => format!(", warm-up {:.0} s included", w.seconds),
            None => String::new(),
        };
        println!(
            "trained {} step{} in {:.1} s{warmup} ({}, η = {}): held-out accuracy {} → {}, reward {:.3} → {:.3}",
            summary.steps,
            if summary.steps == 1 { "" } else { "s" },
            summary.wall_seconds,
            summary.algorithm,
            summary.max_staleness,
            acc(summary.baseline_accuracy),
            acc(summary.final_accuracy),
            summary.reward_mean_first,
            summary.reward_mean_last,
        );
        if summary.resumes > 0 {
            println!(
                "resumed {} time{}",
                summary.resumes,
                if summary.resumes == 1 { "" } else { "s" }
            );
        }
        println!("run folder: {}", out.display());
    }
    if summary.interrupted {
        return Err(Interrupted {
            steps: summary.steps,
            dir: out,
        }
        .into());
    }
    Ok(())
}

/// A run stopped by a signal, its checkpoint and summary saved: exit status 130.
#[derive(Debug, thiserror::Error)]
#[error("interrupted after {steps} steps; the checkpoint and summary are saved; go on with `areal train --resume {}`", dir.display())]
pub(crate) struct Interrupted {
    steps: u64,
    dir: PathBuf,
}

/// `YYYYMMDD-HHMMSS` in UTC.
pub fn utc_timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // civil-from-days (Howard Hinnant's algorithm)
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamp_has_the_documented_shape() {
        let t = super::utc_timestamp();
        assert_eq!(t.len(), 15, "{t}");
        assert_eq!(&t[8..9], "-");
        assert!(
            t[..8].chars().all(|c| c.is_ascii_digit()) && t[..4] >= *"2024",
            "{t}"
        );
    }
}
