//! `areal` with the `chain-steps` reward linked in: every built-in command and plugin, plus
//! `reward.kind = "chain-steps"`.

// Naming the crate links its `inventory` registrations into the binary.
use areal_example_chain_steps as _;

fn main() -> std::process::ExitCode {
    areal_cli::main()
}
