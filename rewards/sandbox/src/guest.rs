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
            let actual = sha256_file(&path).map_err(io(&path))?;
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

/// The sha256 (hex) of the file at `path`, read through a small buffer: checking a 26 MB
/// interpreter or module costs no 26 MB allocation, whose page faults every process that
/// starts a sandbox (each reward worker) would pay again.
pub(crate) fn sha256_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 256 << 10];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => return Ok(hex(&hasher.finalize())),
            Ok(n) => hasher.update(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// An interpreter binary, refused if it uses bulk-memory instructions: wasmtime runs them as
/// host code that touches the guest's memory, and the watchdog stops a guest by revoking
/// access to that memory (`watchdog.rs`). (What does not parse is left to wasmtime to report.)
pub(crate) fn read_guest(path: &Path) -> Result<Vec<u8>, InterpreterError> {
    use wasmtime::wasmparser::{Operator, Parser, Payload};
    let wasm = read(path)?;
    let refuse = |instruction| {
        Err(InterpreterError::BulkMemory {
            path: path.to_path_buf(),
            instruction,
        })
    };
    for payload in Parser::new(0).parse_all(&wasm) {
        let Ok(Payload::CodeSectionEntry(body)) = payload else {
            continue;
        };
        let Ok(mut ops) = body.get_operators_reader() else {
            continue;
        };
        while !ops.eof() {
            match ops.read() {
                Ok(Operator::MemoryCopy { .. }) => return refuse("memory.copy"),
                Ok(Operator::MemoryFill { .. }) => return refuse("memory.fill"),
                Ok(Operator::MemoryInit { .. }) => return refuse("memory.init"),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    Ok(wasm)
}

fn read(path: &Path) -> Result<Vec<u8>, InterpreterError> {
    std::fs::read(path).map_err(|source| InterpreterError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(module (memory 1) (func ...))` with the given body's instructions.
    fn module(code: &[u8]) -> Vec<u8> {
        let mut body = vec![0x00]; // no locals
        body.extend_from_slice(code);
        body.push(0x0b);
        let mut section = vec![0x01, u8::try_from(body.len()).unwrap()];
        section.extend(body);
        let mut wasm = b"\0asm\x01\0\0\0".to_vec();
        wasm.extend([0x01, 0x04, 0x01, 0x60, 0x00, 0x00]); // type () -> ()
        wasm.extend([0x03, 0x02, 0x01, 0x00]); // one function of that type
        wasm.extend([0x05, 0x03, 0x01, 0x00, 0x01]); // memory 1
        wasm.extend([0x0a, u8::try_from(section.len()).unwrap()]);
        wasm.extend(section);
        wasm
    }

    #[test]
    fn interpreters_with_bulk_memory_instructions_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("guest.wasm");
        // i32.const 0 ×3; memory.fill 0
        std::fs::write(
            &path,
            module(&[0x41, 0, 0x41, 0, 0x41, 0, 0xfc, 0x0b, 0x00]),
        )
        .unwrap();
        let err = read_guest(&path).unwrap_err().to_string();
        assert!(
            err.contains("memory.fill") && err.contains("make python-wasi"),
            "{err}"
        );
        // i32.const 0; i32.load; drop
        std::fs::write(&path, module(&[0x41, 0, 0x28, 0x02, 0x00, 0x1a])).unwrap();
        assert!(read_guest(&path).is_ok());
    }
}
