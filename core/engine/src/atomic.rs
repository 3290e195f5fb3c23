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

/// A file of whole records appended one by one (`metrics.jsonl`, TensorBoard events), which a
/// resumed run cuts back to the length its checkpoint recorded.
#[derive(Debug)]
pub struct AppendFile {
    path: PathBuf,
    out: std::io::BufWriter<File>,
}

impl AppendFile {
    /// Create (truncate) `path`.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            path: path.to_owned(),
            out: std::io::BufWriter::new(File::create(path)?),
        })
    }

    /// Open `path` to go on after its first `bytes` bytes (what follows is cut off). It must be
    /// a regular file of at least `bytes` bytes, not a symbolic link: a run folder is not
    /// trusted to point elsewhere (a link's target would be cut), nor to be grown to a
    /// length a damaged checkpoint names.
    pub fn resume(path: &Path, bytes: u64) -> std::io::Result<Self> {
        use std::io::{Error, ErrorKind};
        let meta = std::fs::symlink_metadata(path)?;
        if !meta.file_type().is_file() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "not a regular file (a symbolic link, a folder, a device): it is not cut back",
            ));
        }
        if meta.len() < bytes {
            return Err(Error::new(
                ErrorKind::InvalidData,
                format!(
                    "{} bytes, fewer than the {bytes} its checkpoint recorded",
                    meta.len()
                ),
            ));
        }
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.set_len(bytes)?;
        let mut out = std::io::BufWriter::new(file);
        std::io::Seek::seek(&mut out, std::io::SeekFrom::End(0))?;
        Ok(Self {
            path: path.to_owned(),
            out,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where records are written (buffered: [`Write::flush`] after each whole record).
    pub fn writer(&mut self) -> &mut std::io::BufWriter<File> {
        &mut self.out
    }

    /// Put everything written on disk; the file's length.
    pub fn sync(&mut self) -> std::io::Result<u64> {
        self.out.flush()?;
        let file = self.out.get_ref();
        file.sync_data()?;
        Ok(file.metadata()?.len())
    }
}

/// A folder being written beside its `target`: fill [`StagedDir::path`], then
/// [`StagedDir::commit`] syncs every file and puts the folder at `target` (a previous `target`
/// is kept until the new one is complete, then removed). Dropped without a commit, the
/// temporary folder is removed and `target` is as it was.
#[derive(Debug)]
pub struct StagedDir {
    tmp: tempfile::TempDir,
    target: PathBuf,
}

impl StagedDir {
    /// An empty temporary folder beside `target` (its parent is created if needed).
    pub fn new(target: &Path) -> Result<Self, DirError> {
        let dir = parent(target);
        std::fs::create_dir_all(dir).map_err(|e| DirError::new(dir, e))?;
        let prefix = format!(".{}.", file_name(target));
        let tmp = builder(&prefix, 0o777)
            .tempdir_in(dir)
            .map_err(|e| DirError::new(dir, e))?;
        Ok(Self {
            tmp,
            target: target.to_owned(),
        })
    }

    /// The temporary folder to fill.
    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    /// Sync the folder and put it at `target`.
    pub fn commit(self) -> Result<(), DirError> {
        sync_tree(self.tmp.path()).map_err(|e| DirError::new(self.tmp.path(), e))?;
        let staged = self.tmp.keep();
        let result = replace_dir(&staged, &self.target);
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&staged);
        }
        result.map_err(|e| DirError::new(&self.target, e))
    }
}

/// Creating, syncing or renaming a staged folder failed on this path.
#[derive(Debug, thiserror::Error)]
#[error("{}", path.display())]
pub struct DirError {
    /// Where it failed.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

impl DirError {
    fn new(path: &Path, source: std::io::Error) -> Self {
        Self {
            path: path.to_owned(),
            source,
        }
    }
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
        let write = |bytes: &[u8]| {
            let staged = StagedDir::new(&target).unwrap();
            std::fs::write(staged.path().join("model"), bytes).unwrap();
            staged.commit().unwrap();
        };
        write(b"v1");
        {
            // filled halfway, then dropped (the fill failed): nothing changes
            let staged = StagedDir::new(&target).unwrap();
            std::fs::write(staged.path().join("model"), b"v2 half").unwrap();
        }
        assert_eq!(std::fs::read(target.join("model")).unwrap(), b"v1");
        write(b"v2");
        assert_eq!(std::fs::read(target.join("model")).unwrap(), b"v2");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["checkpoint"], "no temporary or old folder is left");
    }
}
