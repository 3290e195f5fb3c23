//! `areal eval`: a checkpoint on the task's held-out split, greedy pass@1 or sampled pass@k.

use std::path::PathBuf;

use clap::Args;

use crate::configs::{ConfigArgs, loader};
use crate::runtime;
use areal_core::reward_workers::in_workers;

#[derive(Debug, Args)]
pub(crate) struct EvalArgs {
    /// A checkpoint folder (e.g. `runs/NAME/checkpoint`).
    checkpoint: PathBuf,
    /// A LoRA adapter folder in PEFT's format (`adapter_config.json`,
    /// `adapter_model.safetensors`) to apply over the checkpoint, its base.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// The run's config; by default the `config.toml` next to the checkpoint, if any.
    #[command(flatten)]
    config: ConfigArgs,
    /// Which held-out split.
    #[arg(long, default_value = "eval", value_parser = ["eval", "validation"])]
    split: String,
    /// Completions per item: 1 is greedy pass@1; more are sampled for pass@k.
    #[arg(short, long, default_value_t = 1)]
    k: usize,
    /// Sampling temperature for k > 1 (default: the run's `rollout.temperature`).
    #[arg(long)]
    temperature: Option<f32>,
    /// Evaluate at most this many items (0: all).
    #[arg(long, default_value_t = 0)]
    max_items: usize,
    /// Print this many graded completions.
    #[arg(long, default_value_t = 0)]
    show: usize,
}

/// Run `areal eval`.
pub(crate) fn run(args: EvalArgs) -> anyhow::Result<()> {
    let mut config_args = args.config;
    if config_args.config.is_none() {
        // a checkpoint inside a run folder: use that run's config
        let beside = args.checkpoint.parent().map(|p| p.join("config.toml"));
        config_args.config = beside.filter(|p| p.exists());
    }
    let (config, mut plugins) = areal_core::resolve(&loader(&config_args)?)?;
    let _workers = in_workers(&config, &mut plugins.verifier, None)?;
    let split = if args.split == "validation" {
        areal_sdk::Split::Validation
    } else {
        areal_sdk::Split::Eval
    };
    let k = args.k.max(1);
    let sampling = if k == 1 {
        areal_sdk::SamplingParams::greedy()
    } else {
        areal_sdk::SamplingParams {
            temperature: args.temperature.unwrap_or(config.rollout.temperature),
            top_p: config.rollout.top_p,
            seed: config.seed,
        }
    };
    let spec = areal_core::eval::EvalSpec {
        samples: k,
        sampling,
        ..areal_core::eval::EvalSpec::greedy(&config, split, args.max_items)
    };
    let runtime = runtime()?;
    let outcome = runtime.block_on(areal_core::eval::evaluate_adapted(
        &config,
        plugins,
        &args.checkpoint,
        args.adapter.as_deref(),
        &spec,
    ))?;
    #[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
    {
        for item in outcome.results.iter().take(args.show) {
            for g in &item.completions {
                println!(
                    "{}  {}{}  [{}]",
                    item.item_id,
                    item.prompt,
                    g.completion,
                    g.verdict.as_str()
                );
            }
        }
        if k == 1 {
            println!(
                "{}: greedy pass@1 {:.3} on {} {} items (reward {:.3})",
                args.checkpoint.display(),
                outcome.accuracy,
                outcome.items,
                split.as_str(),
                outcome.reward_mean
            );
        } else {
            println!(
                "{}: pass@1 {:.3}, pass@{k} {:.3} on {} {} items, {k} samples each at temperature {}",
                args.checkpoint.display(),
                outcome.accuracy,
                outcome.pass_at_k,
                outcome.items,
                split.as_str(),
                spec.sampling.temperature
            );
        }
        println!(
            "{}",
            serde_json::to_string(&outcome).expect("the outcome serialises")
        );
    }
    Ok(())
}
