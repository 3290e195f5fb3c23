//! The comparison of outputs on arbitrary bytes: Python's `json.loads` of an expected output,
//! the harness's closed encoding of a return value, LiveCodeBench's line rule. Besides never
//! panicking: a value without NaN equals itself, and the line rule is symmetric and reflexive.
#![no_main]

use areal_reward_code::compare::{parse_guest_value, parse_python_json, stdout_matches};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_guest_value(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(v) = parse_python_json(text) {
        if !text.contains("NaN") {
            assert!(v.py_eq(&v), "{text:?} is not equal to itself");
        }
        assert_eq!(Ok(v), parse_python_json(text));
    }
    let mut mid = text.len() / 2;
    while !text.is_char_boundary(mid) {
        mid -= 1;
    }
    let (a, b) = text.split_at(mid);
    assert_eq!(stdout_matches(a, b), stdout_matches(b, a), "{a:?} / {b:?}");
    assert!(stdout_matches(a, a));
});
