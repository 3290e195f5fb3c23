//! Run the guest interpreter by hand: `cargo run --release -p areal-sandbox --example guest --
//! -c "print(1)"`. Stdin is passed through; the outcome, timings and output are printed.
#![allow(clippy::print_stdout, reason = "the command's output is its stdout")]

use std::io::Read as _;

use areal_sandbox::{Limits, Run, Sandbox, Settings};

fn main() -> anyhow::Result<()> {
    let sandbox = Sandbox::new(&Settings::default())?;
    let mut stdin = Vec::new();
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        std::io::stdin().read_to_end(&mut stdin)?;
    }
    let run = Run {
        args: std::env::args().skip(1).collect(),
        stdin,
        limits: Limits::default(),
        ..Run::default()
    };
    let report = sandbox.run_blocking(&run)?;
    println!("outcome: {:?}", report.outcome);
    println!(
        "wall: {:.1} ms (instantiation {:.2} ms), peak memory {} MiB",
        report.wall.as_secs_f64() * 1e3,
        report.startup.as_secs_f64() * 1e3,
        report.peak_memory >> 20
    );
    println!("--- stdout\n{}", String::from_utf8_lossy(&report.stdout));
    println!("--- stderr\n{}", String::from_utf8_lossy(&report.stderr));
    Ok(())
}
