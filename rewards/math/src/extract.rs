//! Finding the answer in a completion.
//!
//! Candidates come in tiers, tried in order: the last `\boxed{}` (tier set by
//! `boxed_priority`, first by default), "final answer is ... I hope" (0), "final answer ...
//! is" (50), "answer:" (100), "answer" (200), then any LaTeX span or plain number or
//! arithmetic (300). Within a tier the candidate that ends last is tried first, and the first
//! that parses is the answer. LaTeX spans are `$...$`, `$$...$$`, `\(...\)`, `\[...\]`,
//! ` [...] ` and a bare `\frac{a}{b}`; up to six joined by `and`, `or` or commas make one
//! answer, a list.

use crate::Options;
use crate::answer::Math;
use crate::deadline::{Deadline, Timeout};
use crate::expr::Expr;
use crate::normalize::{last_boxed, normalize};
use crate::number::Number;
use crate::parser::{ParseError, parse};

/// What was found in a text.
#[derive(Clone, Debug, PartialEq)]
pub struct Extracted {
    /// The parsed answer, when one parsed.
    pub math: Option<Math>,
    /// The cleaned text of the answer (of the first candidate tried when none parsed).
    pub text: String,
}

/// One place an answer may be.
#[derive(Clone, Debug)]
struct Candidate {
    tier: u32,
    start: usize,
    end: usize,
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    /// LaTeX spans (contents and whether a percent sign follows), one answer together.
    Latex(Vec<(String, bool)>),
    /// Plain text: a number (already cleaned) or an arithmetic expression.
    Plain {
        text: String,
        percent: bool,
        number: bool,
    },
}

/// A LaTeX span: where its contents are and where it ends (after any percent sign).
#[derive(Clone, Debug)]
struct Span {
    start: usize,
    end: usize,
    content: String,
    percent: bool,
}

/// Finds the answer in `text`.
pub(crate) fn extract(text: &str, options: &Options, dl: &Deadline) -> Result<Extracted, Timeout> {
    let mut candidates = Vec::new();
    let spans = if options.latex {
        latex_spans(text)
    } else {
        Vec::new()
    };
    let chains = chain_spans(text, &spans);
    let plain = if options.expr {
        plain_matches(text, dl)?
    } else {
        Vec::new()
    };
    if options.latex
        && let Some(tier) = options.boxed_priority
        && let Some(b) = boxed_candidate(text)
    {
        candidates.push(Candidate { tier, ..b });
    }
    for chain in &chains {
        candidates.push(Candidate {
            tier: 300,
            start: chain.first().map_or(0, |s| s.start),
            end: chain.last().map_or(0, |s| s.end),
            kind: Kind::Latex(
                chain
                    .iter()
                    .map(|s| (s.content.clone(), s.percent))
                    .collect(),
            ),
        });
    }
    for m in &plain {
        candidates.push(Candidate {
            tier: 300,
            ..m.clone()
        });
    }
    anchored(text, &chains, &plain, &mut candidates);

    candidates.sort_by(|a, b| {
        a.tier
            .cmp(&b.tier)
            .then(b.end.cmp(&a.end))
            .then(a.start.cmp(&b.start))
    });
    let mut fallback: Option<String> = None;
    for c in &candidates {
        dl.check()?;
        let (math, cleaned) = match &c.kind {
            Kind::Latex(parts) => latex_answer(parts, dl)?,
            Kind::Plain {
                text,
                percent,
                number,
            } => plain_answer(text, *percent, *number, dl)?,
        };
        if fallback.is_none() && !cleaned.is_empty() {
            fallback = Some(cleaned.clone());
        }
        if let Some(math) = math {
            return Ok(Extracted {
                math: Some(math),
                text: cleaned,
            });
        }
    }
    Ok(Extracted {
        math: None,
        text: fallback.unwrap_or_default(),
    })
}

/// Parses one cleaned answer, and failing that the part after its last `=` (for chains that
/// do not parse as a whole, `1 = \zzz = x = 0`).
pub(crate) fn parse_answer(cleaned: &str, dl: &Deadline) -> Result<Option<Math>, Timeout> {
    match parse(cleaned, dl) {
        Ok(m) => Ok(Some(m)),
        Err(ParseError::Timeout) => Err(Timeout),
        Err(ParseError::Syntax(_)) => {
            let eqs = cleaned.matches('=').count();
            if eqs >= 2 && !cleaned.contains(',') && !cleaned.contains(';') {
                let last = cleaned.rsplit('=').next().unwrap_or("");
                match parse(last, dl) {
                    Ok(m) => Ok(Some(m)),
                    Err(ParseError::Timeout) => Err(Timeout),
                    Err(ParseError::Syntax(_)) => Ok(None),
                }
            } else {
                Ok(None)
            }
        }
    }
}

fn with_percent(m: Math, percent: bool) -> Math {
    match m {
        Math::Expr(e) if percent && !matches!(e, Expr::Percent(_)) => {
            Math::Expr(Expr::Percent(Box::new(e)))
        }
        other => other,
    }
}

fn latex_answer(
    parts: &[(String, bool)],
    dl: &Deadline,
) -> Result<(Option<Math>, String), Timeout> {
    let mut maths = Vec::new();
    let mut texts = Vec::new();
    for (content, percent) in parts {
        let cleaned = normalize(content);
        let math = parse_answer(&cleaned, dl)?.map(|m| with_percent(m, *percent));
        texts.push(cleaned);
        maths.push(math);
    }
    if maths.len() > 1 && maths.iter().all(Option::is_some) {
        // `$1$, $2$ and $3$`: one list.
        let mut items = Vec::new();
        for m in maths.into_iter().flatten() {
            match m {
                Math::Set { items: inner, .. } => items.extend(inner),
                other => items.push(other),
            }
        }
        return Ok((
            Some(Math::Set {
                items,
                braces: false,
            }),
            texts.join(" and "),
        ));
    }
    let first = maths.into_iter().next().flatten();
    Ok((first, texts.into_iter().next().unwrap_or_default()))
}

fn plain_answer(
    text: &str,
    percent: bool,
    number: bool,
    dl: &Deadline,
) -> Result<(Option<Math>, String), Timeout> {
    if number {
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let math = Number::parse(digits)
            .map(|n| if negative { n.neg() } else { n })
            .map(|n| with_percent(Math::Expr(Expr::Num(n)), percent));
        return Ok((math, text.to_string()));
    }
    let cleaned = text.replace("**", "^");
    let math = match parse(&cleaned, dl) {
        Ok(m @ Math::Expr(_)) => Some(with_percent(m, percent)),
        Ok(_) | Err(ParseError::Syntax(_)) => None,
        Err(ParseError::Timeout) => return Err(Timeout),
    };
    Ok((math, cleaned.trim().to_string()))
}

/// The last box, with the boxes joined to it, as a candidate (tier set by the caller).
fn boxed_candidate(text: &str) -> Option<Candidate> {
    let content = last_boxed(text)?;
    let start = text.rfind("\\boxed").max(text.rfind("\\fbox"))?;
    // A percent sign may follow the box, outside it: `$\boxed{28}$ pct`.
    let mut end = start;
    let mut depth = 0usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    end = start + i + 1;
                    break;
                }
            }
            _ => {}
        }
    }
    if end == start {
        end = text.len();
    }
    let mut after = &text[end..];
    for closer in ["$$", "$", "\\)", "\\]"] {
        if let Some(rest) = after.trim_start().strip_prefix(closer) {
            after = rest;
            break;
        }
    }
    let percent = percent_after(after).is_some();
    Some(Candidate {
        tier: 0,
        start,
        end,
        kind: Kind::Latex(vec![(content, percent)]),
    })
}

/// The length of a percent sign or word at the start of `s` (after spaces).
fn percent_after(s: &str) -> Option<usize> {
    let trimmed = s.trim_start();
    let skipped = s.len() - trimmed.len();
    for word in [
        "\\%",
        "%",
        "percentage",
        "percent",
        "Percentage",
        "Percent",
        "pct",
        "Pct",
    ] {
        if let Some(rest) = trimmed.strip_prefix(word) {
            let boundary = !rest.starts_with(|c: char| c.is_ascii_alphabetic());
            if boundary {
                return Some(skipped + word.len());
            }
        }
    }
    None
}

/// Every LaTeX span, in order of start.
fn latex_spans(text: &str) -> Vec<Span> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let found = match bytes[i] {
            b'$' if bytes.get(i + 1) == Some(&b'$') && !escaped(bytes, i) => {
                find_close(text, i + 2, "$$", true).map(|close| (i + 2, close, close + 2))
            }
            b'$' if !(escaped(bytes, i) || i > 0 && bytes[i - 1].is_ascii_digit()) => {
                inline_dollar(text, i + 1).map(|close| (i + 1, close, close + 1))
            }
            b'\\' if bytes.get(i + 1) == Some(&b'[') => {
                find_close(text, i + 2, "\\]", true).map(|close| (i + 2, close, close + 2))
            }
            b'\\' if bytes.get(i + 1) == Some(&b'(') => {
                find_close(text, i + 2, "\\)", false).map(|close| (i + 2, close, close + 2))
            }
            b'[' if i > 0 && bytes[i - 1].is_ascii_whitespace() => {
                bare_bracket(text, i + 1).map(|close| (i + 1, close, close + 1))
            }
            b'\\' if text[i..].starts_with("\\frac{") => {
                bare_fraction(text, i).map(|end| (i, end, end))
            }
            _ => None,
        };
        match found {
            Some((content_start, content_end, end)) => {
                let content = if text[i..].starts_with("\\frac") {
                    let minus = if i > 0 && bytes[i - 1] == b'-' {
                        "-"
                    } else {
                        ""
                    };
                    format!("{minus}{}", &text[i..end])
                } else {
                    text[content_start..content_end].to_string()
                };
                let (percent, end) = match percent_after(&text[end..]) {
                    Some(len) => (true, end + len),
                    None => (false, end),
                };
                if !content.trim().is_empty() && !is_prose(&content) {
                    spans.push(Span {
                        start: i,
                        end,
                        content,
                        percent,
                    });
                }
                i = end;
            }
            None => i += text[i..].chars().next().map_or(1, char::len_utf8),
        }
    }
    spans
}

/// Whether a span holds sentences rather than maths: three or more words of four letters or
/// more outside `\text{}` and commands (`[Note: The solution provided is correct, ...]`).
fn is_prose(content: &str) -> bool {
    let mut words = 0;
    let bytes = content.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            // a command name, and the argument of a text command
            let start = i + 1;
            i = start;
            while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            let name = &content[start..i];
            let takes_words = name.starts_with("text") || name.starts_with("math");
            if (takes_words || matches!(name, "mbox" | "operatorname" | "begin" | "end"))
                && let Some(close) = content[i..].find('}')
            {
                i += close + 1;
            }
            continue;
        }
        if bytes[i].is_ascii_alphabetic() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            if i - start >= 4 {
                words += 1;
            }
            continue;
        }
        i += 1;
    }
    words >= 3
}

fn escaped(bytes: &[u8], i: usize) -> bool {
    i > 0 && bytes[i - 1] == b'\\'
}

/// The index of `close` after `from`, not escaped; within one line unless `multiline`.
fn find_close(text: &str, from: usize, close: &str, multiline: bool) -> Option<usize> {
    let mut j = from;
    while j < text.len() {
        let rest = &text[j..];
        if rest.starts_with(close) && !(close.starts_with('$') && escaped(text.as_bytes(), j)) {
            return (j > from).then_some(j);
        }
        let c = rest.chars().next()?;
        if c == '\n' && !multiline {
            return None;
        }
        j += c.len_utf8();
    }
    None
}

/// The closing `$` of inline maths opened before `from`: one line, `\$` allowed inside.
fn inline_dollar(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut j = from;
    while j < bytes.len() {
        match bytes[j] {
            b'\n' => return None,
            b'$' if !escaped(bytes, j) => return (j > from).then_some(j),
            _ => j += 1,
        }
    }
    None
}

/// ` [ ... ] ` on one line, no brackets inside, a space after.
fn bare_bracket(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut j = from;
    while j < bytes.len() {
        match bytes[j] {
            b'\n' | b'[' => return None,
            b']' => {
                let spaced = bytes.get(j + 1).is_some_and(u8::is_ascii_whitespace);
                return (j > from && spaced).then_some(j);
            }
            _ => j += 1,
        }
    }
    None
}

/// `\frac{3}{4}` outside any maths delimiters: numbers only. Its end.
fn bare_fraction(text: &str, at: usize) -> Option<usize> {
    let simple = |s: &str| {
        let s = s.strip_prefix('-').unwrap_or(s);
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == ',')
    };
    let rest = &text[at + "\\frac{".len()..];
    let (num, rest) = rest.split_once('}')?;
    let rest = rest.strip_prefix('{')?;
    let (den, _) = rest.split_once('}')?;
    if !simple(num) || !simple(den) {
        return None;
    }
    Some(at + "\\frac{".len() + num.len() + 2 + den.len() + 1)
}

/// Spans joined by `and`, `or` or commas (at most six) into answers; every span starts one.
fn chain_spans(text: &str, spans: &[Span]) -> Vec<Vec<Span>> {
    let mut chains = Vec::new();
    for (k, first) in spans.iter().enumerate() {
        let mut chain = vec![first.clone()];
        let mut last_end = first.end;
        for next in &spans[k + 1..] {
            if chain.len() == 6 || !is_joiner(&text[last_end..next.start]) {
                break;
            }
            chain.push(next.clone());
            last_end = next.end;
        }
        chains.push(chain);
    }
    // A chain that is the tail of a longer one is a candidate of its own too (MV tries both).
    chains
}

fn is_joiner(between: &str) -> bool {
    let t = between.trim();
    let t = t.strip_prefix(',').unwrap_or(t).trim();
    t.is_empty() && between.contains(',') || t == "and" || t == "or"
}

/// Plain numbers and arithmetic: anchored at the start, after a space or after `=`.
fn plain_matches(text: &str, dl: &Deadline) -> Result<Vec<Candidate>, Timeout> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        dl.check()?;
        let anchored = i == 0 || matches!(bytes[i - 1], b' ' | b'\t' | b'\n' | b'\r' | b'=');
        if !anchored {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
            continue;
        }
        let mut j = i;
        if text[j..].starts_with("**") {
            j += 2;
        }
        if let Some(c) = text[j..].chars().next()
            && "$€£¥₹₽₪₩₫฿".contains(c)
        {
            j += c.len_utf8();
        }
        if let Some(m) = expression_at(text, j).or_else(|| number_at(text, j)) {
            out.push(Candidate {
                tier: 300,
                start: i,
                ..m
            });
        }
        i += text[i..].chars().next().map_or(1, char::len_utf8);
    }
    Ok(out)
}

/// A number at `i`: `-1,234.5`, `1 000`, `1000,99` (decimal comma), `.5`, and a percent.
fn number_at(text: &str, i: usize) -> Option<Candidate> {
    let bytes = text.as_bytes();
    let digits = |mut j: usize| {
        while j < bytes.len() && bytes[j].is_ascii_digit() {
            j += 1;
        }
        j
    };
    let mut j = i;
    let negative = bytes.get(j) == Some(&b'-');
    if negative {
        j += 1;
    }
    let int_start = j;
    let int_end = digits(j);
    let mut cleaned = String::new();
    let mut end;
    if int_end == int_start {
        // `.5`
        if bytes.get(j) == Some(&b'.') && !negative {
            let frac_end = digits(j + 1);
            if frac_end == j + 1 {
                return None;
            }
            cleaned = format!("0{}", &text[j..frac_end]);
            end = frac_end;
        } else {
            return None;
        }
    } else {
        // Thousands groups: 1-3 digits, not starting with 0, then [ ,]ddd groups.
        let lead = int_end - int_start;
        let mut k = int_start + lead.min(3);
        let mut grouped = false;
        if (1..=3).contains(&lead) && bytes[int_start] != b'0' {
            k = int_end;
            while matches!(bytes.get(k), Some(b' ' | b',')) {
                let g_end = digits(k + 1);
                if g_end - (k + 1) != 3 {
                    break;
                }
                k = g_end;
                grouped = true;
            }
        }
        if grouped {
            cleaned = text[int_start..k].replace([' ', ','], "");
            end = k;
            if bytes.get(end) == Some(&b'.') && digits(end + 1) > end + 1 {
                let frac_end = digits(end + 1);
                cleaned.push_str(&text[end..frac_end]);
                end = frac_end;
            }
        } else {
            cleaned.push_str(&text[int_start..int_end]);
            end = int_end;
            if matches!(bytes.get(end), Some(b'.' | b',')) && digits(end + 1) > end + 1 {
                let frac_end = digits(end + 1);
                cleaned.push('.');
                cleaned.push_str(&text[end + 1..frac_end]);
                end = frac_end;
            }
        }
        let trimmed = cleaned.trim_start_matches('0');
        cleaned = if trimmed.is_empty() || trimmed.starts_with('.') {
            format!("0{trimmed}")
        } else {
            trimmed.to_string()
        };
    }
    if negative {
        cleaned.insert(0, '-');
    }
    let percent = match percent_after(&text[end..]) {
        Some(len) => {
            end += len;
            true
        }
        None => false,
    };
    // Number::parse takes no sign: keep the sign for plain_answer.
    Some(Candidate {
        tier: 300,
        start: i,
        end,
        kind: Kind::Plain {
            text: cleaned,
            percent,
            number: true,
        },
    })
}

/// Arithmetic at `i`: starts with a digit (after `-`, `(`), made of digits, `.`, spaces and
/// `+ - * × / ^ ( ) ÷`, with at least one operator, ending where punctuation, a space, `)`,
/// `$` or the end follows.
fn expression_at(text: &str, i: usize) -> Option<Candidate> {
    let allowed = |c: char| c.is_ascii_digit() || " .+-*×/^()÷".contains(c);
    let is_op = |c: char| "+-*×/^÷".contains(c);
    let rest = &text[i..];
    let mut lead = rest.chars();
    let mut c = lead.next()?;
    let mut skip = 0;
    for _ in 0..3 {
        if c == '-' || c == '(' {
            skip += 1;
            c = lead.next()?;
        } else {
            break;
        }
    }
    if !c.is_ascii_digit() {
        return None;
    }
    let run: usize = rest
        .char_indices()
        .skip(skip)
        .find(|&(_, c)| !allowed(c) && c != '\n')
        .map_or(rest.len(), |(k, _)| k);
    let run_text = &rest[..run];
    if run_text.contains('\n') {
        return None; // no multi-line arithmetic
    }
    // The first operator after the lead: an expression needs one inside it. Without one (a
    // long number) there is nothing to back off over.
    let first_op = run_text
        .char_indices()
        .skip(skip + 1)
        .find(|&(_, c)| is_op(c))
        .map(|(k, _)| k)?;
    // Open minus close parentheses before each byte offset, so that each end is checked in
    // constant time (backing off over a long run stays linear).
    let mut depth = vec![0i64; run + 1];
    for (k, c) in run_text.char_indices() {
        let d = depth[k]
            + match c {
                '(' => 1,
                ')' => -1,
                _ => 0,
            };
        depth[k + 1..=k + c.len_utf8()].fill(d);
    }
    // Back off until what follows is a valid end and an operator sits inside.
    let mut end = run;
    while end > 0 {
        let body = rest[..end].trim_end();
        let next = rest[end..].chars().next();
        let valid_end = match next {
            None => true,
            Some(c) => ".,: )$".contains(c) || c.is_whitespace(),
        };
        let last = body.chars().last();
        let has_op = first_op + 1 < body.len();
        if valid_end && has_op && last.is_some_and(|c| c.is_ascii_digit() || c == ')' || c == '.') {
            let body = body.trim_end_matches('.');
            if depth[body.len()] == 0 {
                return Some(Candidate {
                    tier: 300,
                    start: i,
                    end: i + end,
                    kind: Kind::Plain {
                        text: body.to_string(),
                        percent: false,
                        number: false,
                    },
                });
            }
        }
        end -= rest[..end].chars().last().map_or(1, char::len_utf8);
    }
    None
}

/// Candidates after `answer`, `answer:`, `final answer ... is`, `final answer is ... I hope`.
fn anchored(text: &str, chains: &[Vec<Span>], plain: &[Candidate], out: &mut Vec<Candidate>) {
    let lower = text.to_ascii_lowercase();
    let mut from = 0;
    while let Some(k) = lower[from..].find("answer") {
        let at = from + k;
        let after = at + "answer".len();
        from = after;
        let colon = lower[after..].starts_with(':');
        let final_answer = lower[..at].trim_end().ends_with("final");
        // `answer: ... X` or `answer ... X`: the first answer starting within 50 characters.
        let window_end = char_offset(text, after, 50);
        let tier = if colon { 100 } else { 200 };
        if let Some(chain) = chains
            .iter()
            .find(|c| c[0].start >= after && c[0].start <= window_end)
        {
            out.push(latex_candidate(chain, tier));
        }
        let line_end = lower[after..].find('\n').map_or(lower.len(), |n| after + n);
        if let Some(m) = plain.iter().find(|m| {
            m.start >= after
                && m.start <= window_end.min(line_end)
                && !followed_by_equals(text, m.end)
        }) {
            out.push(Candidate { tier, ..m.clone() });
        }
        // `answer ... = X`: after the last `=` within 100 characters on the line.
        let eq_window = char_offset(text, after, 100).min(line_end);
        if let Some(eq) = lower[after..eq_window].rfind('=') {
            let eq = after + eq;
            if let Some(m) = plain.iter().find(|m| {
                m.start == eq || (m.start > eq && text[eq + 1..m.start].trim().is_empty())
            }) {
                out.push(Candidate { tier, ..m.clone() });
            }
        }
        if final_answer {
            // `final answer ... is X`: X right after `is` (100 characters at most away).
            let search_end = char_offset(text, after, 100);
            if let Some(is_at) = find_is(&lower[after..search_end]) {
                let mut x = after + is_at + 2;
                if lower[x..].starts_with(':') {
                    x += 1;
                }
                let x_trimmed = x + (text[x..].len() - text[x..].trim_start().len());
                let hope = |end: usize| {
                    let rest = text[end..].strip_prefix('.').unwrap_or(&text[end..]);
                    let rest = rest.strip_prefix(char::is_whitespace).unwrap_or(rest);
                    rest.starts_with("I hope")
                };
                // Exactly `final answer is X. I hope` (Minerva's format) comes first of all.
                let literal = is_at == 1 && lower[after..].starts_with(' ');
                if let Some(chain) = chains.iter().find(|c| c[0].start == x_trimmed) {
                    let tier = if literal && hope(chain.last().map_or(0, |s| s.end)) {
                        0
                    } else {
                        50
                    };
                    out.push(latex_candidate(chain, tier));
                }
                if let Some(m) = plain.iter().find(|m| m.start == x_trimmed) {
                    let tier = if literal && hope(m.end) { 0 } else { 50 };
                    out.push(Candidate { tier, ..m.clone() });
                }
            }
        }
    }
}

fn latex_candidate(chain: &[Span], tier: u32) -> Candidate {
    Candidate {
        tier,
        start: chain[0].start,
        end: chain.last().map_or(0, |s| s.end),
        kind: Kind::Latex(
            chain
                .iter()
                .map(|s| (s.content.clone(), s.percent))
                .collect(),
        ),
    }
}

/// ` is` (with at least one space before), as the offset of `is`.
fn find_is(s: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = s[from..].find("is") {
        let at = from + k;
        let spaced_before = at == 0 || s[..at].ends_with(char::is_whitespace);
        let word_after = s[at + 2..].starts_with(|c: char| c.is_ascii_alphabetic());
        if spaced_before && !word_after {
            return Some(at);
        }
        from = at + 2;
    }
    None
}

fn followed_by_equals(text: &str, end: usize) -> bool {
    text[end..].trim_start().starts_with('=')
}

/// The byte offset `n` characters after `from` (or the end).
fn char_offset(text: &str, from: usize, n: usize) -> usize {
    text[from..]
        .char_indices()
        .nth(n)
        .map_or(text.len(), |(k, _)| from + k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str) -> String {
        let options = Options::default();
        let e = extract(text, &options, &Deadline::none()).unwrap();
        e.math
            .map_or_else(|| format!("none: {}", e.text), |m| m.to_string())
    }

    #[test]
    fn boxed_answers_come_first() {
        assert_eq!(found("so $x = 3$ and the answer is $\\boxed{5}$."), "5");
        assert_eq!(found("$\\boxed{28}$ pct"), "28%");
    }

    #[test]
    fn numbers_in_prose() {
        assert_eq!(found("the number is not 10 which is 1,000.99€"), "1000.99");
        assert_eq!(found("Soucis : 2,74 $ a.."), "2.74");
        assert_eq!(found("AZYUK2A"), "none: ");
        assert_eq!(found("1 000"), "1000");
        assert_eq!(found(".4"), "0.4");
        assert_eq!(found("-5"), "-5");
    }

    #[test]
    fn latex_spans_in_prose() {
        assert_eq!(found("Answer \\[ 9 \\]"), "9");
        assert_eq!(found("$1$ and $2$ and $3$"), "{1, 2, 3}");
        assert_eq!(
            found("Final Answer: The final answer is $34$. I hope it is correct."),
            "34"
        );
    }
}
