//! `areal grade math`: maths answers against references, one JSON line out per line in, in
//! order.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use areal_reward_math::{Deadline, Extracted, Options, canonical_text, verify};

use areal_sdk::Verdict;
use clap::Args;
use serde_json::{Value, json};

use super::input::{Lines, check_flags, line_progress, open_input};

#[derive(Debug, Args)]
pub(crate) struct GradeMathArgs {
    /// A JSONL file, or `-` for stdin. Each line: `{"gold": ..., "pred": ...}`, optionally
    /// `id` (copied to the output) and `config` (Math-Verify's per-case settings:
    /// `match_types`, `float_rounding`, `strict`, `allow_set_relation_comp`,
    /// `latex_boxed_match_priority`).
    file: PathBuf,
    /// Decimal places when either side is a decimal.
    #[arg(long, default_value_t = Options::default().float_rounding)]
    float_rounding: u32,
    /// Time limit per line, in seconds.
    #[arg(long, default_value_t = Options::default().timeout_s)]
    timeout: f64,
    /// Worker threads (1 to 64).
    #[arg(long, short = 'j', default_value_t = 1)]
    threads: usize,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// Lines graded together (in parallel, then printed in order).
const BATCH: usize = 512;

#[allow(clippy::print_stderr, reason = "messages for the user, on stderr")]
pub(super) fn run(args: GradeMathArgs) -> anyhow::Result<()> {
    let options = Options {
        float_rounding: args.float_rounding,
        timeout_s: args.timeout,
        ..Options::default()
    };
    check_flags(options.check(), args.threads)?;
    let input = open_input(&args.file)?;
    let threads = args.threads;
    let bar = line_progress(args.quiet);
    let started = Instant::now();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let (mut graded, mut accepted, mut errors) = (0usize, 0usize, 0usize);
    let mut batch: Vec<(usize, Result<String, String>)> = Vec::with_capacity(BATCH);
    let mut lines = Lines::new(input, super::input::MAX_LINE_BYTES);
    loop {
        lines.next_batch(&mut batch, BATCH)?;
        if batch.is_empty() {
            break;
        }
        for result in grade_batch(&batch, &options, threads) {
            graded += 1;
            match result["verdict"].as_str() {
                Some("accepted") => accepted += 1,
                Some("error" | "verifier_timeout") => errors += 1,
                _ => {}
            }
            serde_json::to_writer(&mut out, &result)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        bar.inc(batch.len() as u64);
        bar.set_message(format!("accepted {accepted}"));
    }
    bar.finish_and_clear();
    eprintln!(
        "graded {graded} lines in {:.2} s on {threads} threads: accepted {accepted}, not accepted {}, unreadable or timed out {errors}",
        started.elapsed().as_secs_f64(),
        graded - accepted - errors
    );
    Ok(())
}

/// Grades lines on `threads` threads; results in input order.
fn grade_batch(
    batch: &[(usize, Result<String, String>)],
    options: &Options,
    threads: usize,
) -> Vec<Value> {
    if threads == 1 || batch.len() < 2 {
        return batch
            .iter()
            .map(|(n, l)| grade_line(*n, l, options))
            .collect();
    }
    let chunk = batch.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = batch
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|(n, l)| grade_line(*n, l, options))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .zip(batch.chunks(chunk))
            .flat_map(|(h, part)| {
                h.join().unwrap_or_else(|_| {
                    part.iter()
                        .map(|(n, _)| error_line(*n, None, "the verifier panicked"))
                        .collect()
                })
            })
            .collect()
    })
}

fn text_of(value: Option<&Value>, key: &str) -> Result<String, String> {
    match value {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(other) => Err(format!(
            "`{key}` must be a string or a number, found {other}"
        )),
        None => Err(format!("no `{key}`")),
    }
}

fn grade_line(line: usize, text: &Result<String, String>, options: &Options) -> Value {
    let text = match text {
        Ok(text) => text,
        Err(message) => return error_line(line, None, &format!("line {line}: {message}")),
    };
    let record: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) if text.trim().is_empty() => {
            return error_line(line, None, &format!("line {line}: empty line ({e})"));
        }
        Err(e) => return error_line(line, None, &format!("line {line}: not JSON: {e}")),
    };
    let id = record.get("id").cloned();
    let fields = (|| {
        let gold = text_of(record.get("gold"), "gold")?;
        let pred = text_of(record.get("pred"), "pred")?;
        let options = match record.get("config") {
            Some(config) => options.with_math_verify_config(config)?,
            None => options.clone(),
        };
        Ok::<_, String>((gold, pred, options))
    })();
    let (gold, pred, options) = match fields {
        Ok(f) => f,
        Err(message) => return error_line(line, id, &format!("line {line}: {message}")),
    };
    let started = Instant::now();
    let dl = Deadline::after(Duration::from_secs_f64(options.timeout_s));
    let wall_ms = || started.elapsed().as_secs_f64() * 1e3;
    match verify(&gold, &pred, &options, &dl) {
        Ok(v) => {
            let parsed = |e: &Extracted| match &e.math {
                Some(m) => Value::String(
                    canonical_text(m, &Deadline::after(Duration::from_millis(100)))
                        .unwrap_or_else(|_| m.to_string()),
                ),
                None => Value::Null,
            };
            json!({
                "line": line,
                "id": id,
                "reward": v.reward(),
                "verdict": v.verdict(),
                "gold": parsed(&v.gold),
                "pred": parsed(&v.pred),
                "gold_text": v.gold.text,
                "pred_text": v.pred.text,
                "wall_ms": wall_ms(),
            })
        }
        Err(_) => json!({
            "line": line,
            "id": id,
            "reward": 0.0,
            "verdict": Verdict::VerifierTimeout,
            "error": format!("line {line}: past the {} s limit", options.timeout_s),
            "wall_ms": wall_ms(),
        }),
    }
}

fn error_line(line: usize, id: Option<Value>, message: &str) -> Value {
    json!({
        "line": line,
        "id": id,
        "reward": 0.0,
        "verdict": Verdict::Error,
        "error": message,
    })
}
