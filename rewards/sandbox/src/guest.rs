//! The guest interpreter: a WASI CPython built by `make python-wasi`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Environment variable naming the folder of the interpreter (default: `.cache/python-wasi`
/// of the checkout).
pub const INTERPRETER_ENV: &str = "AREAL_PYTHON_WASI";

/// Why the interpreter could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InterpreterError {
    /// No interpreter where it was looked for.
    #[error(
        "no WASI Python interpreter at {0}: build it with `make python-wasi` \
         (or point {INTERPRETER_ENV} at a folder with python.wasm, lib/python3.11 and SHA256SUMS)"
    )]
    Missing(PathBuf),
    /// The binary uses instructions the sandbox cannot stop safely.
    #[error(
        "{path}: uses bulk-memory instructions ({instruction}), which wasmtime runs as host \
         code touching the guest's memory: the sandbox could not stop it safely when its time \
         is up; build the interpreter with `make python-wasi` (no -mbulk-memory)"
    )]
    BulkMemory {
        /// The binary.
        path: PathBuf,
        /// The first such instruction found.
        instruction: &'static str,
    },
    /// The binary is not the one its checksum file names.
    #[error(
        "{path}: sha256 is {actual} but SHA256SUMS says {expected}; rebuild with `make python-wasi`"
    )]
    Checksum {
        /// The binary.
        path: PathBuf,
        /// What SHA256SUMS says.
        expected: String,
        /// What it is.
        actual: String,
    },
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// A verified interpreter install: `python.wasm`, `areal-guest.wasm` (the same interpreter
/// as a reactor, for pre-initialisation), the standard library, their sha256.
#[derive(Clone, Debug)]
pub struct Interpreter {
    root: PathBuf,
    sha256: String,
    reactor_sha256: String,
}

impl Interpreter {
    /// The interpreter in `$AREAL_PYTHON_WASI`, else in `.cache/python-wasi` of the current
    /// folder or of one above it, else of the checkout this crate was built from.
    pub fn locate() -> Result<Self, InterpreterError> {
        if let Some(dir) = std::env::var_os(INTERPRETER_ENV) {
            return Self::open(dir);
        }
        let mut candidates = Vec::new();
        if let Ok(cwd) = std::env::current_dir() {
            candidates.extend(cwd.ancestors().map(|d| d.join(".cache/python-wasi")));
        }
        let built_from = Path::new(env!("CARGO_MANIFEST_DIR"));
        candidates.extend(built_from.ancestors().map(|d| d.join(".cache/python-wasi")));
        let found = candidates.iter().find(|d| d.join("python.wasm").is_file());
        match found {
            Some(dir) => Self::open(dir),
            None => Err(InterpreterError::Missing(
                std::env::current_dir()
                    .unwrap_or_default()
                    .join(".cache/python-wasi"),
            )),
        }
    }

    /// The interpreter in `dir`, checked against its `SHA256SUMS`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, InterpreterError> {
        let root = dir.as_ref().to_path_buf();
        let wasm = root.join("python.wasm");
        if !wasm.is_file() || !root.join("lib/python3.11").is_dir() {
            return Err(InterpreterError::Missing(root));
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| InterpreterError::Io { path, source }
        };
        let sums = root.join("SHA256SUMS");
        let listed = std::fs::read_to_string(&sums).map_err(io(&sums))?;
        let verify = |name: &str| {
            let path = root.join(name);
            if !path.is_file() {
                return Err(InterpreterError::Missing(root.clone()));
            }
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let actual = hex(&Sha256::digest(&bytes));
            let expected = listed
                .lines()
                .find_map(|l| l.strip_suffix(&format!("  {name}")))
                .unwrap_or("")
                .to_owned();
            if expected != actual {
                return Err(InterpreterError::Checksum {
                    path,
                    expected,
                    actual,
                });
            }
            Ok(actual)
        };
        Ok(Self {
            sha256: verify("python.wasm")?,
            reactor_sha256: verify("areal-guest.wasm")?,
            root,
        })
    }

    /// `python.wasm`.
    pub fn wasm(&self) -> PathBuf {
        self.root.join("python.wasm")
    }

    /// `areal-guest.wasm`, the reactor build that pre-initialised sandboxes snapshot.
    pub fn reactor(&self) -> PathBuf {
        self.root.join("areal-guest.wasm")
    }

    /// The reactor build's sha256 (hex).
    pub fn reactor_sha256(&self) -> &str {
        &self.reactor_sha256
    }

    /// The standard library, mounted read-only in the guest at `/usr/local/lib/python3.11`.
    pub fn stdlib(&self) -> PathBuf {
        self.root.join("lib/python3.11")
    }

    /// The interpreter's sha256 (hex), recorded in every reward's provenance.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
