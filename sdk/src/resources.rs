//! What the machine has, for plugins and the engine to refuse up front what cannot fit.

/// Total physical memory of this machine in bytes (`MemTotal` of `/proc/meminfo`), or `None`
/// where it cannot be read.
pub fn total_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Memory this process may still take, in bytes: the least of the machine's available
/// memory (`MemAvailable` of `/proc/meminfo`), what its cgroup's limit leaves
/// (`memory.max` − `memory.current`, cgroup v2) and its address-space limit (`ulimit -v`);
/// `None` where none can be read. What a peer announces is checked against it before
/// anything is allocated.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        });
    let read =
        |path: &str| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let cgroup = read("/sys/fs/cgroup/memory.max")
        .map(|max| max.saturating_sub(read("/sys/fs/cgroup/memory.current").unwrap_or(0)));
    let address_space = address_space_limit();
    [meminfo, cgroup, address_space].into_iter().flatten().min()
}

/// The address-space limit (`RLIMIT_AS`), where one is set.
fn address_space_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max address space"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The bytes of the regular file at `path`, within `max_bytes`: refused without reading it
/// when it is not a regular file (a device such as `/dev/zero`, a FIFO, a folder; a symbolic
/// link counts as what it points to) or holds more, and never read past the bound (a file
/// that grows while it is read). For what a peer, a checkpoint or a run folder names: files a
/// process did not write itself are read within a bound.
pub fn read_file(path: &std::path::Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read};
    let not_regular = || Error::new(ErrorKind::InvalidInput, "not a regular file");
    // checked before opening too: opening a FIFO would wait for a writer
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    let too_big = |len: u64| {
        Error::new(
            ErrorKind::FileTooLarge,
            format!("{} bytes, more than the {max_bytes} it may hold here", len),
        )
    };
    if meta.len() > max_bytes {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The most a JSON file that describes something (a model's `config.json`, a run's
/// `state.json`) may hold: 64 MiB.
pub const MAX_JSON_FILE_BYTES: u64 = 64 << 20;

/// Threads this process may run on at once (cores, or the CPU quota), at least 1.
pub fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `Ok` when a pool of `threads` threads (0: the process-wide pool) fits this machine;
/// otherwise why not, with both numbers. More threads than cores only queue behind each other.
pub fn check_threads(threads: usize) -> Result<(), String> {
    let cores = available_threads();
    if threads <= cores {
        Ok(())
    } else {
        Err(format!(
            "{threads} threads on a machine that runs {cores} at once: more only queue behind each other (0 shares the process-wide pool)"
        ))
    }
}

/// `bytes` in GiB with one decimal, for messages (`1.5 GiB`; exact for huge values too).
pub fn gib(bytes: u128) -> String {
    let tenths = bytes.saturating_mul(10) / (1 << 30);
    if tenths >= 10_000_000 {
        format!("{:.1e} GiB", bytes as f64 / f64::from(1u32 << 30))
    } else {
        format!("{}.{} GiB", tenths / 10, tenths % 10)
    }
}

/// `Ok` when an estimate of `bytes` fits in this machine's memory; otherwise a message with
/// both numbers and what the estimate covers (`what`, e.g. "the model's weights, gradients
/// and optimizer state"). Unknown memory (not Linux) always fits.
pub fn check_memory(what: &str, bytes: u128) -> Result<(), String> {
    match total_memory() {
        Some(total) if bytes > u128::from(total) => Err(format!(
            "{what} needs about {}, but this machine has {} of memory",
            gib(bytes),
            gib(u128::from(total))
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(gib(3 << 29), "1.5 GiB");
        assert_eq!(gib(0), "0.0 GiB");
        assert_eq!(gib(u128::MAX), "3.2e29 GiB");
        assert!(available_threads() >= 1);
        assert!(check_threads(0).is_ok() && check_threads(available_threads()).is_ok());
        let err = check_threads(100_000).unwrap_err();
        assert!(
            err.starts_with("100000 threads on a machine that runs"),
            "{err}"
        );
    }

    /// Issue 32: a `model.safetensors` that was a symbolic link to `/dev/zero` grew a server
    /// to 1.5 GB in seconds. Only regular files are read, and only within the bound.
    #[test]
    fn only_regular_files_are_read_and_only_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"0123456789").unwrap();
        assert_eq!(read_file(&file, 10).unwrap(), b"0123456789");
        let e = read_file(&file, 9).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(e.to_string().contains("10 bytes"), "{e}");
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for path in [zero.as_path(), dir.path()] {
            let e = read_file(path, 1 << 30).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        assert!(available_memory().is_some_and(|m| m > 0));
    }

    #[test]
    fn absurd_estimates_do_not_fit() {
        if total_memory().is_some() {
            let err = check_memory("the test", u128::from(u64::MAX) * 4).unwrap_err();
            assert!(err.starts_with("the test needs about"), "{err}");
            assert!(check_memory("a byte", 1).is_ok());
        }
    }
}
