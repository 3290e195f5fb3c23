//! Built-in tools for agent episodes.
//!
//! - `python` ([`PythonTool`]): runs the model's code in the wasm sandbox, in a session of
//!   its episode: names defined by one call are there for the next, and no other episode sees
//!   them. What the code prints comes back, then the value of its last line when that is an
//!   expression, then the traceback of an exception it raised; output is cut past
//!   `output_bytes`. A call past its time or memory limit costs that call and the session's
//!   state (the model is told), never the run.

mod python;

/// The registered name of the `python` tool.
pub const PYTHON: &str = "python";

pub use python::{PythonTool, PythonToolOptions};
