//! `math`: maths problems from JSONL files in MATH's format (`problem`, `answer`), graded by
//! the `math` reward (areal-reward-math).
//!
//! ```toml
//! [task]
//! kind = "math"
//! path = "data/train.jsonl"      # the train split
//! eval_path = "rewards/math/tests/fixtures/math500.jsonl"   # optional
//!
//! [reward]
//! kind = "math"
//! ```
//!
//! Without `eval_path`, one problem in twenty of `path` (by a hash of its id) is held out for
//! evaluation; either way one in twenty of the rest is held out for validation. Each item's
//! reference is `{"answer": ...}`. The warm-up demonstration is the record's `solution` when
//! it has one, otherwise the answer alone, boxed.

use std::collections::HashSet;
use std::sync::Arc;

use areal_sdk::{BuildContext, PluginConfig, PluginError, Split, Task, TaskItem};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::splits::{Files, Splits, read_splits};

/// The name the maths task is registered under (`[task] kind = "math"`).
pub const NAME: &str = "math";

/// Options of the `math` task.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MathTaskOptions {
    /// JSONL file of problems: the train split (and the held-out splits without `eval_path`).
    /// Relative paths are from the working directory. Required.
    pub path: String,
    /// JSONL file of evaluation problems, all of them held out.
    pub eval_path: Option<String>,
    /// Key of the problem text. By default `problem`.
    pub problem_key: String,
    /// Key of the reference answer (a string or a number). By default `answer`.
    pub answer_key: String,
    /// Key of a worked solution used as the warm-up demonstration, when present. By default
    /// `solution`.
    pub solution_key: String,
    /// Key of the item id; items without one are named by their line. By default `id`.
    pub id_key: String,
    /// The prompt, with `{problem}` where the problem goes.
    pub template: String,
    /// At most this many eval items (the first ones). By default all.
    pub eval_items: Option<usize>,
}

impl Default for MathTaskOptions {
    fn default() -> Self {
        Self {
            path: String::new(),
            eval_path: None,
            problem_key: "problem".into(),
            answer_key: "answer".into(),
            solution_key: "solution".into(),
            id_key: "id".into(),
            template: "{problem}\n\nPut your final answer within \\boxed{}.".into(),
            eval_items: None,
        }
    }
}

/// One problem as read.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    /// Its id.
    pub id: String,
    /// The problem text.
    pub problem: String,
    /// The reference answer.
    pub answer: String,
    /// A worked solution, if the record has one.
    pub solution: Option<String>,
}

/// The task.
#[derive(Clone, Debug)]
pub struct MathTask {
    options: MathTaskOptions,
    splits: Splits<Problem>,
}

/// Reads problems from JSONL `text` (named `file` in errors). Every line must be a record with
/// the problem and the answer: a bad line is an error naming its line, never skipped.
pub fn read_problems(
    text: &str,
    file: &str,
    options: &MathTaskOptions,
) -> Result<Vec<Problem>, String> {
    let mut out = Vec::new();
    let mut ids = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        if line.trim().is_empty() {
            continue;
        }
        let record: Value = serde_json::from_str(line)
            .map_err(|e| format!("{file} line {line_no}: not JSON: {e}"))?;
        let field = |key: &str| -> Result<Option<String>, String> {
            match record.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(Value::Number(x)) => Ok(Some(x.to_string())),
                Some(other) => Err(format!(
                    "{file} line {line_no}: `{key}` must be a string or a number, found {other}"
                )),
            }
        };
        let problem = field(&options.problem_key)?
            .ok_or_else(|| format!("{file} line {line_no}: no `{}`", options.problem_key))?;
        let answer = field(&options.answer_key)?
            .ok_or_else(|| format!("{file} line {line_no}: no `{}`", options.answer_key))?;
        let id = field(&options.id_key)?.unwrap_or_else(|| format!("line-{line_no}"));
        if !ids.insert(id.clone()) {
            return Err(format!("{file} line {line_no}: id {id:?} appears twice"));
        }
        out.push(Problem {
            id,
            problem,
            answer,
            solution: field(&options.solution_key)?,
        });
    }
    Ok(out)
}

impl crate::splits::Identified for Problem {
    fn id(&self) -> &str {
        &self.id
    }
}

impl MathTask {
    /// The task from problems already read: `train` split further into train and
    /// validation, and into eval too when `eval` is `None`.
    pub fn new(options: MathTaskOptions, train: Vec<Problem>, eval: Option<Vec<Problem>>) -> Self {
        let splits = Splits::new(train, eval, options.eval_items);
        Self { options, splits }
    }
}

impl Task for MathTask {
    fn name(&self) -> &str {
        NAME
    }

    fn len(&self, split: Split) -> Option<usize> {
        Some(self.splits.get(split).len())
    }

    fn item(&self, split: Split, index: u64) -> Result<TaskItem, PluginError> {
        let p = self.splits.at(NAME, split, index)?;
        Ok(TaskItem {
            id: p.id.clone(),
            prompt: self.options.template.replace("{problem}", &p.problem),
            reference: json!({ "answer": p.answer }),
        })
    }

    fn demonstration(&self, item: &TaskItem) -> Result<Option<String>, PluginError> {
        Ok(self.splits.find(&item.id).map(|p| match &p.solution {
            Some(s) => s.clone(),
            None => format!("\\boxed{{{}}}", p.answer),
        }))
    }
}

pub(crate) fn build_task(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn Task>, PluginError> {
    let options: MathTaskOptions = config.parse()?;
    let files = Files {
        path: &options.path,
        eval_path: options.eval_path.as_deref(),
        eval_items: options.eval_items,
        what: "problems",
        missing: "the JSONL file of problems (`problem`, `answer` per line)",
    };
    files.require_path(config)?;
    if !options.template.contains("{problem}") {
        return Err(config.invalid(
            "template",
            format!(
                "{:?} has no `{{problem}}` to put the problem in",
                options.template
            ),
        ));
    }
    let splits = read_splits(config, &files, |text, file| {
        read_problems(text, file, &options)
    })?;
    Ok(Arc::new(MathTask { options, splits }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn math500() -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../rewards/math/tests/fixtures/math500.jsonl");
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn reads_math500_and_holds_out_disjoint_splits() {
        let options = MathTaskOptions::default();
        let problems = read_problems(&math500(), "math500.jsonl", &options).unwrap();
        assert_eq!(problems.len(), 500);
        let task = MathTask::new(options, problems, None);
        let (train, eval, validation) = (
            task.len(Split::Train).unwrap(),
            task.len(Split::Eval).unwrap(),
            task.len(Split::Validation).unwrap(),
        );
        assert_eq!(train + eval + validation, 500);
        assert!(
            (10..=45).contains(&eval) && (10..=45).contains(&validation),
            "{eval} {validation}"
        );
        let ids = |s: Split| -> HashSet<String> {
            (0..task.len(s).unwrap() as u64)
                .map(|i| task.item(s, i).unwrap().id)
                .collect()
        };
        assert!(ids(Split::Train).is_disjoint(&ids(Split::Eval)));
        assert!(ids(Split::Train).is_disjoint(&ids(Split::Validation)));
        let item = task.item(Split::Train, 0).unwrap();
        assert!(
            item.prompt
                .ends_with("Put your final answer within \\boxed{}.")
        );
        assert!(item.reference["answer"].is_string());
        let demo = task.demonstration(&item).unwrap().unwrap();
        assert!(demo.starts_with("\\boxed{"), "{demo}");
        assert!(task.item(Split::Train, train as u64).is_err());
    }

    #[test]
    fn bad_lines_are_errors_that_name_the_line() {
        let options = MathTaskOptions::default();
        let err = |text: &str| read_problems(text, "f.jsonl", &options).unwrap_err();
        assert_eq!(
            err("{\"problem\": \"1+1\", \"answer\": \"2\"}\nnot json"),
            "f.jsonl line 2: not JSON: expected ident at line 1 column 2"
        );
        assert_eq!(err("{\"problem\": \"1+1\"}"), "f.jsonl line 1: no `answer`");
        assert!(err("{\"problem\": [1], \"answer\": 2}").contains("`problem` must be a string"));
        assert!(
            err("{\"id\": 1, \"problem\": \"a\", \"answer\": 2}\n{\"id\": 1, \"problem\": \"b\", \"answer\": 3}")
                .contains("id \"1\" appears twice")
        );
        let ok = read_problems("{\"problem\": \"1+1\", \"answer\": 2}\n\n", "f", &options).unwrap();
        assert_eq!(ok[0].answer, "2");
        assert_eq!(ok[0].id, "line-1");
    }

    #[test]
    fn the_config_names_a_missing_file_and_a_bad_template() {
        let ctx = BuildContext::new(1, 1);
        let cfg = PluginConfig::new("task", "math").with("path", "/nonexistent/x.jsonl");
        let err = build_task(&cfg, &ctx).err().unwrap().to_string();
        assert!(
            err.contains("task.path") && err.contains("/nonexistent/x.jsonl"),
            "{err}"
        );
        let cfg = PluginConfig::new("task", "math");
        let err = build_task(&cfg, &ctx).err().unwrap().to_string();
        assert!(
            err.contains("task.path") && err.contains("missing"),
            "{err}"
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../rewards/math/tests/fixtures/math500.jsonl");
        let cfg = PluginConfig::new("task", "math")
            .with("path", path.display().to_string())
            .with("template", "no placeholder");
        let err = build_task(&cfg, &ctx).err().unwrap().to_string();
        assert!(err.contains("task.template"), "{err}");
    }
}
