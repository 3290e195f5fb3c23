//! `areal grade reward`: the `[reward]` of a config (compiled in, a WASM component or a
//! Python file) over JSONL samples, one JSON line out per line in, in order — to test a reward
//! before training with it.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use areal_core::RewardService;
use areal_sdk::{FinishReason, RewardInput, Verdict};
use clap::Args;
use serde_json::{Map, Value, json};

use super::input::{Lines, check_flags, line_progress, open_input};
use crate::configs::{ConfigArgs, loader};
use crate::runtime;

#[derive(Debug, Args)]
pub(crate) struct GradeRewardArgs {
    /// A JSONL file, or `-` for stdin. Each line: `{"prompt", "completion", "reference"}`, and
    /// optionally `data_source` (a string), `metadata` (an object) and `id` (copied to the
    /// output). `completion` is required; `prompt` defaults to "" and `reference` to null.
    file: PathBuf,
    /// The config whose `[reward]` and `[reward_service]` grade (`--config FILE`, `--set`).
    #[command(flatten)]
    config: ConfigArgs,
    /// Verifier threads (by default the config's `reward_service.threads`).
    #[arg(long, short = 'j')]
    threads: Option<usize>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// Lines graded together (at once on the service's threads, then printed in order).
const BATCH: usize = 512;

#[allow(clippy::print_stderr, reason = "messages for the user, on stderr")]
pub(super) fn run(args: GradeRewardArgs) -> anyhow::Result<()> {
    let mut loader = loader(&args.config)?;
    if let Some(j) = args.threads {
        check_flags(Vec::new(), j)?;
        loader = loader.set(&format!("reward_service.threads={j}"))?;
    }
    let (config, verifier) = areal_core::resolve_reward(&loader)?;
    let name = verifier.name().to_owned();
    let threads = config.reward_service.threads;
    let service = Arc::new(RewardService::from_config(verifier, &config.reward_service));
    let input = open_input(&args.file)?;
    let bar = line_progress(args.quiet);
    let started = Instant::now();
    let rt = runtime()?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    let (mut graded, mut accepted, mut errors, mut total) = (0usize, 0usize, 0usize, 0.0f64);
    let mut lines = Lines::new(input, super::input::MAX_LINE_BYTES);
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        lines.next_batch(&mut batch, BATCH)?;
        if batch.is_empty() {
            break;
        }
        let results: Vec<Value> = rt.block_on(async {
            let pending: Vec<_> = batch
                .drain(..)
                .map(|(n, text)| {
                    let service = Arc::clone(&service);
                    tokio::spawn(async move { grade_line(&service, n, text).await })
                })
                .collect();
            let mut results = Vec::with_capacity(pending.len());
            for p in pending {
                results.push(p.await.unwrap_or_else(
                    |e| json!({"reward": 0.0, "verdict": Verdict::Error, "error": e.to_string()}),
                ));
            }
            results
        });
        for result in results {
            graded += 1;
            match result["verdict"].as_str() {
                Some("accepted") => accepted += 1,
                Some("error" | "verifier_timeout" | "verifier_crashed") => errors += 1,
                _ => {}
            }
            total += result["reward"].as_f64().unwrap_or(0.0);
            serde_json::to_writer(&mut out, &result)?;
            out.write_all(b"\n")?;
            bar.inc(1);
        }
        out.flush()?;
        bar.set_message(format!("accepted {accepted}, errors {errors}"));
    }
    bar.finish_and_clear();
    let cache = service
        .cache()
        .map(|c| {
            let (hits, lookups) = c.stats();
            format!("; cache hits {hits} of {lookups}")
        })
        .unwrap_or_default();
    eprintln!(
        "{name}: graded {graded} lines in {:.2} s on {threads} threads: accepted {accepted}, \
         not accepted {}, errors {errors}; mean reward {:.4}{cache}",
        started.elapsed().as_secs_f64(),
        graded - accepted - errors,
        if graded == 0 {
            0.0
        } else {
            total / graded as f64
        },
    );
    Ok(())
}

/// One line's result: its reward, or why it has none.
async fn grade_line(service: &RewardService, line: usize, text: Result<String, String>) -> Value {
    let error = |id: Option<Value>, message: String| {
        json!({
            "line": line,
            "id": id,
            "reward": 0.0,
            "verdict": Verdict::Error,
            "error": format!("line {line}: {message}"),
        })
    };
    let text = match text {
        Ok(t) => t,
        Err(message) => return error(None, message),
    };
    let record = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => m,
        Ok(other) => return error(None, format!("not a JSON object: {other}")),
        Err(e) if text.trim().is_empty() => return error(None, format!("empty line ({e})")),
        Err(e) => return error(None, format!("not JSON: {e}")),
    };
    let id = record.get("id").cloned();
    let input = match input_of(line, &record) {
        Ok(input) => input,
        Err(message) => return error(id, message),
    };
    let verified = service.verify(input).await;
    let r = verified.reward;
    let mut details = r.provenance.details.clone();
    let failure = details.remove("error").filter(|_| r.verdict.is_failure());
    let mut out = json!({
        "line": line,
        "id": id,
        "reward": r.value,
        "verdict": r.verdict,
        "details": details,
        "wall_ms": r.provenance.wall_ms,
        "cached": verified.cached,
    });
    if let Some(message) = failure {
        out["error"] = message;
    }
    out
}

fn input_of(line: usize, record: &Map<String, Value>) -> Result<RewardInput, String> {
    let text = |key: &str, required: bool| match record.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) if !required => Ok(String::new()),
        None => Err(format!("no `{key}`")),
        Some(other) => Err(format!("`{key}` must be a string, found {other}")),
    };
    let completion = text("completion", true)?;
    let prompt = text("prompt", false)?;
    let mut metadata = match record.get("metadata") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => return Err(format!("`metadata` must be an object, found {other}")),
    };
    if record.contains_key("data_source") {
        metadata.insert("data_source".into(), text("data_source", true)?.into());
    }
    let item_id = match record.get("id") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => format!("line-{line}"),
    };
    Ok(RewardInput {
        sample_id: line as u64,
        item_id,
        prompt,
        completion,
        completion_ids: Vec::new(),
        finish_reason: FinishReason::Stop,
        reference: record.get("reference").cloned().unwrap_or(Value::Null),
        metadata,
    })
}
