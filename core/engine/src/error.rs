//! Errors of the engine.

use std::path::PathBuf;

use areal_sdk::{BoxError, PluginError};

/// Why a run failed. [`EngineError::Setup`], [`EngineError::Build`] and
/// [`EngineError::RunFolderInUse`] are the user's to fix; [`EngineError::Internal`] is a
/// bug (in a plugin or the engine); the others carry the failure that caused them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    #[error("cannot save the checkpoint to {} ({attempts} attempts over {seconds:.0} s; checkpoint.retry_s)", path.display())]
    Checkpoint {
        /// Where it was to be saved.
        path: PathBuf,
        /// Attempts made.
        attempts: u32,
        /// Seconds spent trying.
        seconds: f64,
        /// The last failure.
        #[source]
        source: BoxError,
    },
    /// Another run holds the run folder.
    #[error("run folder {} is in use by another run (it holds {}); give this run its own --out", dir.display(), lock.display())]
    RunFolderInUse {
        /// The run folder.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
    },
    /// A new run was given a folder that already holds something: nothing there is touched.
    #[error("run folder {} is not empty (it holds {}): go on with the run there with `areal train --resume {}`, start it again with --overwrite (which deletes only what a run writes there), or give this run its own --out", dir.display(), entries.join(", "), dir.display())]
    RunFolderNotEmpty {
        /// The run folder.
        dir: PathBuf,
        /// Some of what it holds (the first few names, sorted).
        entries: Vec<String>,
    },
    /// The config and its plugins cannot make a run (a task with an empty train split, no
    /// demonstrations to warm up on): the message says what to change.
    #[error("{message}")]
    Setup {
        /// What is wrong and what to change.
        message: String,
    },
    /// Reward worker processes (`reward_service.workers`) cannot be started or watched.
    #[error("{message}")]
    Workers {
        /// What was being done, naming the key.
        message: String,
        /// Why.
        #[source]
        source: crate::processes::ProcessError,
    },
    /// A run folder cannot be resumed as asked (no run there, a config that differs, records
    /// shorter than its checkpoint): the message says why and what to do.
    #[error("{message}")]
    Resume {
        /// Why, and what to do.
        message: String,
    },
    /// Data handed between parts of the run is inconsistent: a bug in a plugin (the message
    /// names it) or in the engine.
    #[error("{message}")]
    Internal {
        /// What was inconsistent.
        message: String,
    },
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

    /// A problem of the user's setup.
    pub fn setup(message: impl Into<String>) -> Self {
        Self::Setup {
            message: message.into(),
        }
    }

    /// A run that cannot be resumed as asked.
    pub fn resume(message: impl Into<String>) -> Self {
        Self::Resume {
            message: message.into(),
        }
    }

    /// A broken contract between parts of the run.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal {
            message: message.into(),
        }
    }
}

/// An error and its causes on one line, `outer: cause: root cause`, for log lines and
/// messages that are stored as text (a verifier's failure in a sample's reward).
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // a message that already quotes its cause is not repeated
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_keeps_every_cause_once() {
        let io = std::io::Error::other("disk full");
        let plugin = PluginError::caused_by("transformer", "cannot write model.safetensors", io);
        let error = EngineError::plugin("saving the checkpoint", plugin);
        assert_eq!(
            chain(&error),
            "saving the checkpoint: transformer: cannot write model.safetensors: disk full"
        );
        let quoted = EngineError::plugin("x", PluginError::failed("p", "y"));
        assert_eq!(chain(&quoted), "x: p: y");
    }
}
