//! Issue 37: the guest behaves as the 64-bit CPython that LiveCodeBench runs.

use areal_reward_code::GradeOptions;
use serde_json::Value;

use crate::second_pass::run_with;

/// Limits that only stop a runaway: these programs are checked for what they print.
fn roomy() -> GradeOptions {
    GradeOptions {
        timeout_s: 20.0,
        time_scale: 1.0,
        memory_mb: 1024,
        output_bytes: 1 << 20,
        ..GradeOptions::default()
    }
}

/// Sets and frozensets iterate in 64-bit CPython's order, and `hash()` gives its values: 5,000
/// random cases (`fixtures/hash_order.py`: sets of grid cells, tuples, large ints, floats,
/// strings, frozensets, mixed numbers and keys that collide in their low bits, built, thinned,
/// combined and popped), each line's checksum against what `PYTHONHASHSEED=0 python3.11`
/// printed (`scripts/hash_order_cases.py`).
#[test]
#[allow(clippy::print_stderr, reason = "the test prints what it measured")]
fn sets_iterate_and_hash_as_in_64_bit_cpython() {
    let program = std::fs::read_to_string(crate::fixture("hash_order.py")).unwrap();
    let expected = std::fs::read_to_string(crate::fixture("hash_order.jsonl")).unwrap();
    let (mut cases, mut mismatches) = (0, Vec::new());
    for line in expected.lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let seed = case["seed"].as_u64().unwrap();
        let native = case["output"].as_str().unwrap();
        let report = run_with(&program, &format!("{seed}\n"), &roomy());
        let printed = String::from_utf8_lossy(&report.stdout);
        assert_eq!(
            printed.lines().count(),
            native.lines().count(),
            "seed {seed}: {:?}\n{}",
            report.outcome,
            String::from_utf8_lossy(&report.stderr)
        );
        for (guest, native) in printed.lines().zip(native.lines()) {
            cases += 1;
            if guest != native {
                mismatches.push(format!("seed {seed}: {guest} (native: {native})"));
            }
        }
    }
    assert_eq!(cases, 5000);
    eprintln!("hash order: {cases} cases, {} mismatches", mismatches.len());
    assert!(
        mismatches.is_empty(),
        "{} of {cases} cases differ from 64-bit CPython (rerun a seed with \
         `echo SEED | PYTHONHASHSEED=0 python3.11 rewards/code/tests/fixtures/hash_order.py`):\n{}",
        mismatches.len(),
        mismatches[..mismatches.len().min(20)].join("\n")
    );
}
