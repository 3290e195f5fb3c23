//! `areal lora`: LoRA adapters outside training (`merge`: a base checkpoint and a PEFT adapter
//! folded into one full checkpoint).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub(crate) enum LoraCommand {
    /// Fold a PEFT adapter into its base: a full checkpoint folder (`config.json`,
    /// `model.safetensors`, the tokenizer's files) that any tool loads without PEFT.
    Merge(MergeArgs),
}

#[derive(Debug, Args)]
pub(crate) struct MergeArgs {
    /// The base checkpoint folder the adapter was trained on.
    #[arg(long)]
    base: PathBuf,
    /// The adapter folder (`adapter_config.json`, `adapter_model.safetensors`), e.g.
    /// `runs/NAME/checkpoint/adapter`.
    #[arg(long)]
    adapter: PathBuf,
    /// Where to write the merged checkpoint: a new or empty folder (never a link).
    #[arg(long)]
    out: PathBuf,
    /// Replace `--out` when it is a folder that holds anything (a checkpoint merged before).
    #[arg(long)]
    overwrite: bool,
}

pub(crate) fn run(command: LoraCommand) -> anyhow::Result<()> {
    match command {
        LoraCommand::Merge(args) => merge(&args),
    }
}

#[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
fn merge(args: &MergeArgs) -> anyhow::Result<()> {
    let adapter_config =
        areal_model::merge_adapter(&args.base, &args.adapter, &args.out, args.overwrite)
            .with_context(|| {
                format!(
                    "merging {} into {}",
                    args.adapter.display(),
                    args.base.display()
                )
            })?;
    println!(
        "merged {} (rank {}, {} projections) into {}: {}",
        args.adapter.display(),
        adapter_config.rank,
        adapter_config.target_modules.join(", "),
        args.base.display(),
        args.out.display()
    );
    Ok(())
}
