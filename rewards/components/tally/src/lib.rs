//! A tool as a WebAssembly component (`[[tools]] kind = "wasm"`): a running total kept across
//! the calls of one episode, the example of docs/agents.md and what the tests call. It also
//! misbehaves when asked, for the tests of the limits a call runs under.
//!
//! ```toml
//! [[tools]]
//! kind = "wasm"
//! path = ".cache/components/tally.wasm"
//! options = { start = 0 }
//! ```
//!
//! Arguments: `{"add": n}` adds `n` and answers the total; `{"seed": true}` answers the
//! episode's seed; `{"spin": true}` never returns; `{"hoard_mb": n}` keeps `n` MB; `{"shout":
//! n}` prints `n` bytes; `{"panic": true}` panics.

use areal_reward_guest::tool::{Schema, Tool};
use serde_json::{Map, Value, json};

struct Tally {
    total: i64,
    seed: u64,
    hoard: Vec<Vec<u8>>,
}

fn start(options: &Value) -> Result<i64, String> {
    let mut start = 0;
    for (key, value) in options.as_object().into_iter().flatten() {
        match key.as_str() {
            "start" => {
                start = value
                    .as_i64()
                    .ok_or_else(|| format!("`start` must be an integer, found {value}"))?
            }
            other => return Err(format!("unknown option `{other}` (known: `start`)")),
        }
    }
    Ok(start)
}

impl Tool for Tally {
    fn describe(options: &Value) -> Result<Schema, String> {
        start(options)?;
        Ok(Schema {
            name: "tally".into(),
            description: "Add a number to the running total and answer the total.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"add": {"type": "integer", "description": "What to add."}},
                "required": ["add"],
            }),
        })
    }

    fn open(options: &Value, seed: u64) -> Result<Self, String> {
        Ok(Tally {
            total: start(options)?,
            seed,
            hoard: Vec::new(),
        })
    }

    fn call(&mut self, arguments: &Map<String, Value>) -> Result<String, String> {
        if arguments.get("spin").is_some() {
            let mut x: u64 = 1;
            loop {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        if let Some(mb) = arguments.get("hoard_mb").and_then(Value::as_u64) {
            for _ in 0..mb {
                self.hoard.push(vec![1u8; 1 << 20]);
            }
            return Ok(format!("holding {} MB", self.hoard.len()));
        }
        if let Some(n) = arguments.get("shout").and_then(Value::as_u64) {
            print!("{}", "y".repeat(n as usize));
            return Ok("shouted".into());
        }
        if arguments.get("panic").is_some() {
            panic!("asked to panic");
        }
        if arguments.get("seed").is_some() {
            return Ok(self.seed.to_string());
        }
        let add = arguments
            .get("add")
            .and_then(Value::as_i64)
            .ok_or("`add` must be an integer")?;
        self.total = self
            .total
            .checked_add(add)
            .ok_or("the total would overflow")?;
        Ok(self.total.to_string())
    }
}

areal_reward_guest::export_tool!(Tally);
