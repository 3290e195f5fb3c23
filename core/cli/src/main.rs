//! The `areal` binary.

fn main() -> std::process::ExitCode {
    areal_cli::main()
}
