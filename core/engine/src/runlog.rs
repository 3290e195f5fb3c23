//! The run folder's records: `metrics.jsonl`, TensorBoard events and the accuracy plot.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::Config;
use crate::error::EngineError;
use crate::metrics::MetricsWriter;
use crate::plot::{Series, accuracy_plot, fraction_plot};
use crate::tensorboard::EventWriter;

/// Name of the plot in a run folder.
pub(crate) const PLOT_FILE: &str = "accuracy.png";

/// Name of the plot of tool use in a run folder (runs whose episodes call tools).
pub(crate) const TOOLS_PLOT_FILE: &str = "tools.png";

/// Name of the lock file of a run folder.
pub(crate) const LOCK_FILE: &str = "run.lock";

/// Where a run folder's records had got to when a checkpoint was taken: the byte lengths of
/// the append-only files (a resumed run cuts them back to these, so no record is there twice)
/// and the points of the plot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct LogPosition {
    /// Bytes of `metrics.jsonl`.
    pub(crate) metrics_bytes: u64,
    /// The TensorBoard event file (its name in the run folder) and its bytes.
    pub(crate) events_file: String,
    pub(crate) events_bytes: u64,
    eval_points: Vec<(f64, f64)>,
    warmup_points: Vec<(f64, f64)>,
    rl_start: Option<f64>,
}

/// Everything a run writes as it goes; a no-op without a run folder.
///
/// The folder is locked (`run.lock`, an advisory lock the system drops when the process
/// ends, however it ends) for as long as the log lives: a second run given the same folder
/// refuses to start instead of interleaving its records with the first's. Whole files
/// (`config.toml`, the plot) are written atomically; the append-only records
/// (`metrics.jsonl`, TensorBoard events) one whole record per write.
#[derive(Debug, Default)]
pub(crate) struct RunLog {
    dir: Option<PathBuf>,
    _lock: Option<std::fs::File>,
    jsonl: Option<MetricsWriter>,
    events: Option<EventWriter>,
    eval_points: Vec<(f64, f64)>,
    warmup_points: Vec<(f64, f64)>,
    rl_start: Option<f64>,
}

impl RunLog {
    /// Create the run folder with the resolved config, or a log that writes nothing. A folder
    /// that already holds anything is refused ([`EngineError::RunFolderNotEmpty`]), unless
    /// `overwrite`: then what a run writes there (records, TensorBoard events, plots, the
    /// summary, checkpoints, reward workers' files) is deleted, and nothing else.
    pub(crate) fn new(
        dir: Option<&Path>,
        config: &Config,
        overwrite: bool,
    ) -> Result<Self, EngineError> {
        let Some(dir) = dir else {
            return Ok(Self::default());
        };
        std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
        let lock = lock(dir)?;
        if overwrite {
            remove_run_files(dir)?;
        } else {
            // (a launcher's servers' logs were written for this run, after the same check)
            refuse_unless_empty(dir, true)?;
        }
        write_config(dir, config)?;
        let path = dir.join(METRICS_FILE);
        let jsonl = MetricsWriter::create(&path).map_err(|e| EngineError::io(path, e))?;
        let events = EventWriter::create(dir).map_err(|e| EngineError::io(dir, e))?;
        Ok(Self {
            dir: Some(dir.to_owned()),
            _lock: Some(lock),
            jsonl: Some(jsonl),
            events: Some(events),
            ..Self::default()
        })
    }

    /// Go on with the run folder `dir` from `position` (a checkpoint's): the records written
    /// after it are cut off, and how many steps they held is returned. `config` is written
    /// again (it may have been changed on purpose).
    pub(crate) fn resume(
        dir: &Path,
        config: &Config,
        position: &LogPosition,
    ) -> Result<(Self, u64), EngineError> {
        let lock = lock(dir)?;
        write_config(dir, config)?;
        let path = dir.join(METRICS_FILE);
        // read and cut back only a regular file of the folder's own (a link's target is not)
        let meta = std::fs::symlink_metadata(&path).map_err(|e| EngineError::io(&path, e))?;
        if !meta.file_type().is_file() {
            return Err(EngineError::resume(format!(
                "{} is not a regular file (a symbolic link, a folder, a device): the run folder is damaged",
                path.display()
            )));
        }
        let discarded = steps_after(&path, position.metrics_bytes)?;
        let jsonl = MetricsWriter::resume(&path, position.metrics_bytes)
            .map_err(|e| EngineError::io(&path, e))?;
        let path = dir.join(&position.events_file);
        let events = EventWriter::resume(&path, position.events_bytes)
            .map_err(|e| EngineError::io(&path, e))?;
        // event files of segments that died before their first checkpoint
        for other in event_files(dir)? {
            if other != path {
                std::fs::remove_file(&other).map_err(|e| EngineError::io(&other, e))?;
            }
        }
        Ok((
            Self {
                dir: Some(dir.to_owned()),
                _lock: Some(lock),
                jsonl: Some(jsonl),
                events: Some(events),
                eval_points: position.eval_points.clone(),
                warmup_points: position.warmup_points.clone(),
                rl_start: position.rl_start,
            },
            discarded,
        ))
    }

    /// Where the records are, with everything so far on disk (synced, so that a checkpoint
    /// never points past what a crash leaves).
    pub(crate) fn position(&mut self) -> Result<LogPosition, EngineError> {
        let mut position = LogPosition {
            eval_points: self.eval_points.clone(),
            warmup_points: self.warmup_points.clone(),
            rl_start: self.rl_start,
            ..LogPosition::default()
        };
        if let Some(w) = &mut self.jsonl {
            position.metrics_bytes = w.sync().map_err(|e| EngineError::io(w.path(), e))?;
        }
        if let Some(events) = &mut self.events {
            position.events_bytes = events
                .sync()
                .map_err(|e| EngineError::io(events.path(), e))?;
            position.events_file = file_name(events.path());
        }
        Ok(position)
    }

    /// The run folder, if there is one.
    pub(crate) fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Append a record of `kind` ("step", "eval", "warmup") to `metrics.jsonl` and its numeric
    /// fields as TensorBoard scalars `kind/field` at the record's `step`.
    pub(crate) fn record<T: Serialize>(
        &mut self,
        kind: &str,
        record: &T,
    ) -> Result<(), EngineError> {
        if let Some(w) = &mut self.jsonl {
            w.write(kind, record)
                .map_err(|e| EngineError::io(w.path(), e))?;
        }
        if let Some(events) = &mut self.events {
            let value = serde_json::to_value(record).expect("records serialise");
            let step = value["step"].as_i64().unwrap_or(0);
            let mut scalars = Vec::new();
            flatten(kind, &value, &mut scalars);
            for (tag, v) in scalars {
                events
                    .scalar(&tag, step, v)
                    .map_err(|e| EngineError::io(events.path(), e))?;
            }
            events
                .flush()
                .map_err(|e| EngineError::io(events.path(), e))?;
        }
        Ok(())
    }

    /// Note a held-out accuracy at `wall_s` for the plot.
    pub(crate) fn eval_point(&mut self, wall_s: f64, accuracy: f64) -> Result<(), EngineError> {
        self.eval_points.push((wall_s, accuracy));
        self.plot()
    }

    /// Note a warm-up validation accuracy at `wall_s` for the plot.
    pub(crate) fn warmup_point(&mut self, wall_s: f64, accuracy: f64) {
        self.warmup_points.push((wall_s, accuracy));
    }

    /// RL started at `wall_s`.
    pub(crate) fn rl_started(&mut self, wall_s: f64) {
        self.rl_start = Some(wall_s);
    }

    /// (Re)draw the accuracy plot.
    fn plot(&self) -> Result<(), EngineError> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let mut series = Vec::new();
        if !self.warmup_points.is_empty() {
            series.push(Series {
                label: "warm-up (validation)".into(),
                color: [150, 150, 150],
                points: self.warmup_points.clone(),
            });
        }
        series.push(Series {
            label: "held-out (eval)".into(),
            color: [30, 90, 200],
            points: self.eval_points.clone(),
        });
        let path = dir.join(PLOT_FILE);
        accuracy_plot(
            &path,
            "held-out accuracy, greedy",
            &series,
            self.rl_start.map(|t| (t, "rl")),
        )
        .map_err(|e| EngineError::io(path.clone(), e))?;
        self.plot_tools(dir)
    }

    /// (Re)draw the plot of tool use per step from `metrics.jsonl`, once a step has called a
    /// tool: the share of episodes that called one, the share of calls that failed, and the
    /// reward.
    fn plot_tools(&self, dir: &Path) -> Result<(), EngineError> {
        let metrics = dir.join(METRICS_FILE);
        let Ok(text) = std::fs::read_to_string(&metrics) else {
            return Ok(());
        };
        let steps: Vec<Value> = text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|r| r["event"] == "step")
            .collect();
        let number = |r: &Value, key: &str| r[key].as_f64().unwrap_or(0.0);
        if steps.iter().all(|r| number(r, "tool_calls") == 0.0) {
            return Ok(());
        }
        // steps in which no episode ended say nothing of tool use
        let steps: Vec<&Value> = steps
            .iter()
            .filter(|r| number(r, "episodes") > 0.0)
            .collect();
        let series = |label: &str, color: [u8; 3], y: &dyn Fn(&Value) -> f64| Series {
            label: label.into(),
            color,
            points: steps.iter().map(|r| (number(r, "wall_s"), y(r))).collect(),
        };
        let path = dir.join(TOOLS_PLOT_FILE);
        fraction_plot(
            &path,
            "tool use per step",
            "share",
            &[
                series("calling a tool", [30, 90, 200], &|r| {
                    number(r, "tool_call_fraction")
                }),
                series("calls failed", [200, 60, 40], &|r| {
                    number(r, "tool_errors") / number(r, "tool_calls").max(1.0)
                }),
                series("reward", [60, 160, 60], &|r| number(r, "reward_mean")),
            ],
            None,
        )
        .map_err(|e| EngineError::io(path, e))
    }
}

/// Name of the records file of a run folder.
pub(crate) const METRICS_FILE: &str = "metrics.jsonl";

/// Name of the folder of resume checkpoints of a run folder.
pub(crate) const CHECKPOINTS_DIR: &str = "checkpoints";

/// The final checkpoint's folder in a run folder.
pub(crate) const CHECKPOINT_DIR: &str = "checkpoint";

/// The reward workers' folder in a run folder (their configs, token and logs).
pub(crate) const REWARD_WORKERS_DIR: &str = "reward-workers";

/// Name of the resolved config of a run folder.
pub(crate) const CONFIG_FILE: &str = "config.toml";

/// Name of the summary of a run folder.
pub(crate) const SUMMARY_FILE: &str = "summary.json";

fn write_config(dir: &Path, config: &Config) -> Result<(), EngineError> {
    let path = dir.join(CONFIG_FILE);
    crate::atomic::write(&path, config.to_toml().as_bytes()).map_err(|e| EngineError::io(path, e))
}

/// The folders a run writes at the top of its run folder (the final checkpoint, the resume
/// checkpoints, the reward workers' files).
const RUN_DIRS: [&str; 3] = [CHECKPOINT_DIR, CHECKPOINTS_DIR, REWARD_WORKERS_DIR];

/// The files a run writes at the top of its run folder, besides its TensorBoard events and
/// its lock.
const RUN_FILES: [&str; 5] = [
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    PLOT_FILE,
    TOOLS_PLOT_FILE,
];

/// Delete what a run writes into `dir`, by name, and nothing else: a link among them is removed
/// itself, never followed.
fn remove_run_files(dir: &Path) -> Result<(), EngineError> {
    let remove = |path: &Path| -> Result<(), EngineError> {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return Ok(());
        };
        let removed = if meta.is_dir() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        };
        removed.map_err(|e| EngineError::io(path, e))
    };
    for name in RUN_DIRS.iter().chain(&RUN_FILES) {
        remove(&dir.join(name))?;
    }
    for old in event_files(dir)? {
        remove(&old)?;
    }
    Ok(())
}

/// The folder `areal launch local` writes its servers' logs into, before the run starts in the
/// same folder.
pub const LAUNCH_DIR: &str = "servers";

/// Make `dir` ready for a new run, before anything else writes there (`areal launch local`
/// calls it before its servers' logs go in): refused when it holds anything
/// ([`EngineError::RunFolderNotEmpty`]) unless `overwrite`, which deletes what a run and its
/// launcher write there, and nothing else.
pub fn prepare_run_folder(dir: &Path, overwrite: bool) -> Result<(), EngineError> {
    if !dir.exists() {
        return Ok(());
    }
    if overwrite {
        remove_run_files(dir)?;
        let launched = dir.join(LAUNCH_DIR);
        if std::fs::symlink_metadata(&launched).is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir_all(&launched).map_err(|e| EngineError::io(&launched, e))?;
        }
        return Ok(());
    }
    refuse_unless_empty(dir, false)
}

/// [`EngineError::RunFolderNotEmpty`] when `dir` holds anything besides a run's lock file
/// (which a finished run leaves behind) and, when `launched`, the logs of the servers launched
/// for this run ([`LAUNCH_DIR`]); it names what is there, sorted, at most 5 names, then how
/// many more.
fn refuse_unless_empty(dir: &Path, launched: bool) -> Result<(), EngineError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| EngineError::io(dir, e))? {
        let name = entry.map_err(|e| EngineError::io(dir, e))?.file_name();
        let name = name.to_string_lossy().into_owned();
        if name != LOCK_FILE && !(launched && name == LAUNCH_DIR) {
            names.push(name);
        }
    }
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    if names.len() > 5 {
        let more = names.len() - 5;
        names.truncate(5);
        names.push(format!("{more} more"));
    }
    Err(EngineError::RunFolderNotEmpty {
        dir: dir.to_owned(),
        entries: names,
    })
}

/// The TensorBoard event files areal wrote into `dir`.
fn event_files(dir: &Path) -> Result<Vec<PathBuf>, EngineError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| EngineError::io(dir, e))? {
        let path = entry.map_err(|e| EngineError::io(dir, e))?.path();
        if is_event_file_name(&file_name(&path)) {
            out.push(path);
        }
    }
    Ok(out)
}

/// Whether `name` is the name of a TensorBoard event file in a run folder (what a checkpoint's
/// `log.events_file` may hold): a plain file name, never a path.
pub(crate) fn is_event_file_name(name: &str) -> bool {
    name.starts_with("events.out.tfevents.")
        && name.ends_with(".areal")
        && !name.contains(['/', '\\'])
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// How many step records `path` holds after its first `bytes` bytes; an error naming the file
/// if it is shorter than that (a checkpoint never points past what was synced).
fn steps_after(path: &Path, bytes: u64) -> Result<u64, EngineError> {
    let text = std::fs::read(path).map_err(|e| EngineError::io(path, e))?;
    let Some(rest) = text.get(bytes as usize..) else {
        return Err(EngineError::resume(format!(
            "{} has {} bytes, fewer than the {bytes} its checkpoint recorded",
            path.display(),
            text.len()
        )));
    };
    Ok(rest
        .split(|&b| b == b'\n')
        .filter(|line| {
            serde_json::from_slice::<Value>(line)
                .is_ok_and(|v| v.get("event").and_then(Value::as_str) == Some("step"))
        })
        .count() as u64)
}

/// Take the run folder's lock, or say who holds it.
fn lock(dir: &Path) -> Result<std::fs::File, EngineError> {
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| EngineError::io(&path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(EngineError::RunFolderInUse {
            dir: dir.to_owned(),
            lock: path,
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(EngineError::io(path, e)),
    }
}

/// Numeric leaves of `value` as (`prefix/key[/sub]`, number).
fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, f64)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if k != "step" && k != "event" {
                    flatten(&format!("{prefix}/{k}"), v, out);
                }
            }
        }
        Value::Number(n) => out.extend(n.as_f64().map(|v| (prefix.to_owned(), v))),
        Value::Bool(b) => out.push((prefix.to_owned(), f64::from(u8::from(*b)))),
        _ => {}
    }
}
