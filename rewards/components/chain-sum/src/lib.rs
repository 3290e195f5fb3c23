//! The built-in `chain-sum` reward as a WebAssembly component: 1 when the digits after the
//! completion's last `>` are the item's `answer`, 0 otherwise.
//!
//! ```toml
//! [reward]
//! kind = "wasm"
//! path = ".cache/components/chain-sum.wasm"
//! ```

use areal_reward_guest::{Outcome, Reward, Sample, Verdict};
use serde_json::Value;

struct ChainSum {
    /// The reward of a wrong answer (option `wrong`, by default 0).
    wrong: f64,
}

impl Reward for ChainSum {
    fn configure(options: Value) -> Result<Self, String> {
        let mut wrong = 0.0;
        for (key, value) in options.as_object().into_iter().flatten() {
            match key.as_str() {
                "wrong" => {
                    wrong = value
                        .as_f64()
                        .filter(|w| w.is_finite())
                        .ok_or_else(|| format!("`wrong` must be a number, found {value}"))?
                }
                other => return Err(format!("unknown option `{other}` (known: `wrong`)")),
            }
        }
        Ok(ChainSum { wrong })
    }

    fn score(&self, sample: &Sample) -> Result<Outcome, String> {
        let answer = sample.reference["answer"]
            .as_u64()
            .ok_or("the reference has no integer `answer`")?;
        Ok(match final_answer(&sample.completion) {
            None => Outcome::new(self.wrong, Verdict::NoAnswer),
            Some(a) if a == answer => Outcome::new(1.0, Verdict::Accepted).with_detail("answer", a),
            Some(a) => Outcome::new(self.wrong, Verdict::WrongAnswer).with_detail("answer", a),
        })
    }
}

/// The digits after the last `>`.
fn final_answer(completion: &str) -> Option<u64> {
    let tail = completion.rsplit_once('>')?.1.trim();
    if tail.is_empty() || tail.len() > 18 || !tail.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    tail.parse().ok()
}

areal_reward_guest::export!(ChainSum);
