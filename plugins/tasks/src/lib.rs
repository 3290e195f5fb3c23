//! Built-in tasks of areal-rs.
//!
//! - `chain-sum` (task and reward): add a chain of digits step by step, with imperfect
//!   demonstrations for the supervised warm-up; see [`chain_sum`].
//! - `code` (task): programming problems from JSONL files of LiveCodeBench records, in
//!   LiveCodeBench's prompt format, for the `lcb` reward; see [`code`].
//! - `code-arith` (task): the built-in code job, one-line programs computing an arithmetic
//!   function, graded by hidden tests; imperfect demonstrations; see [`code_arith`].
//! - `tool-mul` (task and reward): the built-in multi-turn job, multiplying two numbers with
//!   the `python` tool in episodes of tool-integrated reasoning; imperfect demonstrations; see
//!   [`tool_mul`].
//! - `math` (task): maths problems from JSONL files in MATH's format, for the `math` reward;
//!   see [`math`].
//!
//! ```
//! use areal_sdk::{Split, Task};
//! use areal_tasks::chain_sum::{ChainSum, ChainSumOptions, response};
//!
//! let task = ChainSum::new(ChainSumOptions::default(), 1);
//! assert_eq!(task.len(Split::Eval), Some(500));
//! assert_eq!(response(&[5, 8, 3], || false), "a5=5,b8=13,c3=16>16");
//! assert_eq!(response(&[5, 8, 3], || true), "a5=5,b8=3,c3=6>6");
//! ```

mod answers;
pub mod chain_sum;
pub mod code;
pub mod code_arith;
pub mod math;
mod splits;
pub mod tool_mul;

areal_sdk::register_task!(
    chain_sum::NAME,
    "add a chain of digits step by step (response length grows with the chain); imperfect demonstrations",
    chain_sum::build_task
);
areal_sdk::register_reward!(
    chain_sum::NAME,
    "1 when the answer after the last `>` is the sum of the prompt's digits",
    chain_sum::build_verifier
);
areal_sdk::register_task!(
    math::NAME,
    "maths problems from JSONL (`problem`, `answer`), MATH's format; graded by the `math` reward",
    math::build_task
);
areal_sdk::register_task!(
    code::NAME,
    "programming problems from JSONL (LiveCodeBench records), LiveCodeBench's prompts; graded by the `lcb` reward",
    code::build_task
);
areal_sdk::register_task!(
    code_arith::NAME,
    "write a one-line Python program for an arithmetic function; hidden tests (the `lcb` reward); imperfect demonstrations",
    code_arith::build_task
);
areal_sdk::register_task!(
    tool_mul::NAME,
    "multiply two numbers, with the python tool in a code-block episode; imperfect demonstrations",
    tool_mul::build_task
);
areal_sdk::register_reward!(
    tool_mul::NAME,
    "1 when the number after the last `=` is the product",
    tool_mul::build_verifier
);
