//! The run folder's records: `metrics.jsonl`, TensorBoard events and the accuracy plot.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::config::Config;
use crate::error::EngineError;
use crate::metrics::MetricsWriter;
use crate::plot::{Series, accuracy_plot};
use crate::tensorboard::EventWriter;

/// Name of the plot in a run folder.
pub(crate) const PLOT_FILE: &str = "accuracy.png";

/// Name of the lock file of a run folder.
pub(crate) const LOCK_FILE: &str = "run.lock";

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
    /// Create the run folder with the resolved config, or a log that writes nothing.
    pub(crate) fn new(dir: Option<&Path>, config: &Config) -> Result<Self, EngineError> {
        let Some(dir) = dir else {
            return Ok(Self::default());
        };
        std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
        let lock = lock(dir)?;
        let path = dir.join("config.toml");
        crate::atomic::write(&path, config.to_toml().as_bytes())
            .map_err(|e| EngineError::io(path, e))?;
        let path = dir.join("metrics.jsonl");
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
        .map_err(|e| EngineError::io(path, e))
    }
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
