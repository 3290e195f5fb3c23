//! Weights through a shared filesystem: the client writes each version once as a checkpoint
//! folder in the Hugging Face layout (`v<version>/model.safetensors` and `config.json`), and
//! every server reads it: a generator server on `LoadWeights`, checking the version and the
//! sha256 the client computed; an SGLang or vLLM server (or `areal serve generator --api`) on
//! its load-from-disk route.
//!
//! With an adapter (LoRA), its frozen base is written once as `base-<sha256 prefix>/` (a
//! checkpoint folder) and each version as `v<version>/adapter_config.json` and
//! `adapter_model.safetensors`, PEFT's files, which the servers' load-adapter routes read.

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

/// PEFT's adapter configuration file.
pub(crate) const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// PEFT's adapter weights file.
pub(crate) const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// The folder of `version` under `dir`.
pub(crate) fn folder(dir: &Path, version: u64) -> PathBuf {
    dir.join(format!("v{version:010}"))
}

/// The name a base of sha256 `sha256` goes by: its folder, and the weight version a server
/// holding it reports.
pub(crate) fn base_tag(sha256: &str) -> String {
    format!("base-{}", &sha256[..sha256.len().min(16)])
}

/// Where `update` was written.
#[derive(Clone, Debug)]
pub(crate) struct Written {
    /// The version's folder: a checkpoint, or (with an adapter) PEFT's adapter files.
    pub(crate) folder: PathBuf,
    /// With an adapter: its base's folder and tag ([`base_tag`]).
    pub(crate) base: Option<(PathBuf, String)>,
}

/// Write `files` into `folder`, whole or not at all (staged in a hidden folder of `dir`, then
/// renamed over whatever was there).
fn staged(
    dir: &Path,
    folder: &Path,
    files: impl FnOnce(&Path) -> Result<(), FolderError>,
) -> Result<(), FolderError> {
    let staged = tempfile::Builder::new()
        .prefix(".staging-")
        .tempdir_in(dir)
        .map_err(io(dir))?;
    files(staged.path())?;
    if folder.exists() {
        std::fs::remove_dir_all(folder).map_err(io(folder))?;
    }
    let staged = staged.keep();
    std::fs::rename(&staged, folder).map_err(io(folder))
}

/// Write `update` under `dir` as `v<version>`, whole or not at all; with an adapter, its base
/// too unless it is there (`base_sha256` names it). Older versions stay: see
/// [`remove_except`].
pub(crate) fn write(
    dir: &Path,
    update: &WeightUpdate,
    base_sha256: Option<&str>,
) -> Result<Written, FolderError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let folder = folder(dir, update.version);
    let metadata = HashMap::from([(VERSION_KEY.to_owned(), update.version.to_string())]);
    let checkpoint = |path: &Path, metadata: &HashMap<String, String>| {
        write_safetensors(&path.join(WEIGHTS_FILE), &update.tensors, metadata)?;
        let config = path.join(CONFIG_FILE);
        std::fs::write(&config, update.architecture.to_string()).map_err(io(&config))
    };
    let (Some(adapter), Some(sha)) = (&update.adapter, base_sha256) else {
        staged(dir, &folder, |path| checkpoint(path, &metadata))?;
        return Ok(Written { folder, base: None });
    };
    let tag = base_tag(sha);
    let base = dir.join(&tag);
    if !base.join(WEIGHTS_FILE).is_file() {
        let metadata = HashMap::from([(BASE_KEY.to_owned(), sha.to_owned())]);
        staged(dir, &base, |path| checkpoint(path, &metadata))?;
    }
    staged(dir, &folder, |path| {
        let config = path.join(ADAPTER_CONFIG_FILE);
        let text = serde_json::to_string_pretty(&adapter.config).expect("json");
        std::fs::write(&config, text).map_err(io(&config))?;
        write_safetensors(
            &path.join(ADAPTER_WEIGHTS_FILE),
            &adapter.tensors,
            &metadata,
        )?;
        Ok(())
    })?;
    Ok(Written {
        folder,
        base: Some((base, tag)),
    })
}

/// The metadata key holding a base's sha256.
const BASE_KEY: &str = "areal.base_sha256";

/// An adapter folder in PEFT's format: its configuration and tensors.
pub(crate) fn read_adapter(path: &Path) -> Result<areal_sdk::Adapter, FolderError> {
    let config = path.join(ADAPTER_CONFIG_FILE);
    let text = areal_sdk::resources::read_file(&config, areal_sdk::resources::MAX_JSON_FILE_BYTES)
        .map_err(io(&config))?;
    let config_json = serde_json::from_slice(&text).map_err(|source| FolderError::Config {
        path: config.clone(),
        source,
    })?;
    let (tensors, _) = read_safetensors(&path.join(ADAPTER_WEIGHTS_FILE))?;
    NamedTensor::check_finite(&tensors).map_err(|what| FolderError::Mismatch {
        path: path.to_owned(),
        what,
    })?;
    Ok(areal_sdk::Adapter {
        config: config_json,
        tensors,
    })
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
            write(dir.path(), &update(v), None).unwrap();
        }
        let folder = write(dir.path(), &update(4), None).unwrap().folder;
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

#[cfg(test)]
mod adapter_tests {
    use super::*;

    /// An adapter's version is PEFT's two files; its base is written once, beside the
    /// versions, and stays when they go.
    #[test]
    fn adapters_are_peft_folders_over_one_base_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let base = Arc::new(vec![NamedTensor {
            name: "w".into(),
            shape: vec![2],
            data: vec![1.0, 2.0],
        }]);
        let sha = areal_proto::weights_sha256(&base);
        let mut bases = Vec::new();
        for v in 0..3u64 {
            let adapter = areal_sdk::Adapter {
                config: serde_json::json!({"r": 1, "target_modules": ["q_proj"]}),
                tensors: vec![NamedTensor {
                    name: "a".into(),
                    shape: vec![1],
                    data: vec![v as f32],
                }],
            };
            let update = WeightUpdate::adapted(v, base.clone(), adapter.clone());
            let written = write(dir.path(), &update, Some(&sha)).unwrap();
            assert_eq!(read_adapter(&written.folder).unwrap(), adapter);
            bases.push(written.base.unwrap());
        }
        assert!(bases.windows(2).all(|w| w[0] == w[1]));
        let (folder, tag) = &bases[0];
        assert_eq!(*tag, base_tag(&sha));
        let (tensors, _, _) = read_checkpoint(folder).unwrap();
        assert_eq!(tensors, *base);
        assert_eq!(remove_except(dir.path(), &[2]).unwrap(), [0, 1]);
        assert!(folder.exists());
    }
}
