//! What every grade command shares: its input read line by line, its flags checked, its
//! progress shown.

use std::io::{BufRead, IsTerminal};
use std::path::Path;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

/// The most threads a grade command runs on (and the sandbox's pool of instance slots).
pub(crate) const MAX_THREADS: usize = areal_sandbox::MAX_CONCURRENT_RUNS as usize;

/// Refuse a grade command's flags before anything runs: each problem of the options' own
/// check (`(option, message)`, named here as its flag: `timeout_s` is `--timeout`) and a
/// thread count out of range, all at once.
pub(crate) fn check_flags(
    problems: Vec<(&'static str, String)>,
    threads: usize,
) -> anyhow::Result<()> {
    let flag = |key: &str| match key {
        "timeout_s" => "--timeout".to_owned(),
        other => format!("--{}", other.replace('_', "-")),
    };
    let mut problems: Vec<String> = problems
        .into_iter()
        .map(|(key, message)| format!("{}: {message}", flag(key)))
        .collect();
    if !(1..=MAX_THREADS).contains(&threads) {
        problems.push(format!(
            "--threads {threads}: between 1 and {MAX_THREADS} may run at once"
        ));
    }
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// The lines of an input, numbered from 1. A line that is not UTF-8 is that line's problem
/// (`Err` with where it breaks), never the end of the input; only a failure to read ends it.
pub(crate) struct Lines {
    input: Box<dyn BufRead>,
    number: usize,
}

impl Lines {
    pub(crate) fn new(input: Box<dyn BufRead>) -> Self {
        Self { input, number: 0 }
    }
}

/// A numbered line: its text, or why it has none.
pub(crate) type Line = (usize, Result<String, String>);

impl Lines {
    /// The next `n` lines (fewer at the end of the input) into `batch`, which is cleared
    /// first; an empty batch is the end.
    pub(crate) fn next_batch(&mut self, batch: &mut Vec<Line>, n: usize) -> anyhow::Result<()> {
        batch.clear();
        for line in self.by_ref() {
            batch.push(line?);
            if batch.len() == n {
                break;
            }
        }
        Ok(())
    }
}

impl Iterator for Lines {
    type Item = anyhow::Result<Line>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut bytes = Vec::new();
        self.number += 1;
        let number = self.number;
        match self.input.read_until(b'\n', &mut bytes) {
            Ok(0) => None,
            Ok(_) => {
                if bytes.ends_with(b"\n") {
                    bytes.pop();
                    if bytes.ends_with(b"\r") {
                        bytes.pop();
                    }
                }
                let text = String::from_utf8(bytes).map_err(|e| {
                    format!(
                        "not UTF-8 (invalid byte at column {})",
                        e.utf8_error().valid_up_to() + 1
                    )
                });
                Some(Ok((number, text)))
            }
            Err(e) => Some(Err(
                anyhow::Error::new(e).context(format!("reading line {number}"))
            )),
        }
    }
}

/// The lines of `file`, or of stdin for `-`.
pub(crate) fn open_input(file: &Path) -> anyhow::Result<Box<dyn BufRead>> {
    if file.as_os_str() == "-" {
        return Ok(Box::new(std::io::stdin().lock()));
    }
    let opened =
        std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    Ok(Box::new(std::io::BufReader::new(opened)))
}

/// A spinner counting graded lines on a terminal; hidden when `quiet` or stderr is a file.
pub(crate) fn line_progress(quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    ProgressBar::new_spinner().with_style(
        ProgressStyle::with_template("{spinner} graded {pos} lines [{elapsed_precise}] {msg}")
            .expect("a valid template"),
    )
}
