//! Rewritings of reference answers, for benchmarks and tests: the same answer written
//! differently (what a model writes), and a wrong answer close to it.

use std::time::Duration;

use crate::Options;
use crate::deadline::Deadline;
use crate::expr::Expr;
use crate::{Math, read_reference};

/// How an equal answer was rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rewrite {
    /// `\frac` written `\dfrac`.
    Dfrac,
    /// Boxed inside a sentence of prose.
    BoxedInProse,
    /// An exact fraction written as a decimal (10 significant places).
    Decimal,
    /// The terms of a top-level sum, or the items of a list, in reverse order.
    Reordered,
}

impl Rewrite {
    /// Every kind.
    pub const ALL: [Rewrite; 4] = [
        Rewrite::Dfrac,
        Rewrite::BoxedInProse,
        Rewrite::Decimal,
        Rewrite::Reordered,
    ];

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Rewrite::Dfrac => "\\dfrac for \\frac",
            Rewrite::BoxedInProse => "boxed in prose",
            Rewrite::Decimal => "fraction as decimal",
            Rewrite::Reordered => "reordered terms",
        }
    }
}

/// A completion whose answer is `answer` rewritten by `kind`, or `None` when that rewriting
/// does not apply (no `\frac`, not a fraction, a single term).
pub fn rewrite(answer: &str, kind: Rewrite) -> Option<String> {
    match kind {
        Rewrite::Dfrac => answer.contains("\\frac").then(|| {
            format!(
                "So the answer is ${}$.",
                answer.replace("\\frac", "\\dfrac")
            )
        }),
        Rewrite::BoxedInProse => Some(format!(
            "Putting the pieces together, we get the value asked for. The final answer is $\\boxed{{{answer}}}$."
        )),
        Rewrite::Decimal => as_decimal(answer).map(|d| format!("Dividing out, the answer is {d}.")),
        Rewrite::Reordered => reorder_terms(answer).map(|r| format!("We find $\\boxed{{{r}}}$.")),
    }
}

/// The answer boxed in prose, made wrong: its first digit changed (the last may be a unit's
/// power), or `+ 1` added when it has none.
pub fn perturb(answer: &str) -> String {
    let chars: Vec<char> = answer.chars().collect();
    let wrong = match chars.iter().position(char::is_ascii_digit) {
        Some(i) => {
            let d = chars[i].to_digit(10).expect("a digit");
            let mut changed = chars.clone();
            changed[i] = char::from_digit((d + 1) % 10, 10).expect("a digit");
            changed.into_iter().collect()
        }
        None => format!("{answer} + 1"),
    };
    format!(
        "Putting the pieces together, we get the value asked for. The final answer is $\\boxed{{{wrong}}}$."
    )
}

/// A non-integer exact rational as a decimal with 10 significant places.
fn as_decimal(answer: &str) -> Option<String> {
    let dl = Deadline::after(Duration::from_millis(200));
    let parsed = read_reference(answer, &Options::default(), &dl)
        .ok()?
        .math?;
    let Math::Expr(e) = parsed else { return None };
    let Expr::Num(n) = crate::expr::simplify(&e, &dl).ok()? else {
        return None;
    };
    if n.is_integer() {
        return None;
    }
    let v = n.to_f64();
    let magnitude = v.abs().log10().floor() as i32;
    let places = (9 - magnitude).clamp(0, 15) as usize;
    Some(format!("{v:.places$}"))
}

/// `a + b - c` as `-c + b + a`, and `1, 2, 3` as `3, 2, 1`; `None` unless the answer is such
/// a sum or list at its top level (no relations, `±` or matrices).
fn reorder_terms(answer: &str) -> Option<String> {
    // Cleaned first, so that `10,\\!080` is one number, not a list.
    let cleaned = crate::normalize::normalize(answer);
    let text = cleaned.trim();
    if ["\\pm", "\\mp", "\\begin", "&", "="]
        .iter()
        .any(|t| text.contains(t))
    {
        return None;
    }
    let items = split_top_level(text, ',');
    if items.len() >= 2 {
        let reversed: Vec<&str> = items.iter().rev().map(|s| s.trim()).collect();
        return Some(reversed.join(", "));
    }
    let mut terms: Vec<(bool, String)> = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    let mut negative = false;
    let mut previous: Option<char> = None;
    for c in text.chars() {
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => depth -= 1,
            ',' | '=' | '<' | '>' | ';' if depth == 0 => return None,
            _ => {}
        }
        let splits = depth == 0
            && (c == '+' || c == '-')
            && !current.trim().is_empty()
            && !matches!(previous, Some('^' | '_' | '\\'));
        if splits {
            terms.push((negative, current.trim().to_string()));
            current.clear();
            negative = c == '-';
        } else if depth == 0 && c == '-' && current.trim().is_empty() {
            negative = !negative;
        } else if !(depth == 0 && c == '+' && current.trim().is_empty()) {
            current.push(c);
        }
        if !c.is_whitespace() {
            previous = Some(c);
        }
    }
    terms.push((negative, current.trim().to_string()));
    if terms.len() < 2 || terms.iter().any(|(_, t)| t.is_empty()) {
        return None;
    }
    let mut out = String::new();
    for (i, (neg, term)) in terms.iter().rev().enumerate() {
        match (i, neg) {
            (0, true) => out.push('-'),
            (0, false) => {}
            (_, true) => out.push_str(" - "),
            (_, false) => out.push_str(" + "),
        }
        out.push_str(term);
    }
    Some(out)
}

/// `text` split at `sep` outside braces and brackets.
fn split_top_level(text: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => depth -= 1,
            c if c == sep && depth == 0 => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewritings() {
        assert_eq!(
            rewrite("\\frac{1}{2}", Rewrite::Dfrac).as_deref(),
            Some("So the answer is $\\dfrac{1}{2}$.")
        );
        assert_eq!(rewrite("3", Rewrite::Dfrac), None);
        assert_eq!(as_decimal("\\frac{14}{3}").as_deref(), Some("4.666666667"));
        assert_eq!(as_decimal("\\frac{1}{2}").as_deref(), Some("0.5000000000"));
        assert_eq!(rewrite("7", Rewrite::Decimal), None);
        assert_eq!(reorder_terms("p - q").as_deref(), Some("-q + p"));
        assert_eq!(reorder_terms("-x^{-2} + 3").as_deref(), Some("3 - x^{-2}"));
        assert_eq!(reorder_terms("(1, 2)"), None);
        assert_eq!(reorder_terms("-2, 1"), Some("1, -2".into()));
        assert_eq!(
            reorder_terms("\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}"),
            None
        );
        assert_eq!(reorder_terms("1 \\pm \\sqrt{2}"), None);
        assert!(perturb("\\frac{14}{3}").contains("\\frac{24}{3}"));
        assert!(perturb("p - q").contains("p - q + 1"));
    }
}
