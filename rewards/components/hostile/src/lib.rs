//! A reward component that misbehaves on purpose, as the completion asks: the sandbox's
//! tests run it to see that each attack costs one sample and leaves the host unharmed.
//!
//! | completion | what it does |
//! |---|---|
//! | `loop` | spins forever |
//! | `memory` | allocates until it is stopped |
//! | `flood` | prints to stdout forever |
//! | `stderr` | prints to stderr forever |
//! | `sleep` | sleeps for an hour |
//! | `files` | reads host files and lists `/`; reports what it saw |
//! | `env` | reports its environment variables and arguments |
//! | `net` | opens a TCP connection to 127.0.0.1:22 and reports what happened |
//! | `panic` | panics (a trap) |
//! | `nan` | returns a reward of NaN |
//! | `big` | returns 64 MiB of details |
//! | `recurse` | recurses without end (stack overflow) |
//! | anything else | reward 1 |
//!
//! Option `refuse = true` makes `configure` fail.

use std::io::Write;

use areal_reward_guest::{Outcome, Reward, Sample, Verdict};
use serde_json::{Value, json};

struct Hostile;

impl Reward for Hostile {
    fn configure(options: Value) -> Result<Self, String> {
        if options["refuse"] == json!(true) {
            return Err("refused: `refuse` is set".into());
        }
        Ok(Hostile)
    }

    fn score(&self, sample: &Sample) -> Result<Outcome, String> {
        let ok = |details: Value| {
            let mut o = Outcome::new(0.0, Verdict::WrongAnswer);
            if let Value::Object(m) = details {
                o.details = m;
            }
            Ok(o)
        };
        match sample.completion.as_str() {
            "loop" => {
                let mut x: u64 = 1;
                loop {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            "memory" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "flood" => {
                let line = [b'x'; 4096];
                let mut out = std::io::stdout();
                loop {
                    let _ = out.write_all(&line);
                }
            }
            "stderr" => {
                let line = [b'x'; 4096];
                let mut err = std::io::stderr();
                loop {
                    let _ = err.write_all(&line);
                }
            }
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                ok(json!({}))
            }
            "files" => {
                let read = |p: &str| match std::fs::read_to_string(p) {
                    Ok(s) => format!("read {} bytes", s.len()),
                    Err(e) => format!("error: {e}"),
                };
                let listed = match std::fs::read_dir("/") {
                    Ok(d) => format!("listed {} entries", d.count()),
                    Err(e) => format!("error: {e}"),
                };
                ok(json!({
                    "/etc/passwd": read("/etc/passwd"),
                    "Cargo.toml": read("Cargo.toml"),
                    "/": listed,
                }))
            }
            "env" => ok(json!({
                "vars": std::env::vars().count(),
                "args": std::env::args().count(),
            })),
            "net" => ok(json!({
                "connect": match std::net::TcpStream::connect("127.0.0.1:22") {
                    Ok(_) => "connected".to_owned(),
                    Err(e) => format!("error: {e}"),
                }
            })),
            "panic" => panic!("the hostile reward panics on purpose"),
            "nan" => Ok(Outcome::new(f64::NAN, Verdict::Accepted)),
            "big" => ok(json!({ "blob": "y".repeat(64 << 20) })),
            "recurse" => Ok(Outcome::new(recurse(1) as f64, Verdict::Accepted)),
            _ => Ok(Outcome::new(1.0, Verdict::Accepted)),
        }
    }
}

#[allow(
    unconditional_recursion,
    reason = "it recurses until the stack overflows, on purpose"
)]
fn recurse(n: u64) -> u64 {
    let frame = std::hint::black_box([n; 64]);
    recurse(frame[3] + 1) + frame[7]
}

areal_reward_guest::export!(Hostile);
