//! LiveCodeBench's comparison rules, applied on the host.
//!
//! - stdout: strip both, split lines, strip each line, same number of lines; a line matches
//!   if equal, or if every whitespace-separated token of both parses as a decimal and the
//!   decimals are equal (exactly: no float tolerance).
//! - return values: Python's `==` between the decoded return value and `json.loads` of the
//!   expected output (`1 == 1.0 == True`, a list never equals a tuple; a returned tuple was
//!   turned into a list by the harness, as LiveCodeBench does).

use serde_json::Value;

/// A Python value in the closed set that may leave the guest.
#[derive(Clone, Debug, PartialEq)]
pub enum PyValue {
    /// `None`.
    None,
    /// `bool`.
    Bool(bool),
    /// `int`, any size: sign and decimal digits without leading zeros (`0` is `(false, "0")`).
    Int(bool, String),
    /// `float`.
    Float(f64),
    /// `str`.
    Str(String),
    /// `list`.
    List(Vec<PyValue>),
    /// `tuple`.
    Tuple(Vec<PyValue>),
    /// `dict`, in insertion order.
    Dict(Vec<(PyValue, PyValue)>),
    /// `set` or `frozenset`.
    Set(Vec<PyValue>),
}

impl PyValue {
    fn int(text: &str) -> Option<PyValue> {
        let (neg, digits) = match text.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, text.strip_prefix('+').unwrap_or(text)),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = digits.trim_start_matches('0');
        Some(if digits.is_empty() {
            PyValue::Int(false, "0".into())
        } else {
            PyValue::Int(neg, digits.into())
        })
    }

    /// As an exact integer, when the value is one (`True` is 1; `2.0` is 2).
    fn as_int(&self) -> Option<(bool, String)> {
        match self {
            PyValue::Bool(b) => Some((false, if *b { "1" } else { "0" }.into())),
            PyValue::Int(neg, d) => Some((*neg, d.clone())),
            PyValue::Float(f) if f.is_finite() && f.fract() == 0.0 => {
                match PyValue::int(&format!("{f:.0}")) {
                    Some(PyValue::Int(neg, d)) => Some((neg, d)),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    fn is_number(&self) -> bool {
        matches!(
            self,
            PyValue::Bool(_) | PyValue::Int(..) | PyValue::Float(_)
        )
    }

    /// Python's `==`.
    pub fn py_eq(&self, other: &PyValue) -> bool {
        use PyValue as P;
        match (self, other) {
            (P::None, P::None) => true,
            (P::Str(a), P::Str(b)) => a == b,
            (P::Float(a), P::Float(b)) => a == b,
            (a, b) if a.is_number() && b.is_number() => {
                if let (P::Float(f), _) | (_, P::Float(f)) = (a, b)
                    && (!f.is_finite() || f.fract() != 0.0)
                {
                    // A non-integral float equals no int or bool.
                    return false;
                }
                a.as_int() == b.as_int()
            }
            (P::List(a), P::List(b)) | (P::Tuple(a), P::Tuple(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.py_eq(y))
            }
            (P::Set(a), P::Set(b)) => {
                a.len() == b.len() && a.iter().all(|x| b.iter().any(|y| x.py_eq(y)))
            }
            (P::Dict(a), P::Dict(b)) => {
                a.len() == b.len()
                    && a.iter().all(|(k, v)| {
                        b.iter()
                            .find(|(k2, _)| k.py_eq(k2))
                            .is_some_and(|(_, v2)| v.py_eq(v2))
                    })
            }
            _ => false,
        }
    }

    /// Decode the guest's closed encoding (see `harness.py`).
    pub fn from_guest(v: &Value) -> Result<PyValue, String> {
        Ok(match v {
            Value::Null => PyValue::None,
            Value::Bool(b) => PyValue::Bool(*b),
            Value::String(s) => PyValue::Str(s.clone()),
            Value::Array(xs) => PyValue::List(decode_all(xs)?),
            Value::Object(o) if o.len() == 1 => {
                let (tag, inner) = o.iter().next().expect("one entry");
                match (tag.as_str(), inner) {
                    ("i", Value::String(s)) => {
                        PyValue::int(s).ok_or_else(|| format!("bad int {s:?}"))?
                    }
                    ("f", Value::String(s)) => PyValue::Float(parse_float_repr(s)?),
                    ("t", Value::Array(xs)) => PyValue::Tuple(decode_all(xs)?),
                    ("e", Value::Array(xs)) => PyValue::Set(decode_all(xs)?),
                    ("d", Value::Array(pairs)) => PyValue::Dict(
                        pairs
                            .iter()
                            .map(|p| match p.as_array().map(Vec::as_slice) {
                                Some([k, v]) => Ok((Self::from_guest(k)?, Self::from_guest(v)?)),
                                _ => Err("bad dict entry".to_owned()),
                            })
                            .collect::<Result<_, _>>()?,
                    ),
                    _ => return Err(format!("unknown encoding tag {tag:?}")),
                }
            }
            other => return Err(format!("not in the closed encoding: {other}")),
        })
    }
}

fn decode_all(xs: &[Value]) -> Result<Vec<PyValue>, String> {
    xs.iter().map(PyValue::from_guest).collect()
}

fn parse_float_repr(s: &str) -> Result<f64, String> {
    match s {
        "nan" => Ok(f64::NAN),
        "inf" => Ok(f64::INFINITY),
        "-inf" => Ok(f64::NEG_INFINITY),
        _ => s.parse().map_err(|_| format!("bad float {s:?}")),
    }
}

/// `json.loads` as Python does it: integers stay exact at any size, `NaN`/`Infinity` are
/// accepted, objects keep their order (keys are strings).
pub fn parse_python_json(text: &str) -> Result<PyValue, String> {
    let mut p = JsonParser {
        s: text.as_bytes(),
        i: 0,
    };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("extra data at byte {}", p.i));
    }
    Ok(v)
}

struct JsonParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl JsonParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<PyValue, String> {
        if depth > 10_000 {
            return Err("nested too deeply".into());
        }
        let at = self.i;
        let c = *self.s.get(self.i).ok_or("unexpected end")?;
        match c {
            b'{' => {
                self.i += 1;
                let mut entries: Vec<(String, PyValue)> = Vec::new();
                self.ws();
                if self.eat("}") {
                    return Ok(PyValue::Dict(Vec::new()));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.ws();
                    if !self.eat(":") {
                        return Err(format!("expected ':' at byte {}", self.i));
                    }
                    self.ws();
                    let v = self.value(depth + 1)?;
                    // Python keeps the last value of a repeated key.
                    if let Some(slot) = entries.iter_mut().find(|(k, _)| *k == key) {
                        slot.1 = v;
                    } else {
                        entries.push((key, v));
                    }
                    self.ws();
                    if self.eat("}") {
                        break;
                    }
                    if !self.eat(",") {
                        return Err(format!("expected ',' or '}}' at byte {}", self.i));
                    }
                }
                Ok(PyValue::Dict(
                    entries
                        .into_iter()
                        .map(|(k, v)| (PyValue::Str(k), v))
                        .collect(),
                ))
            }
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.eat("]") {
                    return Ok(PyValue::List(items));
                }
                loop {
                    self.ws();
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    if self.eat("]") {
                        break;
                    }
                    if !self.eat(",") {
                        return Err(format!("expected ',' or ']' at byte {}", self.i));
                    }
                }
                Ok(PyValue::List(items))
            }
            b'"' => Ok(PyValue::Str(self.string()?)),
            _ if self.eat("true") => Ok(PyValue::Bool(true)),
            _ if self.eat("false") => Ok(PyValue::Bool(false)),
            _ if self.eat("null") => Ok(PyValue::None),
            _ if self.eat("NaN") => Ok(PyValue::Float(f64::NAN)),
            _ if self.eat("Infinity") => Ok(PyValue::Float(f64::INFINITY)),
            _ if self.eat("-Infinity") => Ok(PyValue::Float(f64::NEG_INFINITY)),
            b'-' | b'0'..=b'9' => {
                let start = self.i;
                self.i += 1;
                let mut is_float = false;
                while let Some(&b) = self.s.get(self.i) {
                    match b {
                        b'0'..=b'9' => {}
                        b'.' | b'e' | b'E' => is_float = true,
                        b'+' | b'-' if is_float => {}
                        _ => break,
                    }
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII");
                if is_float {
                    text.parse()
                        .map(PyValue::Float)
                        .map_err(|_| format!("bad number {text:?}"))
                } else {
                    PyValue::int(text).ok_or_else(|| format!("bad number {text:?}"))
                }
            }
            _ => Err(format!("unexpected {:?} at byte {at}", c as char)),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        if !self.eat("\"") {
            return Err(format!("expected a string at byte {}", self.i));
        }
        let mut out = String::new();
        let mut units: Vec<u16> = Vec::new();
        loop {
            let c = *self.s.get(self.i).ok_or("unterminated string")?;
            if c != b'\\' && !units.is_empty() {
                out.push_str(&String::from_utf16_lossy(&units));
                units.clear();
            }
            match c {
                b'"' => {
                    self.i += 1;
                    return Ok(out);
                }
                b'\\' => {
                    let e = *self.s.get(self.i + 1).ok_or("unterminated escape")?;
                    self.i += 2;
                    let plain = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hex = self.s.get(self.i..self.i + 4).ok_or("short \\u escape")?;
                            let hex = std::str::from_utf8(hex).map_err(|_| "bad \\u escape")?;
                            let unit =
                                u16::from_str_radix(hex, 16).map_err(|_| "bad \\u escape")?;
                            self.i += 4;
                            units.push(unit);
                            continue;
                        }
                        _ => return Err(format!("bad escape at byte {}", self.i - 1)),
                    };
                    if !units.is_empty() {
                        out.push_str(&String::from_utf16_lossy(&units));
                        units.clear();
                    }
                    out.push(plain);
                }
                _ => {
                    let rest = std::str::from_utf8(&self.s[self.i..])
                        .map_err(|_| "invalid UTF-8 in string")?;
                    let ch = rest.chars().next().expect("non-empty");
                    out.push(ch);
                    self.i += ch.len_utf8();
                }
            }
        }
    }
}

/// A token as Python's `Decimal` reads it, normalised: `None` if it is not a decimal.
#[derive(Debug, PartialEq)]
enum Dec {
    NaN,
    Inf(bool),
    /// Zero (any sign, any exponent).
    Zero,
    /// Sign, significant digits (no leading or trailing zeros), exponent of the last digit.
    Finite(bool, String, i64),
}

fn parse_decimal(token: &str) -> Option<Dec> {
    let t = token.trim();
    let (neg, body) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    let lower = body.to_ascii_lowercase();
    match lower.as_str() {
        "inf" | "infinity" => return Some(Dec::Inf(neg)),
        "nan" | "snan" => return Some(Dec::NaN),
        _ => {}
    }
    // Underscores are allowed between digits, as in Python.
    let (mantissa, exp) = match lower.find('e') {
        Some(p) => (&lower[..p], Some(&lower[p + 1..])),
        None => (lower.as_str(), None),
    };
    let digits_ok = |s: &str| {
        !s.starts_with('_')
            && !s.ends_with('_')
            && !s.contains("__")
            && s.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    };
    let (int_part, frac_part) = match mantissa.find('.') {
        Some(p) => (&mantissa[..p], &mantissa[p + 1..]),
        None => (mantissa, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty())
        || !digits_ok(int_part)
        || !digits_ok(frac_part)
    {
        return None;
    }
    let mut exponent: i64 = match exp {
        None => 0,
        Some(e) => {
            let (eneg, ed) = match e.as_bytes().first()? {
                b'-' => (true, &e[1..]),
                b'+' => (false, &e[1..]),
                _ => (false, e),
            };
            if ed.is_empty() || !digits_ok(ed) {
                return None;
            }
            let v: i64 = ed.replace('_', "").parse().ok()?;
            if eneg { -v } else { v }
        }
    };
    let int_digits = int_part.replace('_', "");
    let frac_digits = frac_part.replace('_', "");
    exponent -= frac_digits.len() as i64;
    let all = format!("{int_digits}{frac_digits}");
    let trimmed = all.trim_start_matches('0');
    if trimmed.is_empty() {
        return Some(Dec::Zero);
    }
    let sig = trimmed.trim_end_matches('0');
    exponent += (trimmed.len() - sig.len()) as i64;
    Some(Dec::Finite(neg, sig.to_owned(), exponent))
}

fn decimals_equal(a: &Dec, b: &Dec) -> bool {
    !matches!(a, Dec::NaN) && a == b
}

/// Whether a program's stdout matches the expected output (LiveCodeBench's rule).
pub fn stdout_matches(got: &str, expected: &str) -> bool {
    let got: Vec<&str> = got.trim().split('\n').map(str::trim).collect();
    let want: Vec<&str> = expected.trim().split('\n').map(str::trim).collect();
    got.len() == want.len() && got.iter().zip(&want).all(|(g, w)| line_matches(g, w))
}

fn line_matches(got: &str, want: &str) -> bool {
    if got == want {
        return true;
    }
    let g: Vec<&str> = got.split_whitespace().collect();
    let w: Vec<&str> = want.split_whitespace().collect();
    g.len() == w.len()
        && g.iter()
            .zip(&w)
            .all(|(a, b)| match (parse_decimal(a), parse_decimal(b)) {
                (Some(x), Some(y)) => decimals_equal(&x, &y),
                _ => false,
            })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(s: &str) -> PyValue {
        parse_python_json(s).unwrap()
    }

    #[test]
    fn stdout_rules_are_lcbs() {
        assert!(stdout_matches("3\n", "3"));
        assert!(stdout_matches("  YES \r\nNO\n\n", "YES\nNO\n"));
        assert!(!stdout_matches("YES\nNO\nNO", "YES\nNO"));
        assert!(!stdout_matches("yes", "YES"));
        // Decimals compare exactly, token by token.
        assert!(stdout_matches("1.50 2", "1.5 2.000"));
        assert!(stdout_matches("1e3", "1000"));
        assert!(stdout_matches("-0", "0.000"));
        assert!(!stdout_matches("0.333333", "0.3333333"));
        assert!(!stdout_matches("1.5 x", "1.50 x"));
        assert!(
            stdout_matches("nan", "nan"),
            "equal lines match before decimals are tried"
        );
        assert!(!stdout_matches("NaN", "NAN"));
        assert!(stdout_matches("1_000", "1000"));
        assert!(!stdout_matches("1 2", "1 2 3"));
        // Whitespace between tokens does not matter for numbers, but does for words.
        assert!(stdout_matches("1   2", "1 2"));
        assert!(!stdout_matches("a   b", "a b"));
    }

    #[test]
    fn python_equality_rules() {
        assert!(py("1").py_eq(&py("1.0")));
        assert!(py("1").py_eq(&PyValue::Bool(true)));
        assert!(py("0.0").py_eq(&PyValue::Bool(false)));
        assert!(!py("1.5").py_eq(&py("1")));
        assert!(!py("NaN").py_eq(&py("NaN")));
        assert!(py("Infinity").py_eq(&PyValue::Float(f64::INFINITY)));
        let big = "123456789012345678901234567890";
        assert!(py(big).py_eq(&py(big)));
        assert!(!py(big).py_eq(&py("123456789012345678901234567891")));
        assert!(py("1e30").py_eq(&py("1000000000000000019884624838656")));
        assert!(!py("[1, 2]").py_eq(&PyValue::Tuple(vec![py("1"), py("2")])));
        assert!(py("[1, [2, 3]]").py_eq(&py("[1.0, [2, 3]]")));
        assert!(py(r#"{"a": 1, "b": [2]}"#).py_eq(&py(r#"{"b": [2.0], "a": 1}"#)));
        assert!(!py(r#"{"a": 1}"#).py_eq(&py(r#"{"a": 1, "b": 2}"#)));
        assert!(py(r#""\u00e9\ud83d\ude00""#).py_eq(&PyValue::Str("é😀".into())));
        assert!(!py("null").py_eq(&py("0")));
        assert!(!py(r#""1""#).py_eq(&py("1")));
        let set = PyValue::Set(vec![py("1"), py("2")]);
        assert!(set.py_eq(&PyValue::Set(vec![py("2.0"), py("1")])));
        assert!(!set.py_eq(&py("[1, 2]")));
    }

    #[test]
    fn guest_encoding_round_trips() {
        let v: Value = serde_json::from_str(
            r#"{"d": [[{"i": "1"}, {"t": [{"f": "nan"}, {"f": "-inf"}, "x", null, true]}]]}"#,
        )
        .unwrap();
        let decoded = PyValue::from_guest(&v).unwrap();
        match decoded {
            PyValue::Dict(entries) => {
                assert_eq!(entries[0].0, PyValue::Int(false, "1".into()));
                assert!(matches!(&entries[0].1, PyValue::Tuple(xs) if xs.len() == 5));
            }
            other => panic!("{other:?}"),
        }
        assert!(PyValue::from_guest(&serde_json::json!({"zz": 1})).is_err());
        assert!(PyValue::from_guest(&serde_json::json!(3)).is_err());
    }
}
