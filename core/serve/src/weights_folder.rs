//! Weights through a shared filesystem: the client writes each version once as a checkpoint
//! folder in the Hugging Face layout (`v<version>/model.safetensors` and `config.json`), and
//! every server reads it: a generator server on `LoadWeights`, checking the version and the
//! sha256 the client computed; an SGLang or vLLM server (or `areal serve generator --api`) on
//! its load-from-disk route.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use areal_sdk::{NamedTensor, WeightUpdate};
use areal_sdk_train::weights_file::{WeightsFileError, read_safetensors, write_safetensors};

/// Why a version's folder cannot be written, listed or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FolderError {
    /// A file or folder cannot be made, read, moved or listed.
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The weights file cannot be written or read.
    #[error(transparent)]
    Weights(#[from] WeightsFileError),
    /// `config.json` is not JSON.
    #[error("{}", path.display())]
    Config {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The folder is not the one the sender meant.
    #[error("{}: {what}", path.display())]
    Mismatch { path: PathBuf, what: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FolderError + '_ {
    move |source| FolderError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The weights file of a folder.
const WEIGHTS_FILE: &str = "model.safetensors";
/// The architecture of a folder.
const CONFIG_FILE: &str = "config.json";
/// The metadata key holding the version.
const VERSION_KEY: &str = "areal.version";

/// The folder of `version` under `dir`.
pub(crate) fn folder(dir: &Path, version: u64) -> PathBuf {
    dir.join(format!("v{version:010}"))
}

/// Write `update` under `dir` as `v<version>`, whole or not at all (staged in a hidden folder,
/// then renamed); the folder written. Older versions stay: see [`remove_except`].
pub(crate) fn write(dir: &Path, update: &WeightUpdate) -> Result<PathBuf, FolderError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let folder = folder(dir, update.version);
    let staged = tempfile::Builder::new()
        .prefix(".staging-")
        .tempdir_in(dir)
        .map_err(io(dir))?;
    let metadata = HashMap::from([(VERSION_KEY.to_owned(), update.version.to_string())]);
    write_safetensors(
        &staged.path().join(WEIGHTS_FILE),
        &update.tensors,
        &metadata,
    )?;
    let config = staged.path().join(CONFIG_FILE);
    std::fs::write(&config, update.architecture.to_string()).map_err(io(&config))?;
    if folder.exists() {
        std::fs::remove_dir_all(&folder).map_err(io(&folder))?;
    }
    let staged = staged.keep();
    std::fs::rename(&staged, &folder).map_err(io(&folder))?;
    Ok(folder)
}

/// The versions written under `dir`, oldest first, with their folders.
fn versions(dir: &Path) -> Result<Vec<(u64, PathBuf)>, FolderError> {
    let mut versions: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let digits = name.strip_prefix('v')?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some((digits.parse().ok()?, p))
        })
        .collect();
    versions.sort();
    Ok(versions)
}

fn remove(folder: &Path) {
    // a server still reading it keeps its open file; a failure here costs disk only
    if let Err(e) = std::fs::remove_dir_all(folder) {
        tracing::warn!(target: "areal::remote", folder = %folder.display(), error = %e, "cannot remove old weights");
    }
}

/// Remove every version under `dir` but those in `keep`; the versions removed.
pub(crate) fn remove_except(dir: &Path, keep: &[u64]) -> Result<Vec<u64>, FolderError> {
    let mut removed = Vec::new();
    for (version, folder) in versions(dir)? {
        if !keep.contains(&version) {
            remove(&folder);
            removed.push(version);
        }
    }
    Ok(removed)
}

/// The tensors and architecture of a checkpoint folder (`model.safetensors` and
/// `config.json`), and the version areal-rs wrote into it, if any.
pub(crate) fn read_checkpoint(
    path: &Path,
) -> Result<(Vec<NamedTensor>, serde_json::Value, Option<u64>), FolderError> {
    let (tensors, metadata) = read_safetensors(&path.join(WEIGHTS_FILE))?;
    let config = path.join(CONFIG_FILE);
    let text = areal_sdk::resources::read_file(&config, areal_sdk::resources::MAX_JSON_FILE_BYTES)
        .map_err(io(&config))?;
    let architecture = serde_json::from_slice(&text).map_err(|source| FolderError::Config {
        path: config.clone(),
        source,
    })?;
    let version = metadata.get(VERSION_KEY).and_then(|v| v.parse().ok());
    Ok((tensors, architecture, version))
}

/// Read the folder at `path`, which must hold `version` with the tensors whose sha256 is
/// `sha256`.
pub(crate) fn read(path: &Path, version: u64, sha256: &str) -> Result<WeightUpdate, FolderError> {
    let mismatch = |what: String| FolderError::Mismatch {
        path: path.to_owned(),
        what,
    };
    let (tensors, architecture, held) = read_checkpoint(path)?;
    if held != Some(version) {
        return Err(mismatch(format!(
            "holds version {}, not {version}",
            held.map_or("(none)".into(), |v| v.to_string())
        )));
    }
    areal_sdk::NamedTensor::check_finite(&tensors).map_err(mismatch)?;
    let sum = areal_proto::weights_sha256(&tensors);
    if sum != sha256 {
        return Err(mismatch(format!(
            "sha256 {sum} differs from the sender's {sha256}"
        )));
    }
    Ok(WeightUpdate {
        version,
        tensors: Arc::new(tensors),
        architecture: Arc::new(architecture),
        adapter: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(version: u64) -> WeightUpdate {
        WeightUpdate::new(
            version,
            vec![
                NamedTensor {
                    name: "b".into(),
                    shape: vec![2],
                    data: vec![1.0, 2.0],
                },
                NamedTensor {
                    name: "a".into(),
                    shape: vec![1, 3],
                    data: vec![-1.0, 0.5, 3.0],
                },
            ],
        )
        .with_architecture(serde_json::json!({"vocab_size": 3}))
    }

    #[test]
    fn a_version_written_reads_back_and_old_ones_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        for v in 0..4 {
            write(dir.path(), &update(v)).unwrap();
        }
        let folder = write(dir.path(), &update(4)).unwrap();
        assert_eq!(remove_except(dir.path(), &[3, 4]).unwrap(), [0, 1, 2]);
        let sum = areal_proto::weights_sha256(&update(4).tensors);
        let back = read(&folder, 4, &sum).unwrap();
        assert_eq!(back.version, 4);
        assert_eq!(back.tensor("a"), update(4).tensor("a"));
        assert_eq!(back.architecture["vocab_size"], 3);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["v0000000003", "v0000000004"]);
        // the wrong version or checksum is refused, naming the folder
        let e = read(&folder, 5, &sum).unwrap_err();
        assert!(e.to_string().contains("holds version 4, not 5"), "{e}");
        let e = read(&folder, 4, "00").unwrap_err();
        assert!(e.to_string().contains("differs"), "{e}");
        // what no server holds goes; a folder that is not a version stays
        std::fs::create_dir(dir.path().join("vnotes")).unwrap();
        assert_eq!(remove_except(dir.path(), &[4]).unwrap(), [3]);
        assert!(dir.path().join("vnotes").exists() && folder.exists());
    }
}
