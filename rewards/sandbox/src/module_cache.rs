//! Compiled modules and components, cached on disk and checked before they are loaded.

use std::hash::{Hash, Hasher};
use std::path::Path;
use std::time::Instant;

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

use crate::guest::{hex, sha256_file};
use crate::run::{SandboxError, wasmtime_version};

/// Load the compiled module `key` from the cache, or produce its wasm, compile it and store
/// it. The file name holds the key (which names the interpreter's sha256 and whatever else
/// shapes the module), wasmtime's version and a hash of every engine setting that changes the
/// machine code; the file's own sha256 is checked before it is loaded.
pub(crate) fn load_or_compile<A: Artifact>(
    engine: &Engine,
    key: &str,
    cache_dir: &Path,
    wasm: impl FnOnce() -> Result<Vec<u8>, SandboxError>,
) -> Result<A, SandboxError> {
    let mut settings = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut settings);
    let key = format!(
        "{key}-wasmtime{}-{:016x}",
        wasmtime_version(),
        settings.finish()
    );
    let file = cache_dir.join(format!("{key}.cwasm"));
    let sum = cache_dir.join(format!("{key}.sha256"));
    let cache_err = |path: &Path, source: std::io::Error| SandboxError::Cache {
        path: path.to_path_buf(),
        source,
    };
    if let (Ok(actual), Ok(expected)) = (sha256_file(&file), std::fs::read_to_string(&sum))
        && actual == expected.trim()
    {
        // SAFETY: the file was written by `precompile_module` of an engine with these exact
        // settings (the key says so) and its sha256 matches the one written beside it, so it
        // is the artefact wasmtime produced, not arbitrary bytes.
        #[allow(
            unsafe_code,
            reason = "a precompiled artefact is loaded only after its sha256 is checked"
        )]
        let module = unsafe { A::deserialize_file(engine, &file) };
        match module {
            Ok(m) => return Ok(m),
            Err(e) => tracing::warn!("{}: {e:#}; recompiling", file.display()),
        }
    }
    let wasm = wasm()?;
    let started = Instant::now();
    tracing::info!("compiling {key} (once; cached in {})", cache_dir.display());
    let compiled = A::precompile(engine, &wasm)?;
    std::fs::create_dir_all(cache_dir).map_err(|e| cache_err(cache_dir, e))?;
    let tmp = tempfile::NamedTempFile::new_in(cache_dir).map_err(|e| cache_err(cache_dir, e))?;
    std::fs::write(tmp.path(), &compiled).map_err(|e| cache_err(tmp.path(), e))?;
    tmp.persist(&file).map_err(|e| cache_err(&file, e.error))?;
    std::fs::write(&sum, hex(&Sha256::digest(&compiled))).map_err(|e| cache_err(&sum, e))?;
    tracing::info!("compiled in {:.1} s", started.elapsed().as_secs_f64());
    // SAFETY: as above; we wrote this file from `precompile_module` a moment ago.
    #[allow(
        unsafe_code,
        reason = "a precompiled artefact is loaded only after its sha256 is checked"
    )]
    let module = unsafe { A::deserialize_file(engine, &file) }?;
    Ok(module)
}

/// What [`load_or_compile`] caches: a core module or a component.
pub(crate) trait Artifact: Sized {
    fn precompile(engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Vec<u8>>;
    /// # Safety
    /// `path` must hold what [`Artifact::precompile`] wrote for an engine of these settings.
    #[allow(
        unsafe_code,
        reason = "wasmtime's deserialisation of a precompiled artefact is unsafe"
    )]
    unsafe fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Self>;
}

impl Artifact for Module {
    fn precompile(engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Vec<u8>> {
        engine.precompile_module(wasm)
    }
    #[allow(
        unsafe_code,
        reason = "wasmtime's deserialisation of a precompiled artefact is unsafe"
    )]
    unsafe fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Self> {
        // SAFETY: the caller's promise.
        unsafe { Module::deserialize_file(engine, path) }
    }
}

impl Artifact for wasmtime::component::Component {
    fn precompile(engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Vec<u8>> {
        engine.precompile_component(wasm)
    }
    #[allow(
        unsafe_code,
        reason = "wasmtime's deserialisation of a precompiled artefact is unsafe"
    )]
    unsafe fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Self> {
        // SAFETY: the caller's promise.
        unsafe { wasmtime::component::Component::deserialize_file(engine, path) }
    }
}
