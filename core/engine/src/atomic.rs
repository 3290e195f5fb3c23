//! Files and folders written whole or not at all: into a temporary name beside the target,
//! synced to disk, then renamed over it. A crash, a kill or a full disk at any moment leaves
//! either the previous version or the new one, never a half-written file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Write `bytes` to `path` atomically (temporary file in the same folder, fsync, rename,
/// fsync of the folder).
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = parent(path);
    let prefix = format!(".{}.", file_name(path));
    let mut tmp = builder(&prefix, 0o666).tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir)
}

/// Fill the folder `target` atomically: `fill` writes into an empty temporary folder beside
/// it; every file is synced, then the folder replaces `target` (a previous `target` is kept
/// until the new one is complete, then removed). On any failure the temporary folder is
/// removed and `target` is as it was.
pub fn write_dir<E>(
    target: &Path,
    fill: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), DirError<E>> {
    let dir = parent(target);
    std::fs::create_dir_all(dir).map_err(|e| DirError::Io(dir.to_owned(), e))?;
    let prefix = format!(".{}.", file_name(target));
    let tmp = builder(&prefix, 0o777)
        .tempdir_in(dir)
        .map_err(|e| DirError::Io(dir.to_owned(), e))?;
    fill(tmp.path()).map_err(DirError::Fill)?;
    sync_tree(tmp.path()).map_err(|e| DirError::Io(tmp.path().to_owned(), e))?;
    let staged = tmp.keep();
    let result = replace_dir(&staged, target);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staged);
    }
    result.map_err(|e| DirError::Io(target.to_owned(), e))
}

/// Why [`write_dir`] failed: the filling, or the file system around it.
#[derive(Debug)]
pub enum DirError<E> {
    /// `fill` failed.
    Fill(E),
    /// Creating, syncing or renaming failed on this path.
    Io(PathBuf, std::io::Error),
}

/// Put the complete folder `staged` at `target`, keeping a previous `target` until then.
fn replace_dir(staged: &Path, target: &Path) -> std::io::Result<()> {
    let dir = parent(target);
    let old = if target.exists() {
        let old = dir.join(format!(".{}.old-{}", file_name(target), std::process::id()));
        let _ = std::fs::remove_dir_all(&old);
        std::fs::rename(target, &old)?;
        Some(old)
    } else {
        None
    };
    if let Err(e) = std::fs::rename(staged, target) {
        if let Some(old) = &old {
            let _ = std::fs::rename(old, target);
        }
        return Err(e);
    }
    sync_dir(dir)?;
    if let Some(old) = old {
        std::fs::remove_dir_all(old)?;
    }
    Ok(())
}

/// fsync every file under `dir`, and the folders themselves.
fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            sync_tree(&path)?;
        } else {
            File::open(&path)?.sync_all()?;
        }
    }
    sync_dir(dir)
}

/// fsync a folder, so that a rename in it survives a power cut.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A temporary name `<prefix>XXXXXX.partial` that gets what a plain `create` would: `mode`
/// less the umask (tempfile's own default, owner-only, would hide run folders from the other
/// users of a machine).
fn builder(prefix: &str, mode: u32) -> tempfile::Builder<'_, 'static> {
    let mut b = tempfile::Builder::new();
    b.prefix(prefix).suffix(".partial");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        b.permissions(std::fs::Permissions::from_mode(mode));
    }
    #[cfg(not(unix))]
    let _ = mode;
    b
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        write(&path, b"one").unwrap();
        write(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let plain = dir.path().join("plain");
            std::fs::write(&plain, b"x").unwrap();
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(
                mode(&path),
                mode(&plain),
                "the permissions a plain write gets"
            );
        }
    }

    #[test]
    fn a_failed_fill_leaves_the_previous_folder() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("checkpoint");
        write_dir(&target, |d| std::fs::write(d.join("model"), b"v1")).unwrap();
        let failed = write_dir(&target, |d| {
            std::fs::write(d.join("model"), b"v2 half")?;
            Err::<(), _>(std::io::Error::other("disk full"))
        });
        assert!(matches!(failed, Err(DirError::Fill(_))));
        assert_eq!(std::fs::read(target.join("model")).unwrap(), b"v1");
        write_dir(&target, |d| std::fs::write(d.join("model"), b"v2")).unwrap();
        assert_eq!(std::fs::read(target.join("model")).unwrap(), b"v2");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["checkpoint"], "no temporary or old folder is left");
    }
}
