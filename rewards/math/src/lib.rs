//! The maths answer verifier: Math-Verify's behaviour, in Rust, with a deadline that works on
//! any thread.
//!
//! - `extract` finds the answer in a completion (last `\boxed{}`, "final
//!   answer" anchors, the last LaTeX span, number or arithmetic).
//! - The parser reads LaTeX and plain maths into [`Math`]: exact rationals, symbols, functions,
//!   intervals, sets, tuples, matrices, relation chains.
//! - [`verify`] decides equality: exact for rationals, after rounding when a side is a
//!   decimal, by canonical form and by value at random points for symbolic expressions,
//!   element-wise for tuples and in any order for sets.
//!
//! Every step asks a [`Deadline`] and stops with [`Timeout`] once it passes: no signals, no
//! helper thread, so it works on the engine's reward threads.
//!
//! As a plugin: `[reward] kind = "math"` with the keys of [`Options`]; the task's reference
//! for each item is the gold answer, a string (or `{ "answer": "..." }`).

mod answer;
mod compare;
mod deadline;
pub mod expr;
mod extract;
mod lexer;
mod normalize;
pub mod number;
mod parser;
/// Rewriting answers into equal and unequal forms, for the MATH-500 agreement test and
/// `areal bench math` (the `rewrite` feature).
#[cfg(feature = "rewrite")]
pub mod rewrite;

use std::sync::Arc;
use std::time::{Duration, Instant};

use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Reward, RewardInput, RewardVerifier, Verdict,
    VerifyContext,
};
use serde::{Deserialize, Serialize};

/// The name the maths reward is registered under (`[reward] kind = "math"`) and signs its
/// rewards with.
pub const NAME: &str = "math";

pub use answer::{Math, RelOp};
pub use deadline::{Deadline, Timeout};
pub use extract::Extracted;

use compare::{Comparer, prepare};

/// How answers are found and compared. The defaults are Math-Verify's, except that the last
/// `\boxed{}` is looked at first (Math-Verify looks at "final answer is" first).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// Find answers in LaTeX (`$...$`, `\(...\)`, `\boxed{}`...).
    pub latex: bool,
    /// Find answers as plain numbers and arithmetic.
    pub expr: bool,
    /// Tier of the last `\boxed{}` among the anchors (0: before everything; 50: with "final
    /// answer ... is"); `None` ignores boxes.
    pub boxed_priority: Option<u32>,
    /// Decimal places to round to when either side is written as a decimal.
    pub float_rounding: u32,
    /// Variables matter (`f(x)` ≠ `f(y)`); `false` renames the prediction's to the gold's.
    pub strict: bool,
    /// Also compare a gold set with a predicted relation (`[-2, 7]` with `-2 ≤ x ≤ 7`); a
    /// gold relation is always compared with a predicted set.
    pub allow_set_relation_comp: bool,
    /// The plugin's own limit per verification, in seconds (the engine's deadline also
    /// applies).
    pub timeout_s: f64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            latex: true,
            expr: true,
            boxed_priority: Some(0),
            float_rounding: 6,
            strict: true,
            allow_set_relation_comp: false,
            timeout_s: 5.0,
        }
    }
}

/// The longest `timeout_s` (an hour): a limit, not a way to wait forever.
pub const MAX_TIMEOUT_S: f64 = 3600.0;
/// The most `float_rounding` places: past what a float holds.
pub const MAX_FLOAT_ROUNDING: u32 = 15;

impl Options {
    /// Check the options; each problem as (option, message naming the value). Callers name
    /// the option their own way (`reward.timeout_s`, `--timeout`).
    pub fn check(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if !(self.timeout_s > 0.0 && self.timeout_s <= MAX_TIMEOUT_S) {
            problems.push((
                "timeout_s",
                format!(
                    "{:?} is not a number of seconds in (0, {MAX_TIMEOUT_S}]",
                    self.timeout_s
                ),
            ));
        }
        if self.float_rounding > MAX_FLOAT_ROUNDING {
            problems.push((
                "float_rounding",
                format!(
                    "{} places is past what a float holds; at most {MAX_FLOAT_ROUNDING}",
                    self.float_rounding
                ),
            ));
        }
        if !self.latex && !self.expr {
            problems.push((
                "latex",
                "with `expr` also false, no answer can ever be found".to_owned(),
            ));
        }
        problems
    }

    /// These options changed by a config in Math-Verify's terms, as its test cases state
    /// them: `match_types` (`["latex", "expr"]`), `latex_boxed_match_priority` (-1: no
    /// boxes), `float_rounding`, `strict`, `allow_set_relation_comp`; `"parse": "default
    /// ..."` changes nothing. An unknown key or a bad value is an error that names it.
    pub fn with_math_verify_config(&self, config: &serde_json::Value) -> Result<Options, String> {
        let mut out = self.clone();
        let Some(map) = config.as_object() else {
            return Err(format!("config must be an object, found {config}"));
        };
        for (key, value) in map {
            let bad = || format!("config key `{key}`: unexpected value {value}");
            match key.as_str() {
                "match_types" => {
                    let kinds = value.as_array().ok_or_else(bad)?;
                    out.latex = false;
                    out.expr = false;
                    for kind in kinds {
                        match kind.as_str() {
                            Some("latex") => out.latex = true,
                            Some("expr") => out.expr = true,
                            _ => {
                                return Err(format!(
                                    "config key `match_types`: unknown match type {kind} (known: \"latex\", \"expr\")"
                                ));
                            }
                        }
                    }
                }
                "latex_boxed_match_priority" => {
                    let p = value.as_i64().ok_or_else(bad)?;
                    out.boxed_priority = u32::try_from(p).ok();
                }
                "float_rounding" => {
                    out.float_rounding = value
                        .as_u64()
                        .and_then(|v| u32::try_from(v).ok())
                        .filter(|v| *v <= MAX_FLOAT_ROUNDING)
                        .ok_or_else(bad)?;
                }
                "strict" => out.strict = value.as_bool().ok_or_else(bad)?,
                "allow_set_relation_comp" => {
                    out.allow_set_relation_comp = value.as_bool().ok_or_else(bad)?
                }
                "parse" => {}
                _ => {
                    return Err(format!(
                        "unknown config key `{key}` (known: match_types, latex_boxed_match_priority, float_rounding, strict, allow_set_relation_comp, parse)"
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// The outcome of one verification.
#[derive(Clone, Debug, PartialEq)]
pub struct Verification {
    /// Whether the prediction answers the gold answer.
    pub equal: bool,
    /// What was read from the gold answer.
    pub gold: Extracted,
    /// What was found in the prediction.
    pub pred: Extracted,
}

impl Verification {
    /// The reward: 1 or 0.
    pub fn reward(&self) -> f64 {
        if self.equal { 1.0 } else { 0.0 }
    }

    /// `accepted`, `wrong_answer`, or `no_answer` when nothing was found in the prediction.
    pub fn verdict(&self) -> Verdict {
        if self.equal {
            Verdict::Accepted
        } else if self.pred.math.is_none() && self.pred.text.is_empty() {
            Verdict::NoAnswer
        } else {
            Verdict::WrongAnswer
        }
    }
}

/// Finds and parses the answer in a completion.
pub fn find_answer(text: &str, options: &Options, dl: &Deadline) -> Result<Extracted, Timeout> {
    extract::extract(text, options, dl)
}

/// Reads a reference answer. A bare answer (`\frac{14}{3}`, `(3, \frac{\pi}{2})`) is read
/// whole; one with maths delimiters or a box (`$x = 3$`, a worked solution) is searched like
/// a completion.
pub fn read_reference(text: &str, options: &Options, dl: &Deadline) -> Result<Extracted, Timeout> {
    // `\$32` is a price, not maths mode.
    let unescaped_dollar = text
        .char_indices()
        .any(|(i, c)| c == '$' && !text[..i].ends_with('\\'));
    let delimited = unescaped_dollar
        || ["\\(", "\\[", "\\boxed", "\\fbox"]
            .iter()
            .any(|d| text.contains(d));
    if !delimited && options.latex {
        let cleaned = normalize::normalize(text);
        if let Some(math) = extract::parse_answer(&cleaned, dl)? {
            return Ok(Extracted {
                math: Some(math),
                text: cleaned,
            });
        }
    }
    find_answer(text, options, dl)
}

/// Whether the answer found in `pred` equals the reference answer `gold`.
pub fn verify(
    gold: &str,
    pred: &str,
    options: &Options,
    dl: &Deadline,
) -> Result<Verification, Timeout> {
    let gold = read_reference(gold, options, dl)?;
    let pred = find_answer(pred, options, dl)?;
    let equal = equal_answers(&gold, &pred, options, dl)?;
    Ok(Verification { equal, gold, pred })
}

/// Whether two extracted answers are equal: as parsed maths, or as identical cleaned text
/// when neither could be parsed the same way.
pub fn equal_answers(
    gold: &Extracted,
    pred: &Extracted,
    options: &Options,
    dl: &Deadline,
) -> Result<bool, Timeout> {
    if let (Some(g), Some(p)) = (&gold.math, &pred.math) {
        let (g, p) = (prepare(g, dl)?, prepare(p, dl)?);
        if Comparer::new(options, dl).equal(&g, &p)? {
            return Ok(true);
        }
    }
    Ok(!gold.text.is_empty() && gold.text.trim() == pred.text.trim())
}

/// The canonical form of an answer, as text (what `areal grade math` prints).
pub fn canonical_text(m: &Math, dl: &Deadline) -> Result<String, Timeout> {
    Ok(prepare(m, dl)?.to_string())
}

/// The version string in every reward's provenance.
pub fn verifier_version() -> String {
    format!("areal-reward-math {}", env!("CARGO_PKG_VERSION"))
}

/// The `math` reward: 1 when the completion's answer equals the reference.
#[derive(Debug)]
pub struct MathVerifier {
    options: Options,
}

impl MathVerifier {
    /// A verifier with `options`.
    pub fn new(options: Options) -> Self {
        Self { options }
    }

    /// The gold answer of a task item: a string, a number, or `{ "answer": ... }`.
    fn reference(input: &RewardInput) -> Result<String, PluginError> {
        let value = match &input.reference {
            serde_json::Value::Object(map) => map.get("answer").cloned().unwrap_or_default(),
            other => other.clone(),
        };
        match value {
            serde_json::Value::String(s) => Ok(s),
            serde_json::Value::Number(n) => Ok(n.to_string()),
            other => Err(PluginError::failed(
                NAME,
                format!(
                    "item {}: the reference must be an answer string or {{\"answer\": ...}}, found {other}",
                    input.item_id
                ),
            )),
        }
    }
}

impl RewardVerifier for MathVerifier {
    fn name(&self) -> &str {
        NAME
    }

    fn verify(&self, input: &RewardInput, ctx: &VerifyContext) -> Result<Reward, PluginError> {
        let started = Instant::now();
        let gold = Self::reference(input)?;
        let own = started + Duration::from_secs_f64(self.options.timeout_s);
        let dl = Deadline::at(own.min(ctx.deadline()));
        let v = verify(&gold, &input.completion, &self.options, &dl).map_err(|_| {
            PluginError::failed(
                NAME,
                format!(
                    "item {}: verification ran past its deadline ({} s)",
                    input.item_id, self.options.timeout_s
                ),
            )
        })?;
        let parsed = |e: &Extracted| match &e.math {
            Some(m) => canonical_text(m, &Deadline::after(Duration::from_millis(100)))
                .unwrap_or_else(|_| m.to_string()),
            None => String::new(),
        };
        let mut reward = Reward::new(v.reward(), v.verdict())
            .with_version(verifier_version())
            .with_limit("timeout_s", self.options.timeout_s)
            .with_limit("float_rounding", u64::from(self.options.float_rounding))
            .with_detail("gold", parsed(&v.gold))
            .with_detail("pred", parsed(&v.pred))
            .with_detail("pred_text", v.pred.text.as_str());
        reward.provenance.verifier = NAME.into();
        reward.provenance.wall_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(reward)
    }

    fn cache_identity(&self) -> Option<String> {
        let options = serde_json::to_string(&self.options).ok()?;
        Some(format!("{}; options {options}", verifier_version()))
    }
}

fn build_verifier(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn RewardVerifier>, PluginError> {
    let options: Options = config.parse()?;
    if let Some((key, message)) = options.check().into_iter().next() {
        return Err(config.invalid(key, message));
    }
    Ok(Arc::new(MathVerifier::new(options)))
}

areal_sdk::register_reward!(
    NAME,
    "maths answers: the completion's final answer equals the reference (Math-Verify rules)",
    build_verifier
);
