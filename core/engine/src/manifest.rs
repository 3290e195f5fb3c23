//! Manifests of checksums: `manifest.json` in a folder the run must be able to trust later (a
//! cached warm-up, a resume checkpoint) lists the sha256 of every other file in it, so that a
//! truncated, edited or half-deleted folder is told from a sound one.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::EngineError;

/// The manifest's name in its folder.
pub(crate) const FILE: &str = "manifest.json";

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Write the manifest of every file under `dir` (sub-folders included, by relative path);
/// the bytes of the folder's files, the manifest included.
pub(crate) fn write(dir: &Path) -> Result<u64, EngineError> {
    let mut sums = BTreeMap::new();
    let mut size = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).map_err(|e| EngineError::io(&folder, e))? {
            let path = entry.map_err(|e| EngineError::io(&folder, e))?.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).map_err(|e| EngineError::io(&path, e))?;
            size += bytes.len() as u64;
            let name = path
                .strip_prefix(dir)
                .expect("under the folder")
                .to_string_lossy()
                .into_owned();
            sums.insert(name, sha256(&bytes));
        }
    }
    let json = serde_json::to_string_pretty(&sums).expect("the manifest serialises");
    let path = dir.join(FILE);
    std::fs::write(&path, &json).map_err(|e| EngineError::io(&path, e))?;
    Ok(size + json.len() as u64)
}

/// Whether every file the manifest of `dir` lists is there with its checksum, and it lists
/// `required`; why not otherwise.
pub(crate) fn verify(dir: &Path, required: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(dir.join(FILE)).map_err(|e| format!("no {FILE}: {e}"))?;
    let manifest: BTreeMap<String, String> =
        serde_json::from_str(&text).map_err(|e| format!("{FILE}: {e}"))?;
    if !manifest.contains_key(required) {
        return Err(format!("{FILE} does not list {required}"));
    }
    for (file, sum) in &manifest {
        let bytes = std::fs::read(dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
        if sha256(&bytes) != *sum {
            return Err(format!("{file} does not match its checksum"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_sound_until_a_file_changes_or_goes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("state.json"), b"{}").unwrap();
        std::fs::create_dir(dir.path().join("trainer")).unwrap();
        std::fs::write(dir.path().join("trainer/weights"), b"1234").unwrap();
        let size = write(dir.path()).unwrap();
        let manifest = std::fs::metadata(dir.path().join(FILE)).unwrap().len();
        assert_eq!(size, 2 + 4 + manifest);
        verify(dir.path(), "state.json").unwrap();
        assert!(
            verify(dir.path(), "other.json")
                .unwrap_err()
                .contains("other.json")
        );
        std::fs::write(dir.path().join("trainer/weights"), b"12").unwrap();
        let e = verify(dir.path(), "state.json").unwrap_err();
        assert_eq!(e, "trainer/weights does not match its checksum");
        std::fs::remove_file(dir.path().join("trainer/weights")).unwrap();
        assert!(
            verify(dir.path(), "state.json")
                .unwrap_err()
                .starts_with("trainer/weights:")
        );
        std::fs::remove_file(dir.path().join(FILE)).unwrap();
        assert!(
            verify(dir.path(), "state.json")
                .unwrap_err()
                .starts_with("no manifest.json")
        );
    }
}
