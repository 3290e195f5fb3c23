//! `code`: programming problems as LiveCodeBench records, graded by the `lcb` reward
//! (areal-reward-code) running their tests in the sandbox.
//!
//! ```toml
//! [task]
//! kind = "code"
//! path = "data/lcb_train.jsonl"     # the train split
//! eval_path = "data/lcb_test.jsonl" # optional
//!
//! [reward]
//! kind = "lcb"
//! ```
//!
//! One record a line in LiveCodeBench's field names: `question_id`, `question_content`,
//! `starter_code` (empty for stdin problems), `public_test_cases`, `private_test_cases` (JSON
//! strings, the private ones possibly compressed), `metadata` (`{"func_name": ...}` for
//! call-based problems). Any other code dataset written as such records works the same. The
//! prompt is LiveCodeBench's own for the two kinds of problem (`template = "lcb"`, the
//! default) or a template of your own with `{question}` and `{starter_code}`. The record is
//! each item's reference, as the `lcb` reward reads it. Without `eval_path`, one problem in
//! twenty (by a hash of its id) is held out for evaluation; either way one in twenty of the
//! rest for validation. A record with a reference solution in `code` (the input format of
//! `areal grade code`) gives the warm-up that solution, fenced.

use std::collections::HashSet;
use std::sync::Arc;

use areal_sdk::{BuildContext, PluginConfig, PluginError, Split, Task, TaskItem};
use serde::Deserialize;
use serde_json::Value;

use crate::splits::{Files, Identified, Splits, read_splits};

/// The name the code task is registered under (`[task] kind = "code"`).
pub const NAME: &str = "code";

/// The template name that selects LiveCodeBench's own prompt.
pub const LCB_TEMPLATE: &str = "lcb";

/// LiveCodeBench's system message for generic models.
pub const LCB_SYSTEM_MESSAGE: &str = "You are an expert Python programmer. You will be given a question (problem specification) and will generate a correct Python program that matches the specification and passes all tests.";

const LCB_WITH_STARTER_CODE: &str = "You will use the following starter code to write the solution to the problem and enclose your code within delimiters.";

const LCB_WITHOUT_STARTER_CODE: &str = "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.";

/// LiveCodeBench's prompt for a problem (its generic template, the system message first):
/// call-based problems show their starter code, stdin problems a `# YOUR CODE HERE` block.
pub fn lcb_prompt(question: &str, starter_code: &str) -> String {
    let mut prompt = format!("{LCB_SYSTEM_MESSAGE}\n\n### Question:\n{question}\n\n");
    if starter_code.is_empty() {
        prompt.push_str(&format!(
            "### Format: {LCB_WITHOUT_STARTER_CODE}\n```python\n# YOUR CODE HERE\n```\n\n"
        ));
    } else {
        prompt.push_str(&format!(
            "### Format: {LCB_WITH_STARTER_CODE}\n```python\n{starter_code}\n```\n\n"
        ));
    }
    prompt.push_str("### Answer: (use the provided format with backticks)\n\n");
    prompt
}

/// The prompt of a problem under `template`: [`LCB_TEMPLATE`] for [`lcb_prompt`], otherwise
/// the template with `{question}` and `{starter_code}` filled in.
pub fn render(template: &str, question: &str, starter_code: &str) -> String {
    if template == LCB_TEMPLATE {
        lcb_prompt(question, starter_code)
    } else {
        template
            .replace("{starter_code}", starter_code)
            .replace("{question}", question)
    }
}

/// Options of the `code` task.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodeTaskOptions {
    /// JSONL file of LiveCodeBench records: the train split (and the held-out splits without
    /// `eval_path`). Relative paths are from the working directory. Required.
    pub path: String,
    /// JSONL file of evaluation problems, all of them held out.
    pub eval_path: Option<String>,
    /// `lcb` (LiveCodeBench's prompt) or a template with `{question}` (and optionally
    /// `{starter_code}`). By default `lcb`.
    pub template: String,
    /// At most this many eval items (the first ones). By default all.
    pub eval_items: Option<usize>,
}

impl Default for CodeTaskOptions {
    fn default() -> Self {
        Self {
            path: String::new(),
            eval_path: None,
            template: LCB_TEMPLATE.into(),
            eval_items: None,
        }
    }
}

/// One problem as read: its id, prompt parts, and the record the reward grades against.
#[derive(Clone, Debug, PartialEq)]
pub struct CodeProblem {
    /// `question_id`, or `line-N`.
    pub id: String,
    /// `question_content`.
    pub question: String,
    /// `starter_code` (empty for stdin problems).
    pub starter_code: String,
    /// A reference solution (`code`), if the record has one.
    pub solution: Option<String>,
    /// The record, as the `lcb` reward reads it.
    pub record: Value,
}

impl Identified for CodeProblem {
    fn id(&self) -> &str {
        &self.id
    }
}

/// Check one record enough that grading can start (the tests are decoded by the reward, once
/// per sample: compressed private tests are not unpacked here).
fn check_record(record: &Value) -> Result<(), String> {
    let obj = record.as_object().ok_or("not a JSON object")?;
    match obj.get("question_content") {
        Some(Value::String(_)) => {}
        Some(_) => return Err("`question_content` must be a string".into()),
        None => return Err("no `question_content`".into()),
    }
    match obj.get("starter_code") {
        None | Some(Value::Null | Value::String(_)) => {}
        Some(_) => return Err("`starter_code` must be a string".into()),
    }
    if !obj.contains_key("public_test_cases") && !obj.contains_key("private_test_cases") {
        return Err("no `public_test_cases` nor `private_test_cases`: nothing to grade on".into());
    }
    let mut functional = false;
    for key in ["public_test_cases", "private_test_cases"] {
        let tests = match obj.get(key) {
            None | Some(Value::Null) => continue,
            Some(Value::Array(a)) => a.clone(),
            // A JSON string; private tests may instead be compressed (base64), decoded later.
            Some(Value::String(s)) if s.trim_start().starts_with('[') => {
                match serde_json::from_str::<Value>(s) {
                    Ok(Value::Array(a)) => a,
                    _ => return Err(format!("`{key}` is not a JSON list of tests")),
                }
            }
            Some(Value::String(_)) if key == "private_test_cases" => continue,
            Some(_) => return Err(format!("`{key}` must be a JSON list of tests")),
        };
        for (i, t) in tests.iter().enumerate() {
            let field = |f: &str| t.get(f).and_then(Value::as_str);
            if field("input").is_none() || field("output").is_none() {
                return Err(format!(
                    "`{key}` test {i} has no string `input` and `output`"
                ));
            }
            match field("testtype") {
                Some("stdin") => {}
                Some("functional") => functional = true,
                other => {
                    return Err(format!(
                        "`{key}` test {i}: `testtype` is {other:?}, not \"stdin\" or \"functional\""
                    ));
                }
            }
        }
    }
    if functional {
        let meta = match obj.get("metadata") {
            Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::Null),
            Some(v) => v.clone(),
            None => Value::Null,
        };
        if !meta.get("func_name").is_some_and(Value::is_string) {
            return Err(
                "functional tests need `metadata` with `func_name` (the function to call)".into(),
            );
        }
    }
    Ok(())
}

/// Reads LiveCodeBench records from JSONL `text` (named `file` in errors). A bad line is an
/// error naming its line and field, never skipped.
pub fn read_records(text: &str, file: &str) -> Result<Vec<CodeProblem>, String> {
    let mut out = Vec::new();
    let mut ids = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        if line.trim().is_empty() {
            continue;
        }
        let record: Value = serde_json::from_str(line)
            .map_err(|e| format!("{file} line {line_no}: not JSON: {e}"))?;
        check_record(&record).map_err(|e| format!("{file} line {line_no}: {e}"))?;
        let text_of = |key: &str| record.get(key).and_then(Value::as_str).map(str::to_owned);
        let id = text_of("question_id").unwrap_or_else(|| format!("line-{line_no}"));
        if !ids.insert(id.clone()) {
            return Err(format!("{file} line {line_no}: id {id:?} appears twice"));
        }
        out.push(CodeProblem {
            id,
            question: text_of("question_content").unwrap_or_default(),
            starter_code: text_of("starter_code").unwrap_or_default(),
            solution: text_of("code"),
            record,
        });
    }
    Ok(out)
}

/// A task of code problems; [`CodeTask::new`] also serves tasks that make their records
/// (`code-arith`).
#[derive(Clone, Debug)]
pub struct CodeTask {
    name: &'static str,
    template: String,
    splits: Splits<CodeProblem>,
}

impl CodeTask {
    /// The task named `name` over `train` (split further into train and validation, and into
    /// eval too when `eval` is `None`), prompts from `template`.
    pub fn new(
        name: &'static str,
        template: String,
        train: Vec<CodeProblem>,
        eval: Option<Vec<CodeProblem>>,
        eval_items: Option<usize>,
    ) -> Self {
        Self {
            name,
            template,
            splits: Splits::new(train, eval, eval_items),
        }
    }

    /// A task of held-out problems only (its train split is empty): for tasks that draw their
    /// train items themselves.
    pub fn held_out(
        name: &'static str,
        template: String,
        eval: Vec<CodeProblem>,
        validation: Vec<CodeProblem>,
    ) -> Self {
        Self {
            name,
            template,
            splits: Splits::from_parts(Vec::new(), eval, validation),
        }
    }

    /// The problem an item was made from.
    pub fn problem(&self, id: &str) -> Option<&CodeProblem> {
        self.splits.find(id)
    }
}

impl Task for CodeTask {
    fn name(&self) -> &str {
        self.name
    }

    fn len(&self, split: Split) -> Option<usize> {
        Some(self.splits.get(split).len())
    }

    fn item(&self, split: Split, index: u64) -> Result<TaskItem, PluginError> {
        let p = self.splits.at(self.name, split, index)?;
        Ok(TaskItem {
            id: p.id.clone(),
            prompt: render(&self.template, &p.question, &p.starter_code),
            reference: p.record.clone(),
        })
    }

    fn demonstration(&self, item: &TaskItem) -> Result<Option<String>, PluginError> {
        Ok(self
            .splits
            .find(&item.id)
            .and_then(|p| p.solution.as_deref())
            .map(fence))
    }
}

/// A program as a response: fenced, as LiveCodeBench's prompt asks.
pub fn fence(code: &str) -> String {
    format!("```python\n{}\n```", code.trim_end_matches('\n'))
}

/// Check a template: `lcb`, or text with `{question}`.
fn check_template(config: &PluginConfig, template: &str) -> Result<(), PluginError> {
    if template != LCB_TEMPLATE && !template.contains("{question}") {
        return Err(config.invalid(
            "template",
            format!(
                "{template:?} is neither \"{LCB_TEMPLATE}\" nor a template with `{{question}}`"
            ),
        ));
    }
    Ok(())
}

pub(crate) fn build_task(
    config: &PluginConfig,
    _ctx: &BuildContext,
) -> Result<Arc<dyn Task>, PluginError> {
    let options: CodeTaskOptions = config.parse()?;
    let files = Files {
        path: &options.path,
        eval_path: options.eval_path.as_deref(),
        eval_items: options.eval_items,
        what: "records",
        missing: "the JSONL file of LiveCodeBench records (`question_content`, `public_test_cases`, ...)",
    };
    files.require_path(config)?;
    check_template(config, &options.template)?;
    let splits = read_splits(config, &files, read_records)?;
    Ok(Arc::new(CodeTask {
        name: NAME,
        template: options.template,
        splits,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 23 real LiveCodeBench records (11 stdin, 12 call-based), each with a solution.
    fn lcb_file() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../rewards/code/tests/fixtures/lcb_reference.jsonl")
    }

    #[test]
    fn reads_livecodebench_records_with_its_prompts_and_disjoint_splits() {
        let text = std::fs::read_to_string(lcb_file()).unwrap();
        let problems = read_records(&text, "lcb_reference.jsonl").unwrap();
        assert_eq!(problems.len(), 23);
        // Everything in train, so that both kinds of problem are there to look at.
        let task = CodeTask::new(
            NAME,
            LCB_TEMPLATE.into(),
            problems.clone(),
            Some(problems[..2].to_vec()),
            None,
        );
        let sizes: Vec<usize> = [Split::Train, Split::Eval, Split::Validation]
            .iter()
            .map(|&s| task.len(s).unwrap())
            .collect();
        assert_eq!(sizes[0] + sizes[2], 23);
        assert_eq!(sizes[1], 2);
        let by_hash = CodeTask::new(NAME, LCB_TEMPLATE.into(), problems, None, None);
        assert_eq!(
            [Split::Train, Split::Eval, Split::Validation]
                .iter()
                .map(|&s| by_hash.len(s).unwrap())
                .sum::<usize>(),
            23
        );
        let ids = |s: Split| -> HashSet<String> {
            (0..task.len(s).unwrap() as u64)
                .map(|i| task.item(s, i).unwrap().id)
                .collect()
        };
        assert!(ids(Split::Train).is_disjoint(&ids(Split::Validation)));
        let items: Vec<TaskItem> = (0..sizes[0] as u64)
            .map(|i| task.item(Split::Train, i).unwrap())
            .collect();
        let call = items
            .iter()
            .find(|i| !i.reference["starter_code"].as_str().unwrap().is_empty())
            .unwrap();
        let stdin = items
            .iter()
            .find(|i| i.reference["starter_code"].as_str().unwrap().is_empty())
            .unwrap();
        assert!(call.prompt.starts_with(LCB_SYSTEM_MESSAGE));
        assert!(
            call.prompt
                .contains("### Format: You will use the following starter code")
        );
        assert!(
            call.prompt
                .contains(call.reference["starter_code"].as_str().unwrap())
        );
        assert!(
            stdin
                .prompt
                .contains("```python\n# YOUR CODE HERE\n```\n\n")
        );
        assert!(
            stdin
                .prompt
                .ends_with("### Answer: (use the provided format with backticks)\n\n")
        );
        let demo = task.demonstration(stdin).unwrap().unwrap();
        assert!(
            demo.starts_with("```python\n") && demo.ends_with("\n```"),
            "{demo}"
        );
    }

    #[test]
    fn a_bad_record_is_an_error_naming_its_line_and_field() {
        let err = |text: &str| read_records(text, "f.jsonl").unwrap_err();
        let ok = r#"{"question_id": "a", "question_content": "q", "public_test_cases": "[{\"input\": \"1\", \"output\": \"1\", \"testtype\": \"stdin\"}]", "code": "print(1)"}"#;
        assert!(err(&format!("{ok}\nnot json")).starts_with("f.jsonl line 2: not JSON"));
        assert_eq!(
            err(r#"{"public_test_cases": "[]"}"#),
            "f.jsonl line 1: no `question_content`"
        );
        assert!(err(r#"{"question_content": "q"}"#).contains("nothing to grade on"));
        assert!(
            err(r#"{"question_content": "q", "public_test_cases": "[{\"input\": \"[1]\", \"output\": \"1\", \"testtype\": \"functional\"}]"}"#)
                .contains("func_name")
        );
        assert!(
            err(r#"{"question_content": "q", "public_test_cases": "[{\"input\": \"1\", \"output\": \"1\", \"testtype\": \"file\"}]"}"#)
                .contains("test 0: `testtype` is Some(\"file\")")
        );
        assert!(err(&format!("{ok}\n{ok}")).contains("id \"a\" appears twice"));
        let read = read_records(ok, "f").unwrap();
        let task = CodeTask::new(NAME, "{question}\n".into(), read.clone(), Some(read), None);
        let item = task.item(Split::Eval, 0).unwrap();
        assert_eq!(item.prompt, "q\n");
        assert_eq!(
            task.demonstration(&item).unwrap().as_deref(),
            Some("```python\nprint(1)\n```")
        );
        // Compressed private tests are left to the reward.
        read_records(
            r#"{"question_content": "q", "public_test_cases": "[]", "private_test_cases": "eJzLSM3JyQcABiwCFQ=="}"#,
            "f",
        )
        .unwrap();
    }

    #[test]
    fn the_config_names_a_missing_file_and_a_bad_template() {
        let ctx = BuildContext::new(1, 1);
        let cfg = PluginConfig::new("task", NAME).with("path", "/nonexistent/x.jsonl");
        let err = build_task(&cfg, &ctx).err().unwrap().to_string();
        assert!(
            err.contains("task.path") && err.contains("/nonexistent/x.jsonl"),
            "{err}"
        );
        let err = build_task(&PluginConfig::new("task", NAME), &ctx)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("task.path") && err.contains("missing"),
            "{err}"
        );
        let cfg = PluginConfig::new("task", NAME)
            .with("path", lcb_file().display().to_string())
            .with("template", "no placeholder");
        let err = build_task(&cfg, &ctx).err().unwrap().to_string();
        assert!(err.contains("task.template"), "{err}");
    }
}
