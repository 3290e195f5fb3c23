//! `areal grade`: grade a file of completions with a reward verifier, outside training.

use clap::Subcommand;

pub(crate) mod code;
mod input;
mod math;
mod reward;

#[derive(Debug, Subcommand)]
pub(crate) enum GradeCommand {
    /// Grade programs on LiveCodeBench records in the wasm sandbox. Each input line is a
    /// record plus `completion` (the model's whole response; its last fenced block is the
    /// code) or `code`. Prints one JSON line per input line, in order.
    Code(code::GradeCodeArgs),
    /// Grade maths answers against references (Math-Verify's rules). Each input line is
    /// `{"gold": ..., "pred": ...}`; prints one JSON line per input line, in order, with the
    /// reward, the verdict and the parsed form of both sides.
    Math(math::GradeMathArgs),
    /// Grade samples with the `[reward]` of a config — compiled in, a WASM component or a
    /// Python file — to test a reward before training with it. Each input line is
    /// `{"prompt", "completion", "reference"}` (plus optional `data_source`, `metadata`, `id`);
    /// prints one JSON line per input line, in order: `reward`, `verdict`, `details`,
    /// `wall_ms`, and `error` when the reward failed (grading goes on).
    Reward(reward::GradeRewardArgs),
}

pub(crate) fn run(command: GradeCommand) -> anyhow::Result<()> {
    match command {
        GradeCommand::Code(args) => code::run(args),
        GradeCommand::Math(args) => math::run(args),
        GradeCommand::Reward(args) => reward::run(args),
    }
}
