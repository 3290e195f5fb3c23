//! What the machine has, for plugins and the engine to refuse up front what cannot fit.

/// Total physical memory of this machine in bytes (`MemTotal` of `/proc/meminfo`), or `None`
/// where it cannot be read.
pub fn total_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

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

    #[test]
    fn absurd_estimates_do_not_fit() {
        if total_memory().is_some() {
            let err = check_memory("the test", u128::from(u64::MAX) * 4).unwrap_err();
            assert!(err.starts_with("the test needs about"), "{err}");
            assert!(check_memory("a byte", 1).is_ok());
        }
    }
}
