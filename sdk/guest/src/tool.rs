//! Write a tool (`[[tools]] kind = "wasm"`) in Rust and build it as a WebAssembly component: the
//! world `tool` of `wit/tool.wit`. Implement [`Tool`] and name the type in
//! [`export_tool!`](crate::export_tool):
//!
//! ```ignore
//! use areal_reward_guest::tool::{Schema, Tool};
//! use serde_json::{Map, Value, json};
//!
//! /// Keeps a running total across an episode's calls.
//! struct Tally(i64);
//!
//! impl Tool for Tally {
//!     fn describe(_options: &Value) -> Result<Schema, String> {
//!         Ok(Schema {
//!             name: "tally".into(),
//!             description: "Add a number to the running total and read it.".into(),
//!             parameters: json!({"type": "object", "properties": {"add": {"type": "integer"}}}),
//!         })
//!     }
//!     fn open(_options: &Value, _seed: u64) -> Result<Self, String> {
//!         Ok(Tally(0))
//!     }
//!     fn call(&mut self, arguments: &Map<String, Value>) -> Result<String, String> {
//!         self.0 += arguments.get("add").and_then(Value::as_i64).ok_or("`add` must be an integer")?;
//!         Ok(self.0.to_string())
//!     }
//! }
//!
//! areal_reward_guest::export_tool!(Tally);
//! ```
//!
//! One instance serves one episode: `open` once, then `call` for each of its calls, so what the
//! value keeps persists across them and never reaches another episode.

use serde_json::{Map, Value};

#[doc(hidden)]
#[allow(
    clippy::too_many_arguments,
    missing_docs,
    unreachable_pub,
    reason = "generated code"
)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "tool",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "__export_tool_world",
        default_bindings_module: "areal_reward_guest::tool::bindings",
    });
}

/// What the model is told of the tool.
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    /// The name its calls give.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments (an object).
    pub parameters: Value,
}

/// A tool: described by its options, then one value per episode, called in order.
pub trait Tool: Sized + 'static {
    /// What the model is told of the tool with `options` (the `options` table of its
    /// `[[tools]]` entry; `{}` when absent). An error stops the run at start.
    fn describe(options: &Value) -> Result<Schema, String>;

    /// The state of one episode; `seed` differs per episode.
    fn open(options: &Value, seed: u64) -> Result<Self, String>;

    /// Answer a call: the text the model reads, or an error text it reads. A panic is a trap,
    /// which costs the episode's instance (the next call opens a new one).
    fn call(&mut self, arguments: &Map<String, Value>) -> Result<String, String>;
}

#[doc(hidden)]
pub mod __private {
    use std::cell::RefCell;

    use super::*;
    pub use bindings::Guest;

    thread_local! {
        // An instance is single-threaded and serves one episode.
        static OPENED: RefCell<Option<Box<dyn std::any::Any>>> = const { RefCell::new(None) };
    }

    fn options(text: &str) -> Result<Value, String> {
        if text.trim().is_empty() {
            return Ok(Value::Object(Map::new()));
        }
        serde_json::from_str(text).map_err(|e| format!("options are not JSON: {e}"))
    }

    pub fn describe<T: Tool>(options_text: String) -> Result<String, String> {
        let schema = T::describe(&options(&options_text)?)?;
        let mut out = Map::new();
        out.insert("name".into(), schema.name.into());
        out.insert("description".into(), schema.description.into());
        out.insert("parameters".into(), schema.parameters);
        Ok(Value::Object(out).to_string())
    }

    pub fn open<T: Tool>(options_text: String, seed: u64) -> Result<(), String> {
        let tool = T::open(&options(&options_text)?, seed)?;
        OPENED.with(|o| *o.borrow_mut() = Some(Box::new(tool)));
        Ok(())
    }

    pub fn call<T: Tool>(arguments: String) -> Result<String, String> {
        let arguments = match serde_json::from_str(&arguments) {
            Ok(Value::Object(m)) => m,
            _ => return Err("the arguments are not a JSON object".into()),
        };
        OPENED.with(|o| {
            let mut o = o.borrow_mut();
            let tool = o
                .as_mut()
                .and_then(|t| t.downcast_mut::<T>())
                .ok_or("call before open")?;
            tool.call(&arguments)
        })
    }
}

/// Export a [`Tool`] as the component's world `tool`.
#[macro_export]
macro_rules! export_tool {
    ($tool:ty) => {
        #[doc(hidden)]
        struct __ArealToolExport;

        impl $crate::tool::__private::Guest for __ArealToolExport {
            fn describe(options: ::std::string::String) -> ::std::result::Result<::std::string::String, ::std::string::String> {
                $crate::tool::__private::describe::<$tool>(options)
            }
            fn open(options: ::std::string::String, seed: u64) -> ::std::result::Result<(), ::std::string::String> {
                $crate::tool::__private::open::<$tool>(options, seed)
            }
            fn call(arguments: ::std::string::String) -> ::std::result::Result<::std::string::String, ::std::string::String> {
                $crate::tool::__private::call::<$tool>(arguments)
            }
        }

        $crate::tool::bindings::__export_tool_world!(__ArealToolExport with_types_in $crate::tool::bindings);
    };
}
