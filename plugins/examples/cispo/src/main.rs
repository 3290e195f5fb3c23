//! `areal` with the CISPO algorithm linked in: every built-in command and plugin, plus
//! `algorithm.kind = "cispo"`.

// Naming the crate links its `inventory` registrations into the binary.
use areal_example_cispo as _;

fn main() -> std::process::ExitCode {
    areal_cli::main()
}
