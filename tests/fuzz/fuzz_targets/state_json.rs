//! A resume checkpoint's `state.json` on arbitrary bytes, read and checked as a resume does: it
//! may refuse anything; it must never panic or hang (a checkpoint file is untrusted input).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = areal_core::fuzz::checkpoint_state(data);
});
