//! Errors of the engine.

use std::path::PathBuf;

use areal_sdk::PluginError;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A plugin failed in a way that stops the run.
    #[error("{context}")]
    Plugin {
        /// What the engine was doing.
        context: String,
        /// The plugin's error.
        #[source]
        source: PluginError,
    },
    /// Plugins could not be built; every problem is listed.
    #[error("cannot build the run's plugins:\n{}", errors.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    Build {
        /// One error per failing plugin section.
        errors: Vec<PluginError>,
    },
    /// A file of the run folder could not be written.
    #[error("cannot write {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint could not be saved, even after retrying; nothing of it is left
    /// half-written.
    #[error("cannot save the checkpoint to {} ({attempts} attempts over {seconds:.0} s; checkpoint.retry_s): {message}", path.display())]
    Checkpoint {
        /// Where it was to be saved.
        path: PathBuf,
        /// Attempts made.
        attempts: u32,
        /// Seconds spent trying.
        seconds: f64,
        /// The last failure.
        message: String,
    },
    /// Another run holds the run folder.
    #[error("run folder {} is in use by another run (it holds {}); give this run its own --out", dir.display(), lock.display())]
    RunFolderInUse {
        /// The run folder.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
    },
    /// Data handed between stages is inconsistent (a bug in a plugin or the engine).
    #[error("{0}")]
    Invalid(String),
}

impl EngineError {
    /// A plugin error with what the engine was doing.
    pub fn plugin(context: impl Into<String>, source: PluginError) -> Self {
        Self::Plugin {
            context: context.into(),
            source,
        }
    }

    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
