//! `areal grade`: grade a file of completions with a reward verifier, outside training.

use clap::Subcommand;

mod code;
mod input;
mod math;

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
}

pub(crate) fn run(command: GradeCommand) -> anyhow::Result<()> {
    match command {
        GradeCommand::Code(args) => code::run(args),
        GradeCommand::Math(args) => math::run(args),
    }
}
