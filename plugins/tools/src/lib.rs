//! Built-in tools for agent episodes, and the episode that calls them.
//!
//! - `python` ([`PythonTool`]): runs the model's code in the wasm sandbox, in a session of
//!   its episode: names defined by one call are there for the next, and no other episode sees
//!   them. What the code prints comes back, then the value of its last line when that is an
//!   expression, then the traceback of an exception it raised; output is cut past
//!   `output_bytes`. A call past its time or memory limit costs that call and the session's
//!   state (the model is told), never the run.
//! - `python-function` ([`PythonFunction`]): a Python function from a file, loaded when the run
//!   starts, called by its name with the model's arguments as keyword arguments, in the same
//!   sandbox and limits.
//! - `wasm` ([`WasmTool`]): a tool compiled to a WebAssembly component (Rust:
//!   `areal_reward_guest::tool`), loaded when the run starts, one instance per episode kept
//!   between its calls, under the same kinds of limits.
//! - `tool-calls` ([`ToolCalls`], an episode): the policy's turns with the calls they make in
//!   its chat template's format run between them, each answer appended in the template's
//!   markup; a malformed call's answer says what is wrong. The turn without calls is graded.
//! - `retry` ([`Retry`], an episode, AReaL's multi-turn workflow): after a wrong answer the
//!   policy hears so and answers again; a right answer at turn t earns its reward ×
//!   `turn_discount`^(t − 1).

mod python;
mod python_function;
mod retry;
mod tool_calls;
mod wasm;

/// The registered name of the `python` tool.
pub const PYTHON: &str = "python";

pub use python::{MAX_SESSIONS, PythonTool, PythonToolOptions};
pub use python_function::{PYTHON_FUNCTION, PythonFunction, PythonFunctionOptions};
pub use retry::{RETRY, Retry, RetryOptions};
pub use tool_calls::{Graded, Markup, TOOL_CALLS, ToolCalls, ToolCallsOptions};
pub use wasm::{WASM, WasmTool, WasmToolOptions};

areal_sdk::register_episode!(
    RETRY,
    "AReaL's multi-turn workflow: answer again after a wrong answer, a right one discounted by turn_discount per try",
    retry::build
);
areal_sdk::register_episode!(
    TOOL_CALLS,
    "turns with tool calls in the chat template's format, each call run and answered before the next turn",
    tool_calls::build
);
