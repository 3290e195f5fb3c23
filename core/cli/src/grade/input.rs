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
    if !problems.is_empty() {
        crate::usage!("{}", problems.join("\n"));
    }
    Ok(())
}

/// The lines of an input, numbered from 1. A line that is not UTF-8, or longer than the
/// limit, is that line's problem (`Err` with why), never the end of the input; only a failure
/// to read ends it. A line past the limit is read on to its end without being kept.
pub(crate) struct Lines {
    input: Box<dyn BufRead>,
    number: usize,
    max_bytes: usize,
}

impl Lines {
    /// The lines of `input`, each at most `max_bytes` long (its newline aside).
    pub(crate) fn new(input: Box<dyn BufRead>, max_bytes: usize) -> Self {
        Self {
            input,
            number: 0,
            max_bytes,
        }
    }

    /// The next line's bytes (without its newline) and whether it ended within the limit;
    /// `None` at the end of the input.
    fn read_line(&mut self) -> std::io::Result<Option<(Vec<u8>, bool)>> {
        // Held in pieces and joined once at the end: a growing vector would copy itself at
        // each doubling, keeping both copies (and the allocator may keep the old one a while),
        // so that a line refused at the limit could cost twice the limit on the way.
        // Each piece as large as what is held so far (8 KiB to 16 MiB): few pieces, no copy.
        const PIECES: (usize, usize) = (8 << 10, 16 << 20);
        let mut pieces: Vec<Vec<u8>> = Vec::new();
        let mut held = 0usize;
        let mut over = false;
        let mut any = false;
        let mut ended = false;
        loop {
            let buf = self.input.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            any = true;
            let (chunk, ends) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            if !over && held + chunk.len() <= self.max_bytes.saturating_add(1) {
                let mut rest = chunk;
                while !rest.is_empty() {
                    if pieces.last().is_none_or(|p| p.len() == p.capacity()) {
                        pieces.push(Vec::with_capacity(held.clamp(PIECES.0, PIECES.1)));
                    }
                    let piece = pieces.last_mut().expect("just pushed");
                    let n = rest.len().min(piece.capacity() - piece.len());
                    piece.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    held += n;
                }
            } else {
                over = true;
                pieces = Vec::new();
            }
            let used = ends.unwrap_or(buf.len());
            self.input.consume(used);
            if ends.is_some() {
                ended = true;
                break;
            }
        }
        if !any {
            return Ok(None);
        }
        let mut bytes = match pieces.len() {
            0 => Vec::new(),
            1 => pieces.pop().expect("one piece"),
            _ => {
                let mut bytes = Vec::with_capacity(held);
                for piece in pieces {
                    bytes.extend_from_slice(&piece);
                }
                bytes
            }
        };
        // `\r\n` ends a line as `\n` does; a last line without a newline is kept as it is
        if ended && bytes.ends_with(b"\r") {
            bytes.pop();
        }
        over |= bytes.len() > self.max_bytes;
        Ok(Some((bytes, !over)))
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
        self.number += 1;
        let number = self.number;
        match self.read_line() {
            Ok(None) => None,
            Ok(Some((_, false))) => Some(Ok((
                number,
                Err(format!(
                    "longer than {} MiB, the most a line may hold here (skipped unread)",
                    self.max_bytes >> 20
                )),
            ))),
            Ok(Some((bytes, true))) => {
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

/// The longest line of a grade command's input that is not a code record: 64 MiB.
pub(crate) const MAX_LINE_BYTES: usize = 64 << 20;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str, max: usize) -> Vec<Result<String, String>> {
        let input: Box<dyn BufRead> = Box::new(std::io::BufReader::with_capacity(
            3,
            std::io::Cursor::new(text.as_bytes().to_vec()),
        ));
        Lines::new(input, max).map(|l| l.unwrap().1).collect()
    }

    #[test]
    fn a_line_past_the_limit_is_skipped_and_the_next_one_read() {
        let got = lines("short\r\nmuch too long a line\nok\n\nlast", 6);
        assert_eq!(got[0], Ok("short".into()));
        assert!(got[1].as_ref().unwrap_err().contains("skipped"), "{got:?}");
        assert_eq!(
            got[2..],
            [Ok("ok".into()), Ok(String::new()), Ok("last".into())]
        );
        assert!(lines("abcdef\nabcdefg", 6)[1].is_err());
        assert_eq!(lines("abcdef\r\n", 6), [Ok("abcdef".into())]);
        assert_eq!(lines("", 6), Vec::<Result<String, String>>::new());
        // a line held in several pieces is joined in order
        let long: String = (0..200_000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let got = lines(&format!("{long}\nx\n"), 200_000);
        assert_eq!(got, [Ok(long.clone()), Ok("x".into())]);
        assert!(lines(&format!("{long}\nx\n"), 199_999)[0].is_err());
    }
}
