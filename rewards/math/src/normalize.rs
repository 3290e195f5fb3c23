//! Clean-up of an extracted answer before it is parsed: what the lexer cannot see on its own
//! (boxes, words for operators, units, approximations).

/// Units dropped from the end of an answer (`5 cm`, `12 miles`). Single letters are not
/// units here (`3t` keeps its `t`), except after a space where they cannot be a variable
/// multiplied in (`5 m`, `3 s`).
const UNITS: &[&str] = &[
    "cm", "mm", "km", "meter", "meters", "metre", "metres", "inch", "inches", "feet", "foot", "ft",
    "yard", "yards", "mile", "miles", "mph", "kmh", "kg", "gram", "grams", "mg", "lb", "lbs",
    "pound", "pounds", "ounce", "ounces", "oz", "liter", "liters", "litre", "litres", "ml",
    "gallon", "gallons", "second", "seconds", "sec", "minute", "minutes", "min", "mins", "hour",
    "hours", "hr", "hrs", "day", "days", "week", "weeks", "month", "months", "year", "years",
    "degree", "degrees", "deg", "unit", "units", "dollar", "dollars", "cent", "cents", "yuan",
    "euro", "euros", "rupee", "rupees", "people", "person", "students", "student", "ways", "way",
    "sq", "square", "cubic", "cu", "acre", "acres", "hectare", "hectares",
];
const SPACED_UNITS: &[&str] = &["m", "g", "s", "h", "l", "L"];

/// The contents of the last `\boxed{...}` (or `\fbox`), with the boxes just before it that
/// belong to the same answer: those a short gap away (`\boxed{1}\boxed{2}`), or a gap with
/// `and`, `or`, a comma or a semicolon (`\boxed{1} and \boxed{2}`). Joined with commas.
/// An unclosed last box gives the rest of the text. `None` without boxes.
pub(crate) fn last_boxed(text: &str) -> Option<String> {
    let mut results: Vec<String> = Vec::new();
    let mut search_end = text.len();
    // Where the box found in the previous round starts (the next one must end before it).
    let mut later_start: Option<usize> = None;
    loop {
        let head = &text[..search_end];
        let boxed = head.rfind("\\boxed");
        let fbox = head.rfind("\\fbox");
        let (start, name_len) = match (boxed, fbox) {
            (None, None) => break,
            (Some(b), Some(f)) if f > b => (f, 5),
            (Some(b), _) => (b, 6),
            (None, Some(f)) => (f, 5),
        };
        let mut open = start + name_len;
        while text[open..].starts_with(char::is_whitespace) {
            open += text[open..].chars().next().map_or(1, char::len_utf8);
        }
        let limit = later_start.unwrap_or(text.len());
        if !text[open..limit].starts_with('{') {
            if results.is_empty() {
                results.push(text[open..limit].to_string());
            }
            break;
        }
        let Some(close) = matching_brace(text, open, limit) else {
            if results.is_empty() {
                results.push(text[open + 1..limit].to_string());
            }
            break;
        };
        let content = text[open + 1..close].trim().to_string();
        if let Some(next_start) = later_start {
            let between = &text[close + 1..next_start];
            let previous = results.last().map(String::as_str).unwrap_or("");
            let joined = between.chars().count() < 10
                || (content != previous && between.chars().count() < 70 && has_separator(between));
            if !joined {
                break;
            }
        }
        if results.last() != Some(&content) {
            results.push(content);
        }
        later_start = Some(start);
        search_end = start;
    }
    if results.is_empty() {
        return None;
    }
    results.reverse();
    Some(results.join(","))
}

/// The index of the `}` closing the `{` at `open`, before `limit`.
fn matching_brace(text: &str, open: usize, limit: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text[open..limit].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

fn has_separator(between: &str) -> bool {
    between.contains(',') || between.contains(';') || {
        let lower = between.to_lowercase();
        words(&lower).any(|w| w == "and" || w == "or")
    }
}

fn words(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
}

/// Cleans an extracted answer for the parser.
pub(crate) fn normalize(text: &str) -> String {
    let mut s = match last_boxed(text) {
        Some(inner) => inner,
        None => text.to_string(),
    };
    // `\\frac` written with a doubled backslash (JSON-escaped twice); not in matrices, where
    // `\\` breaks rows.
    if !s.contains("matrix") && !s.contains("array") {
        s = undouble_backslashes(&s);
    }
    s = s.replace(['\n', '\t', '\r'], " ");
    // `11,\! 111` is one number: the negative space takes the spaces after it too.
    while let Some(i) = s.find("\\!") {
        let rest = s[i + 2..].trim_start().to_string();
        s.truncate(i);
        s.push_str(&rest);
    }
    s = braced_commas(&s);
    for (from, to) in [
        ("\\$", ""),
        ("\\displaystyle", ""),
        ("\\mathrm{th}", ""),
        ("\\%", "%"),
    ] {
        s = s.replace(from, to);
    }
    s = s.replace('$', "");
    s = replace_words(&s);
    s = cut_approximation(&s);
    s = strip_units(&s);
    let s = s.trim().trim_end_matches(['.', ',', ';', ':']).trim();
    drop_thousands_separators(s)
}

/// `14,916` and `11,111,111,100` (the whole answer) are one number; `(12,102)` is not.
fn drop_thousands_separators(s: &str) -> String {
    let (sign, digits) = match s.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", s),
    };
    let (int_part, frac) = match digits.split_once('.') {
        Some((i, f)) if !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) => (i, Some(f)),
        Some(_) => return s.to_string(),
        None => (digits, None),
    };
    let mut groups = int_part.split(',');
    let lead = groups.next().unwrap_or("");
    let rest: Vec<&str> = groups.collect();
    let is_grouped = !rest.is_empty()
        && (1..=3).contains(&lead.len())
        && !lead.starts_with('0')
        && lead.bytes().all(|b| b.is_ascii_digit())
        && rest
            .iter()
            .all(|g| g.len() == 3 && g.bytes().all(|b| b.is_ascii_digit()));
    if !is_grouped {
        return s.to_string();
    }
    let joined: String = std::iter::once(lead).chain(rest).collect();
    match frac {
        Some(f) => format!("{sign}{joined}.{f}"),
        None => format!("{sign}{joined}"),
    }
}

/// `14 {, }916` → `14,916`: a comma in braces (LaTeX's way to avoid a space after it).
fn braced_commas(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find('{') {
        let inner = rest[open + 1..].trim_start();
        let matched = inner
            .strip_prefix(',')
            .map(str::trim_start)
            .and_then(|t| t.strip_prefix('}'));
        match matched {
            Some(after) => {
                out.push_str(rest[..open].trim_end());
                out.push(',');
                rest = after;
            }
            None => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `\\frac` → `\frac` (a doubled backslash before a letter).
fn undouble_backslashes(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if bytes[i] == b'\\'
            && bytes.get(i + 1) == Some(&b'\\')
            && bytes.get(i + 2).is_some_and(u8::is_ascii_alphabetic)
        {
            i += 1;
            continue;
        }
        let c = s[i..].chars().next().expect("inside the string");
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Words that stand for symbols: `and`/`or` between items, `percent`, `infinity`.
fn replace_words(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while !rest.is_empty() {
        let c = rest.chars().next().expect("not empty");
        if !c.is_ascii_alphabetic() {
            out.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let word = &rest[..len];
        let after_command = out.ends_with('\\');
        let replacement = if after_command {
            None
        } else {
            match word.to_ascii_lowercase().as_str() {
                "and" | "or" => Some(","),
                "percent" | "percentage" | "pct" => Some("%"),
                "infinity" | "inf" => Some("\\infty "),
                _ => None,
            }
        };
        match replacement {
            Some(r) => {
                if r == "," {
                    // `1, and 2` → `1, 2`
                    let trimmed = out.trim_end().trim_end_matches(',').len();
                    out.truncate(trimmed);
                }
                out.push_str(r);
            }
            None => out.push_str(word),
        }
        rest = &rest[len..];
    }
    out
}

/// `x = 1/3 \approx 0.33` keeps `x = 1/3`; `x \approx 11` keeps `11`.
fn cut_approximation(s: &str) -> String {
    let Some(first) = s.find("\\approx") else {
        return s.to_string();
    };
    if s[..first].contains('=') {
        return s[..first].to_string();
    }
    let last = s.rfind("\\approx").expect("found above");
    s[last + "\\approx".len()..].to_string()
}

/// Drops a trailing unit: `\text{...}` units are dropped by the parser; plain words here.
fn strip_units(s: &str) -> String {
    let mut text = s.trim_end().to_string();
    for _ in 0..2 {
        let trimmed = text.trim_end();
        // the last word and what precedes it
        let word_start = trimmed
            .char_indices()
            .rev()
            .find(|(_, c)| !c.is_ascii_alphabetic())
            .map_or(0, |(i, c)| i + c.len_utf8());
        let word = &trimmed[word_start..];
        if word.is_empty() || word_start == 0 {
            break;
        }
        let before = &trimmed[..word_start];
        let spaced = before.ends_with(char::is_whitespace);
        let after_quantity = before
            .trim_end()
            .ends_with(|c: char| c.is_ascii_digit() || c == '}' || c == ')');
        let is_unit = UNITS.contains(&word.to_ascii_lowercase().as_str())
            || (spaced && SPACED_UNITS.contains(&word));
        if is_unit && after_quantity && !before.ends_with('\\') {
            text = before.trim_end().to_string();
        } else {
            break;
        }
    }
    // `cm^2` left a power behind
    if let Some(stripped) = text.strip_suffix("^2").or_else(|| text.strip_suffix("^3"))
        && stripped.ends_with(|c: char| c.is_ascii_digit())
        && s.trim_end().len() > text.len()
    {
        text = stripped.to_string();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_join_when_close_or_separated_by_words() {
        assert_eq!(last_boxed("so \\boxed{3}."), Some("3".into()));
        assert_eq!(last_boxed("\\boxed{1}\\boxed{2}"), Some("1,2".into()));
        assert_eq!(
            last_boxed("\\boxed{1} papers and \\boxed{2} bins"),
            Some("1,2".into())
        );
        assert_eq!(
            last_boxed("\\boxed{1} no no no no no \\boxed{2}"),
            Some("2".into())
        );
        assert_eq!(
            last_boxed("\\boxed{\\frac{1}{2}}"),
            Some("\\frac{1}{2}".into())
        );
        assert_eq!(last_boxed("\\boxed{x = 1"), Some("x = 1".into()));
        assert_eq!(
            last_boxed("\\boxed{004} ... long text in between here ... \\boxed{004}"),
            Some("004".into())
        );
        assert_eq!(last_boxed("no box"), None);
    }

    #[test]
    fn cleans_words_units_and_approximations() {
        assert_eq!(normalize("28 percent"), "28 %");
        assert_eq!(normalize("19, 46, and 82"), "19, 46, 82");
        assert_eq!(normalize("(11,7)or(7,11)"), "(11,7),(7,11)");
        assert_eq!(normalize("x = 5+5+1 = 1/3 \\approx 11"), "x = 5+5+1 = 1/3");
        assert_eq!(normalize("x\\approx11"), "11");
        assert_eq!(normalize("125 miles"), "125");
        assert_eq!(normalize("5 m"), "5");
        assert_eq!(normalize("3t"), "3t");
        assert_eq!(normalize("5 é"), "5 é");
        assert_eq!(normalize("5 écm"), "5 écm");
        assert_eq!(normalize("11,\\! 111"), "11111");
        assert_eq!(normalize("14,916"), "14916");
        assert_eq!(normalize("14 {, }916"), "14916");
        assert_eq!(normalize("3{,}5"), "3,5");
        assert_eq!(normalize("-1,000.5"), "-1000.5");
        assert_eq!(normalize("(12,102)"), "(12,102)");
        assert_eq!(normalize("1,22"), "1,22");
        assert_eq!(normalize("\\\\frac{1}{2}"), "\\frac{1}{2}");
        assert_eq!(normalize("\\sin x + \\sin y"), "\\sin x + \\sin y");
    }
}
