//! `code-arith`: the built-in code job — write a one-line Python program computing an
//! arithmetic function of its input, graded by running hidden tests in the sandbox (the
//! `lcb` reward).
//!
//! A problem states the function in maths notation and one example; the program reads `n`
//! from stdin and prints `f(n)`:
//!
//! ```text
//! f(n)=3(n-2)          ```python
//! f(5)=9         →     n=int(input())
//!                      print(3*(n-2))
//!                      ```
//! ```
//!
//! Each problem is a LiveCodeBench record (the example is its public test, three other
//! inputs its private tests), so the `lcb` reward grades it exactly as it grades
//! LiveCodeBench, and a program that prints the example's answer passes the public test and
//! fails the rest.
//!
//! **Demonstrations are imperfect on purpose**, with the mistakes of a writer who copies the
//! notation: with probability `demo_error` (0.7 by default) the demonstration writes `3n+2`
//! as `3n+2` (a syntax error), `3(n-2)` as `3*n-2` (precedence), `n^2` as `n^2` (XOR in
//! Python); with probability `demo_hardcode` (0.1) it prints the example's answer. A model
//! warmed up on them makes those mistakes more often than not; only the hidden tests teach it
//! to write the program right.
//!
//! **Splits are disjoint by function**: a function's hash puts it in exactly one of train,
//! validation and eval, so no held-out function is ever trained on (with any example).

use std::sync::Arc;

use areal_sdk::{
    BuildContext, PluginConfig, PluginError, Split, Task, TaskItem, mix_seed, stable_hash,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::code::{CodeProblem, CodeTask, fence};
use crate::splits::held_out_draws;

/// The name the task is registered under (`[task] kind = "code-arith"`).
pub const NAME: &str = "code-arith";

/// Every character of the task's prompts and responses (the policy's alphabet in
/// `rewards/code/examples/code-arith.toml`).
pub const ALPHABET: &str = "0123456789abcdefghijklmnopqrstuvwxyz()*+-^=`\n";

/// The prompt template: the problem alone.
pub const TEMPLATE: &str = "{question}\n";

/// How the function is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Form {
    /// `a n + b`, written `3n+2`.
    Affine {
        /// The factor.
        a: i64,
        /// The constant.
        b: i64,
    },
    /// `a (n + b)`, written `3(n+2)`.
    Scaled {
        /// The factor.
        a: i64,
        /// The constant inside the brackets.
        b: i64,
    },
    /// `n^k + b`, written `n^2+5`.
    Power {
        /// The power.
        k: u32,
        /// The constant.
        b: i64,
    },
}

fn signed(b: i64) -> String {
    if b < 0 {
        format!("-{}", -b)
    } else {
        format!("+{b}")
    }
}

impl Form {
    /// The function in maths notation, as the prompt states it.
    pub fn notation(self) -> String {
        match self {
            Form::Affine { a, b } => format!("{a}n{}", signed(b)),
            Form::Scaled { a, b } => format!("{a}(n{})", signed(b)),
            Form::Power { k, b } => format!("n^{k}{}", signed(b)),
        }
    }

    /// The expression in Python.
    pub fn python(self) -> String {
        match self {
            Form::Affine { a, b } => format!("{a}*n{}", signed(b)),
            Form::Scaled { a, b } => format!("{a}*(n{})", signed(b)),
            Form::Power { k, b } => format!("n**{k}{}", signed(b)),
        }
    }

    /// The expression as a writer who copies the notation gets it wrong.
    pub fn mistaken(self) -> String {
        match self {
            Form::Affine { a, b } => format!("{a}n{}", signed(b)),
            Form::Scaled { a, b } => format!("{a}*n{}", signed(b)),
            Form::Power { k, b } => format!("n^{k}{}", signed(b)),
        }
    }

    /// f(n).
    pub fn eval(self, n: i64) -> i64 {
        match self {
            Form::Affine { a, b } => a * n + b,
            Form::Scaled { a, b } => a * (n + b),
            Form::Power { k, b } => n.pow(k) + b,
        }
    }

    /// What the mistaken program prints for `n`, when it runs at all.
    fn mistaken_eval(self, n: i64) -> Option<i64> {
        match self {
            Form::Affine { .. } => None,
            Form::Scaled { a, b } => Some(a * n + b),
            Form::Power { k, b } => Some(n ^ (i64::from(k) + b)),
        }
    }
}

/// A whole program for `expression`.
pub fn program(expression: &str) -> String {
    format!("n=int(input())\nprint({expression})")
}

/// Options of the `code-arith` task.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodeArithOptions {
    /// Size of the eval split. By default 200.
    pub eval_items: usize,
    /// Size of the validation split. By default 100.
    pub validation_items: usize,
    /// Probability that a demonstration makes the notation's mistake. By default 0.7.
    pub demo_error: f64,
    /// Probability that a demonstration prints the example's answer instead. By default 0.1.
    pub demo_hardcode: f64,
}

impl Default for CodeArithOptions {
    fn default() -> Self {
        Self {
            eval_items: 200,
            validation_items: 100,
            demo_error: 0.7,
            demo_hardcode: 0.1,
        }
    }
}

/// The split a function belongs to: 1 in 10 to eval, 1 in 10 to validation, the rest train.
pub fn split_of(form: Form) -> Split {
    match stable_hash(&form.notation()) % 10 {
        0 => Split::Eval,
        1 => Split::Validation,
        _ => Split::Train,
    }
}

fn draw(rng: &mut StdRng) -> (Form, i64) {
    let nonzero = |rng: &mut StdRng| {
        let b: i64 = rng.random_range(1..=12);
        if rng.random::<bool>() { b } else { -b }
    };
    let form = match rng.random_range(0..5u32) {
        0 | 1 => Form::Affine {
            a: rng.random_range(2..=12),
            b: nonzero(rng),
        },
        2 | 3 => Form::Scaled {
            a: rng.random_range(2..=12),
            b: nonzero(rng),
        },
        _ => Form::Power {
            k: rng.random_range(2..=3),
            b: nonzero(rng),
        },
    };
    (form, rng.random_range(1..=9))
}

/// The problem for `form` with the example `n = example`, as a LiveCodeBench record: the
/// example its public test, three other inputs (on which the mistaken program is wrong at
/// least once) its private tests.
pub fn record(id: &str, form: Form, example: i64) -> Value {
    let test = |n: i64| json!({"input": format!("{n}\n"), "output": format!("{}\n", form.eval(n)), "testtype": "stdin"});
    let mut rng = StdRng::seed_from_u64(stable_hash(&format!("{}/{example}", form.notation())));
    let mut hidden: Vec<i64> = Vec::new();
    while hidden.len() < 3 {
        let n = rng.random_range(-20..=30);
        if n != example && !hidden.contains(&n) {
            hidden.push(n);
        }
        if hidden.len() == 3
            && hidden
                .iter()
                .all(|&n| form.mistaken_eval(n) == Some(form.eval(n)))
        {
            hidden.clear();
        }
    }
    let public: Vec<Value> = vec![test(example)];
    let private: Vec<Value> = hidden.into_iter().map(test).collect();
    json!({
        "question_id": id,
        "question_title": form.notation(),
        "question_content": format!("f(n)={}\nf({example})={}", form.notation(), form.eval(example)),
        "starter_code": "",
        "public_test_cases": serde_json::to_string(&public).expect("JSON"),
        "private_test_cases": serde_json::to_string(&private).expect("JSON"),
        "metadata": "{}",
        "platform": NAME,
        "difficulty": "easy",
        // what the task needs back for the item's demonstration
        NAME: { "form": form, "example": example },
    })
}

/// The task: a [`CodeTask`] over records made from the seed.
#[derive(Clone, Debug)]
pub struct CodeArith {
    options: CodeArithOptions,
    seed: u64,
    held_out: CodeTask,
}

impl CodeArith {
    /// The task with `options`; its held-out splits follow from `seed`.
    pub fn new(options: CodeArithOptions, seed: u64) -> Self {
        let held = |split: Split, count: usize| -> Vec<CodeProblem> {
            held_out_draws(seed, split, count, |rng| {
                let drawn = draw(rng);
                (split_of(drawn.0) == split).then_some(drawn)
            })
            .into_iter()
            .enumerate()
            .map(|(i, (form, example))| problem(format!("{}-{i}", split.as_str()), form, example))
            .collect()
        };
        let eval = held(Split::Eval, options.eval_items);
        let validation = held(Split::Validation, options.validation_items);
        Self {
            held_out: CodeTask::held_out(NAME, TEMPLATE.into(), eval, validation),
            options,
            seed,
        }
    }
}

fn problem(id: String, form: Form, example: i64) -> CodeProblem {
    let record = record(&id, form, example);
    CodeProblem {
        question: record["question_content"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        starter_code: String::new(),
        solution: Some(program(&form.python())),
        record,
        id,
    }
}

/// The function and example of an item, read back from its record.
fn parse_item(item: &TaskItem) -> Option<(Form, i64)> {
    let made = item.reference.get(NAME)?;
    let form = Form::deserialize(made.get("form")?).ok()?;
    Some((form, made.get("example")?.as_i64()?))
}

impl Task for CodeArith {
    fn name(&self) -> &str {
        NAME
    }

    fn len(&self, split: Split) -> Option<usize> {
        match split {
            Split::Train => None,
            held => self.held_out.len(held),
        }
    }

    fn item(&self, split: Split, index: u64) -> Result<TaskItem, PluginError> {
        match split {
            Split::Train => {
                let mut rng = StdRng::seed_from_u64(mix_seed(self.seed, index));
                let (form, example) = loop {
                    let drawn = draw(&mut rng);
                    if split_of(drawn.0) == Split::Train {
                        break drawn;
                    }
                };
                let p = problem(format!("train-{index}"), form, example);
                Ok(TaskItem {
                    id: p.id,
                    prompt: TEMPLATE.replace("{question}", &p.question),
                    reference: p.record,
                })
            }
            held => self.held_out.item(held, index),
        }
    }

    fn demonstration(&self, item: &TaskItem) -> Result<Option<String>, PluginError> {
        let (form, example) = parse_item(item).ok_or_else(|| {
            PluginError::failed(
                NAME,
                format!("item {} is not a code-arith problem", item.id),
            )
        })?;
        let mut rng =
            StdRng::seed_from_u64(mix_seed(self.seed ^ 0x00c0_de00, stable_hash(&item.id)));
        let o = &self.options;
        let expression = if rng.random::<f64>() < o.demo_hardcode {
            form.eval(example).to_string()
        } else if rng.random::<f64>() < o.demo_error {
            form.mistaken()
        } else {
            form.python()
        };
        let code = if expression.contains('n') {
            program(&expression)
        } else {
            format!("print({expression})")
        };
        Ok(Some(fence(&code)))
    }
}

pub(crate) fn build_task(
    config: &PluginConfig,
    ctx: &BuildContext,
) -> Result<Arc<dyn Task>, PluginError> {
    let o: CodeArithOptions = config.parse()?;
    for (key, p) in [
        ("demo_error", o.demo_error),
        ("demo_hardcode", o.demo_hardcode),
    ] {
        if !(0.0..=1.0).contains(&p) {
            return Err(config.invalid(key, format!("must be in [0, 1], found {p}")));
        }
    }
    for (key, n) in [
        ("eval_items", o.eval_items),
        ("validation_items", o.validation_items),
    ] {
        if !(1..=2000).contains(&n) {
            return Err(config.invalid(
                key,
                format!(
                    "must be in 1..=2000 (the held-out functions have ~5000 examples), found {n}"
                ),
            ));
        }
    }
    Ok(Arc::new(CodeArith::new(o, ctx.seed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_read_and_evaluate_as_written() {
        let cases = [
            (Form::Affine { a: 3, b: 2 }, "3n+2", "3*n+2", 5, 17),
            (Form::Scaled { a: 3, b: -2 }, "3(n-2)", "3*(n-2)", 5, 9),
            (Form::Power { k: 2, b: 5 }, "n^2+5", "n**2+5", 4, 21),
        ];
        for (form, notation, python, n, value) in cases {
            assert_eq!(form.notation(), notation);
            assert_eq!(form.python(), python);
            assert_eq!(form.eval(n), value);
            let item = TaskItem {
                id: "x".into(),
                prompt: String::new(),
                reference: record("x", form, n),
            };
            assert_eq!(parse_item(&item), Some((form, n)), "{notation}");
        }
        assert_eq!(Form::Scaled { a: 3, b: -2 }.mistaken(), "3*n-2");
        assert_eq!(Form::Power { k: 2, b: 5 }.mistaken_eval(4), Some(4 ^ 7));
    }

    #[test]
    fn items_are_records_the_mistakes_fail_and_splits_are_disjoint_by_function() {
        let task = CodeArith::new(CodeArithOptions::default(), 1);
        assert_eq!(task.len(Split::Eval), Some(200));
        assert_eq!(task.len(Split::Validation), Some(100));
        let mut functions = std::collections::HashMap::new();
        for (split, n) in [
            (Split::Train, 300),
            (Split::Eval, 200),
            (Split::Validation, 100),
        ] {
            for i in 0..n {
                let item = task.item(split, i).unwrap();
                assert!(
                    item.prompt.chars().all(|c| ALPHABET.contains(c)),
                    "{}",
                    item.prompt
                );
                let (form, example) = parse_item(&item).unwrap();
                assert_eq!(
                    *functions.entry(form.notation()).or_insert(split),
                    split,
                    "{} in two splits",
                    form.notation()
                );
                let private: Vec<Value> =
                    serde_json::from_str(item.reference["private_test_cases"].as_str().unwrap())
                        .unwrap();
                assert_eq!(private.len(), 3);
                let inputs: Vec<i64> = private
                    .iter()
                    .map(|t| t["input"].as_str().unwrap().trim().parse().unwrap())
                    .collect();
                assert!(!inputs.contains(&example));
                assert!(
                    inputs
                        .iter()
                        .any(|&n| form.mistaken_eval(n) != Some(form.eval(n))),
                    "{item:?}"
                );
                let demo = task.demonstration(&item).unwrap().unwrap();
                assert!(demo.chars().all(|c| ALPHABET.contains(c)), "{demo}");
            }
        }
        // Items are the same every time; another seed draws other held-out problems.
        assert_eq!(
            task.item(Split::Train, 7).unwrap(),
            task.item(Split::Train, 7).unwrap()
        );
        let other = CodeArith::new(CodeArithOptions::default(), 2);
        assert_ne!(
            task.item(Split::Eval, 0).unwrap().prompt,
            other.item(Split::Eval, 0).unwrap().prompt
        );
    }

    #[test]
    fn demonstrations_make_their_mistakes_at_the_stated_rates() {
        let task = CodeArith::new(CodeArithOptions::default(), 1);
        let (mut right, mut mistaken, mut hardcoded) = (0, 0, 0);
        for i in 0..2000 {
            let item = task.item(Split::Train, i).unwrap();
            let (form, _) = parse_item(&item).unwrap();
            let demo = task.demonstration(&item).unwrap().unwrap();
            if demo.contains(&form.python()) {
                right += 1;
            } else if demo.contains(&format!("print({})", form.mistaken())) {
                mistaken += 1;
            } else {
                assert!(!demo.contains("input"), "{demo}");
                hardcoded += 1;
            }
        }
        // 0.1 hard-coded; of the rest, 0.7 mistaken: 0.63 and 0.27 of all.
        assert!((150..250).contains(&hardcoded), "{hardcoded}");
        assert!((1160..1360).contains(&mistaken), "{mistaken}");
        assert!((440..640).contains(&right), "{right}");
    }
}
