//! The maths verifier on arbitrary text: a gold answer and a prediction (split at the first
//! NUL, or the text against itself). It may find nothing; it must never panic, and it must
//! come back within its deadline (libFuzzer's `-timeout` catches one that does not).
#![no_main]

use std::time::Duration;

use areal_reward_math::{Deadline, Options, verify};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (gold, pred) = text.split_once('\0').unwrap_or((text, text));
    let options = Options::default();
    let _ = verify(
        gold,
        pred,
        &options,
        &Deadline::after(Duration::from_secs(2)),
    );
});
