//! `areal bench reward`: what a reward costs per sample in each of its three forms, on the
//! built-in task's samples: the compiled-in `chain-sum`, the same reward as a WebAssembly
//! component in the sandbox, as a Python file in the sandbox, and that Python function called
//! in a native (unsandboxed) Python process.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use areal_core::metrics::percentile;
use areal_sdk::{
    BuildContext, FinishReason, PluginConfig, RewardInput, RewardPlugin, RewardVerifier, Split,
    Task, VerifyContext,
};
use areal_tasks::chain_sum::{ChainSum, ChainSumOptions, response, terms_of};
use clap::Args;
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub(crate) struct BenchRewardArgs {
    /// Samples per form and thread count.
    #[arg(long, default_value_t = 2000)]
    samples: usize,
    /// Thread counts to measure (native Python: one process per thread).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// The Python reward file (verl's `compute_score`).
    #[arg(long, default_value = "rewards/plugin/examples/chain_sum.py")]
    python_file: PathBuf,
    /// The reward component (`make reward-components`).
    #[arg(long, default_value = ".cache/components/chain-sum.wasm")]
    component: PathBuf,
    /// The native Python for the unsandboxed baseline.
    #[arg(long, default_value = "python3")]
    python: PathBuf,
    /// Also write the report (markdown) to this file.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

/// Calls a file's `compute_score` on JSON lines from stdin, timing each call; prints one line
/// per sample (`score ns`) and the loop's total nanoseconds last.
const NATIVE: &str = r#"
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("reward", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
jobs = [json.loads(line) for line in sys.stdin]
out = []
t0 = time.perf_counter_ns()
for j in jobs:
    s = time.perf_counter_ns()
    r = mod.compute_score(data_source=j["data_source"], solution_str=j["completion"],
                          ground_truth=j["reference"], extra_info=j["metadata"])
    out.append((r["score"] if isinstance(r, dict) else r, time.perf_counter_ns() - s))
total = time.perf_counter_ns() - t0
for score, ns in out:
    print(score, ns)
print("total", total)
"#;

/// One form at one thread count.
struct Row {
    form: &'static str,
    threads: usize,
    /// Per-sample latency: median and 99th percentile, in µs.
    p50_us: f64,
    p99_us: f64,
    /// Samples per second.
    throughput: f64,
    /// Rewards summed, to check that every form agrees.
    total: f64,
}

fn samples(n: usize) -> anyhow::Result<Vec<RewardInput>> {
    let task = ChainSum::new(ChainSumOptions::default(), 7);
    let mut out = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let item = task.item(Split::Train, i)?;
        let terms = terms_of(&item)?;
        // every third sample forgets its carries: right and wrong answers both
        let mut k = 0u64;
        let completion = response(&terms, || {
            k += 1;
            i.is_multiple_of(3) && k.is_multiple_of(2)
        });
        out.push(RewardInput {
            sample_id: i,
            item_id: item.id.clone(),
            prompt: item.prompt.clone(),
            completion,
            completion_ids: Vec::new(),
            finish_reason: FinishReason::Stop,
            reference: item.reference.clone(),
            metadata: json!({ "data_source": "chain-sum" })
                .as_object()
                .cloned()
                .unwrap_or_default(),
        });
    }
    Ok(out)
}

/// `verifier` over `inputs` on `threads` threads: per-call latencies and the wall time.
fn measure(
    form: &'static str,
    verifier: &Arc<dyn RewardVerifier>,
    inputs: &[RewardInput],
    threads: usize,
) -> anyhow::Result<Row> {
    // one untimed call per thread warms each thread's runtime and caches
    for input in inputs.iter().take(threads) {
        let _ = verifier.verify(input, &VerifyContext::with_timeout(Duration::from_secs(60)));
    }
    let chunk = inputs.len().div_ceil(threads);
    let started = Instant::now();
    let parts: Vec<anyhow::Result<(Vec<f64>, f64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = inputs
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut lat = Vec::with_capacity(part.len());
                    let mut total = 0.0;
                    for input in part {
                        let t = Instant::now();
                        let ctx = VerifyContext::with_timeout(Duration::from_secs(60));
                        let r = verifier
                            .verify(input, &ctx)
                            .map_err(|e| anyhow::anyhow!("{form}: {e}"))?;
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                        total += r.value;
                    }
                    Ok((lat, total))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("{form}: panicked")))
            })
            .collect()
    });
    let wall = started.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    let mut total = 0.0;
    for p in parts {
        let (l, t) = p?;
        lat.extend(l);
        total += t;
    }
    Ok(Row {
        form,
        threads,
        p50_us: percentile(&lat, 50.0),
        p99_us: percentile(&lat, 99.0),
        throughput: inputs.len() as f64 / wall,
        total,
    })
}

/// The Python function in `threads` native processes, timed inside them (start-up and
/// import excluded).
fn native(
    python: &Path,
    file: &Path,
    inputs: &[RewardInput],
    threads: usize,
) -> anyhow::Result<Row> {
    let chunk = inputs.len().div_ceil(threads);
    let mut children = Vec::new();
    for part in inputs.chunks(chunk) {
        let mut child = Command::new(python)
            .args(["-c", NATIVE])
            .arg(file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        let mut stdin = child.stdin.take().context("stdin")?;
        for input in part {
            let job = json!({
                "data_source": "chain-sum",
                "completion": input.completion,
                "reference": input.reference,
                "metadata": Value::Object(input.metadata.clone()),
            });
            writeln!(stdin, "{job}")?;
        }
        drop(stdin);
        children.push(child);
    }
    let (mut lat, mut total, mut loop_s) = (Vec::new(), 0.0, 0.0f64);
    for child in children {
        let out = child.wait_with_output()?;
        anyhow::ensure!(out.status.success(), "native Python failed: {}", out.status);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let (a, b) = line
                .split_once(' ')
                .context("a line of the native runner")?;
            if a == "total" {
                loop_s = loop_s.max(b.parse::<f64>()? / 1e9);
            } else {
                total += a.parse::<f64>()?;
                lat.push(b.parse::<f64>()? / 1e3);
            }
        }
    }
    Ok(Row {
        form: "Python, native process (unsandboxed)",
        threads,
        p50_us: percentile(&lat, 50.0),
        p99_us: percentile(&lat, 99.0),
        throughput: inputs.len() as f64 / loop_s.max(1e-9),
        total,
    })
}

fn build(config: Value) -> anyhow::Result<Arc<dyn RewardVerifier>> {
    let config = PluginConfig::from_value("reward", config)?;
    Ok(RewardPlugin::build_from(&config, &BuildContext::new(1, 1))?)
}

#[allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "results on stdout, progress on stderr"
)]
pub(super) fn run(args: BenchRewardArgs) -> anyhow::Result<()> {
    let inputs = samples(args.samples)?;
    eprintln!("loading the plugins (a Python file is imported and snapshotted once)...");
    let compiled = build(json!({ "kind": "chain-sum" }))?;
    let wasm = build(json!({ "kind": "wasm", "path": args.component }))?;
    let python = build(json!({ "kind": "python", "path": args.python_file }))?;
    let mut rows = Vec::new();
    for &t in &args.threads {
        anyhow::ensure!((1..=64).contains(&t), "--threads {t}: between 1 and 64");
        eprintln!("{t} thread(s)...");
        rows.push(measure("Rust, compiled in", &compiled, &inputs, t)?);
        rows.push(measure(
            "Rust, WASM component (sandbox)",
            &wasm,
            &inputs,
            t,
        )?);
        rows.push(measure("Python file (sandbox)", &python, &inputs, t)?);
        rows.push(native(&args.python, &args.python_file, &inputs, t)?);
    }
    let expected = rows[0].total;
    let mut report = format!(
        "{} samples of the built-in task (chain-sum), reward = 1 for the right final answer; \
         latency per sample as the caller sees it (the sandbox's instantiation included; native \
         Python: the call alone, start-up and import excluded)\n\n\
         | form | threads | p50 µs | p99 µs | samples/s | × compiled in | rewards summed |\n\
         |---|---|---|---|---|---|---|\n",
        inputs.len()
    );
    for r in &rows {
        let base = rows
            .iter()
            .find(|b| b.threads == r.threads)
            .map_or(1.0, |b| b.throughput);
        report.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.0} | {:.4} | {}{} |\n",
            r.form,
            r.threads,
            r.p50_us,
            r.p99_us,
            r.throughput,
            r.throughput / base,
            r.total,
            if r.total == expected {
                ""
            } else {
                " (differs!)"
            }
        ));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    report.push_str(&format!("\n{cores} cores\n"));
    crate::publish(&report, args.markdown.as_deref())
}
