//! `areal bench math`: verifications per second of the maths verifier on MATH-500 answers,
//! against Math-Verify (Python) on the same pairs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use areal_reward_math::rewrite::{Rewrite, perturb, rewrite};
use areal_reward_math::{Deadline, Options, verify};
use clap::Args;
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub(crate) struct BenchMathArgs {
    /// MATH-500-style JSONL with an `answer` on every line.
    #[arg(long, default_value = "rewards/math/tests/fixtures/math500.jsonl")]
    answers: PathBuf,
    /// Thread counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Seconds to time each set of pairs for, per thread count (whole passes, at least one).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// The Python with Math-Verify installed (rewards/math/scripts/setup-math-verify.sh).
    #[arg(long, default_value = ".cache/math-verify/bin/python")]
    python: PathBuf,
    /// Skip Math-Verify.
    #[arg(long)]
    no_reference: bool,
    /// Also write the report (markdown) to this file.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

/// A named set of (gold, completion) pairs.
struct PairSet {
    name: &'static str,
    /// Whether the completions are meant to equal the gold answers.
    equal: bool,
    pairs: Vec<(String, String)>,
}

fn pair_sets(answers: &[String]) -> Vec<PairSet> {
    // Gold answers go in `$...$` so that both verifiers read them the same way.
    let gold = |a: &str| format!("${a}$");
    let mut sets = vec![PairSet {
        name: "identical (gold against gold)",
        equal: true,
        pairs: answers.iter().map(|a| (gold(a), gold(a))).collect(),
    }];
    for kind in Rewrite::ALL {
        sets.push(PairSet {
            name: kind.name(),
            equal: true,
            pairs: answers
                .iter()
                .filter_map(|a| rewrite(a, kind).map(|p| (gold(a), p)))
                .collect(),
        });
    }
    sets.push(PairSet {
        name: "perturbed (unequal)",
        equal: false,
        pairs: answers.iter().map(|a| (gold(a), perturb(a))).collect(),
    });
    sets
}

/// One measurement: verifications per second and how many pairs were accepted.
struct Measured {
    per_second: f64,
    accepted: usize,
}

/// Ours: whole passes over `pairs` on `threads` threads for at least `seconds`.
fn measure_ours(pairs: &[(String, String)], threads: usize, seconds: f64) -> Measured {
    let options = Options::default();
    let grade = |part: &[(String, String)]| -> usize {
        part.iter()
            .filter(|(g, p)| {
                let dl = Deadline::after(Duration::from_secs_f64(options.timeout_s));
                verify(g, p, &options, &dl).is_ok_and(|v| v.equal)
            })
            .count()
    };
    let accepted = grade(pairs); // untimed warm pass, and the verdicts
    let chunk = pairs.len().div_ceil(threads.max(1)).max(1);
    let started = Instant::now();
    let mut passes = 0usize;
    while passes == 0 || started.elapsed().as_secs_f64() < seconds {
        std::thread::scope(|scope| {
            for part in pairs.chunks(chunk) {
                scope.spawn(move || grade(part));
            }
        });
        passes += 1;
    }
    Measured {
        per_second: (passes * pairs.len()) as f64 / started.elapsed().as_secs_f64(),
        accepted,
    }
}

/// Math-Verify on `pairs`, split over `processes` Python processes run at once. The time is
/// each process's own (after Python and sympy start), the slowest one counting.
fn measure_reference(
    python: &Path,
    pairs: &[(String, String)],
    processes: usize,
) -> anyhow::Result<Measured> {
    let script = Path::new("rewards/math/scripts/math_verify_ref.py");
    let chunk = pairs.len().div_ceil(processes.max(1)).max(1);
    let mut children = Vec::new();
    for part in pairs.chunks(chunk) {
        let mut child = Command::new(python)
            .arg(script)
            .args(["--time", "1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", python.display()))?;
        let mut stdin = child.stdin.take().expect("piped");
        for (g, p) in part {
            serde_json::to_writer(&mut stdin, &json!({"gold": g, "pred": p}))?;
            stdin.write_all(b"\n")?;
        }
        drop(stdin);
        children.push(child);
    }
    let mut slowest: f64 = 0.0;
    let mut accepted = 0usize;
    for child in children {
        let out = child.wait_with_output()?;
        anyhow::ensure!(
            out.status.success(),
            "Math-Verify exited with {}",
            out.status
        );
        let report: Value = serde_json::from_slice(&out.stdout).context("Math-Verify's report")?;
        slowest = slowest.max(report["seconds"].as_f64().unwrap_or(f64::NAN));
        accepted += report["rewards"]
            .as_array()
            .map_or(0, |r| r.iter().filter(|x| x.as_f64() == Some(1.0)).count());
    }
    Ok(Measured {
        per_second: pairs.len() as f64 / slowest,
        accepted,
    })
}

#[allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "results on stdout, progress on stderr"
)]
pub(super) fn run(args: BenchMathArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.answers)
        .with_context(|| format!("cannot read {}", args.answers.display()))?;
    let answers: Vec<String> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l)
                .with_context(|| format!("{} line {}: not JSON", args.answers.display(), i + 1))?;
            match &v["answer"] {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                other => anyhow::bail!(
                    "{} line {}: `answer` is {other}",
                    args.answers.display(),
                    i + 1
                ),
            }
        })
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(
        !answers.is_empty(),
        "{}: no answers",
        args.answers.display()
    );
    let reference = if args.no_reference {
        None
    } else if args.python.exists() {
        Some(args.python.clone())
    } else {
        eprintln!(
            "Math-Verify not found at {} (run rewards/math/scripts/setup-math-verify.sh); measuring areal-rs alone",
            args.python.display()
        );
        None
    };
    let sets = pair_sets(&answers);
    let mut header = String::from("| pairs | n |");
    let mut rule = String::from("|---|---|");
    for t in &args.threads {
        header.push_str(&format!(
            " areal-rs, {t} thread{} (/s) |",
            if *t == 1 { "" } else { "s" }
        ));
        rule.push_str("---|");
    }
    if reference.is_some() {
        for t in &args.threads {
            header.push_str(&format!(
                " Math-Verify, {t} process{} (/s) |",
                if *t == 1 { "" } else { "es" }
            ));
            rule.push_str("---|");
        }
        header.push_str(" ratio, 1 thread |");
        rule.push_str("---|");
    }
    header.push_str(" accepted: areal-rs |");
    rule.push_str("---|");
    if reference.is_some() {
        header.push_str(" accepted: Math-Verify |");
        rule.push_str("---|");
    }
    let mut report = format!(
        "Verifications per second on {} ({} answers); no string-equality fast path: every pair is extracted, parsed and compared.\n\n{header}\n{rule}\n",
        args.answers.display(),
        answers.len()
    );
    for set in &sets {
        eprintln!("{}: {} pairs", set.name, set.pairs.len());
        let ours: Vec<Measured> = args
            .threads
            .iter()
            .map(|t| measure_ours(&set.pairs, *t, args.seconds))
            .collect();
        let mut row = format!("| {} | {} |", set.name, set.pairs.len());
        for m in &ours {
            row.push_str(&format!(" {:.0} |", m.per_second));
        }
        let mut reference_accepted = None;
        if let Some(python) = &reference {
            let theirs: Vec<Measured> = args
                .threads
                .iter()
                .map(|t| measure_reference(python, &set.pairs, *t))
                .collect::<anyhow::Result<_>>()?;
            for m in &theirs {
                row.push_str(&format!(" {:.0} |", m.per_second));
            }
            row.push_str(&format!(
                " {:.0}× |",
                ours[0].per_second / theirs[0].per_second
            ));
            reference_accepted = Some(theirs[0].accepted);
        }
        let share = |k: usize| {
            let expected = if set.equal { k } else { set.pairs.len() - k };
            format!(
                "{k} ({:.1} % right)",
                100.0 * expected as f64 / set.pairs.len() as f64
            )
        };
        row.push_str(&format!(" {} |", share(ours[0].accepted)));
        if let Some(k) = reference_accepted {
            row.push_str(&format!(" {} |", share(k)));
        }
        report.push_str(&row);
        report.push('\n');
    }
    crate::publish(&report, args.markdown.as_deref())
}
