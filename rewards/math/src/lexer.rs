//! Tokens of LaTeX (and of plain maths, which is the same minus the commands).

use crate::deadline::{Deadline, Timeout};

/// A token.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// Digits with at most one decimal point; thousands separators already removed.
    Num(String),
    /// One letter.
    Letter(char),
    /// A named symbol: Greek letters, `\mathbb{R}`.
    Word(String),
    /// A command that means something to the parser (`frac`, `sqrt`, `sin`, `sum`...).
    Cmd(String),
    /// The contents of `\text{...}` and its kin.
    Text(String),
    /// `\begin{env}`.
    Begin(String),
    /// `\end{env}`.
    End(String),
    /// `(`, `[`, `{`, or `S` for the set brace `\{`.
    Open(char),
    /// `)`, `]`, `}`, or `S` for `\}`.
    Close(char),
    /// `+ - * / ^ _ ! ' , ; : | & %` and the row break `\` (from `\\`).
    Op(char),
    /// `=`, `<`, `>`, `≤`, `≥`, `≠`, `∈` (as `= < > l g n i`).
    Rel(char),
    /// `±` (and `∓`).
    PlusMinus,
    /// `∪`.
    Union,
}

/// Why a string could not be read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LexError {
    /// A command this reader does not know.
    UnknownCommand(String),
    /// A character that has no meaning in maths.
    Unexpected(char),
    /// Braces that do not match.
    Unbalanced,
    /// The deadline passed.
    Timeout,
}

impl From<Timeout> for LexError {
    fn from(_: Timeout) -> Self {
        LexError::Timeout
    }
}

/// Commands that are only spacing or sizing: skipped.
const SKIPPED: &[&str] = &[
    "left",
    "right",
    "middle",
    "big",
    "Big",
    "bigg",
    "Bigg",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "biggl",
    "biggr",
    "Biggl",
    "Biggr",
    "quad",
    "qquad",
    "displaystyle",
    "textstyle",
    "scriptstyle",
    "limits",
    "nolimits",
    "hfill",
    "nonumber",
    "notag",
    "dots",
    "ldots",
    "cdots",
    "vdots",
    "ddots",
    "boxed",
    "fbox",
    "mathrel",
    "mathord",
    "hline",
    "enspace",
    "thinspace",
    "medspace",
    "thickspace",
    "negthinspace",
    "space",
    "phantom",
    "rm",
    "it",
    "bf",
    "cal",
    "underbrace",
    "overbrace",
    "therefore",
    "because",
];

/// Commands that read one argument and mean it unchanged (`\vec{a}` is `a`).
const TRANSPARENT: &[&str] = &[
    "vec",
    "overline",
    "overrightarrow",
    "overleftarrow",
    "bar",
    "hat",
    "widehat",
    "tilde",
    "widetilde",
    "mathbf",
    "boldsymbol",
    "bm",
    "mathcal",
    "mathscr",
    "mathfrak",
    "underline",
    "dot",
    "ddot",
    "mathsf",
    "mathtt",
    "pmb",
    "Vec",
    "check",
    "breve",
    "acute",
    "grave",
];

/// Commands whose argument is words.
const TEXT: &[&str] = &[
    "text",
    "textbf",
    "textit",
    "textrm",
    "textnormal",
    "textsf",
    "texttt",
    "textup",
    "mbox",
    "hbox",
    "mathrm",
    "mathit",
    "emph",
    "textsc",
];

/// Greek letters and other named symbols.
const WORDS: &[&str] = &[
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "varrho",
    "sigma",
    "varsigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Sigma",
    "Upsilon",
    "Phi",
    "Psi",
    "Omega",
    "ell",
    "hbar",
    "aleph",
    "nabla",
    "partial",
];

/// Commands the parser reads (kept as [`Tok::Cmd`]).
const PARSED: &[&str] = &[
    "frac",
    "sqrt",
    "binom",
    "pi",
    "infty",
    "sum",
    "prod",
    "emptyset",
    "varnothing",
    "circ",
    "degree",
    "sin",
    "cos",
    "tan",
    "sec",
    "csc",
    "cot",
    "arcsin",
    "arccos",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
    "ln",
    "log",
    "lg",
    "exp",
    "floor",
    "ceil",
    "gcd",
    "lcm",
    "max",
    "min",
    "det",
    "cosec",
    "prime",
    "lfloor",
    "rfloor",
    "lceil",
    "rceil",
    "pmod",
    "bmod",
    "mod",
];

fn canonical_command(name: &str) -> Option<Tok> {
    let tok = match name {
        "dfrac" | "tfrac" | "cfrac" | "frac" => Tok::Cmd("frac".into()),
        "dbinom" | "tbinom" | "binom" | "choose" => Tok::Cmd("binom".into()),
        "cdot" | "times" | "ast" | "cross" => Tok::Op('*'),
        "div" => Tok::Op('/'),
        "pm" | "mp" => Tok::PlusMinus,
        "le" | "leq" | "leqslant" | "leqq" => Tok::Rel('l'),
        "ge" | "geq" | "geqslant" | "geqq" => Tok::Rel('g'),
        "lt" => Tok::Rel('<'),
        "gt" => Tok::Rel('>'),
        "ne" | "neq" => Tok::Rel('n'),
        "in" => Tok::Rel('i'),
        "equiv" | "coloneqq" => Tok::Rel('='),
        "approx" | "simeq" | "sim" | "thickapprox" => Tok::Rel('~'),
        "cup" => Tok::Union,
        "lbrace" => Tok::Open('S'),
        "rbrace" => Tok::Close('S'),
        "lbrack" => Tok::Open('['),
        "rbrack" => Tok::Close(']'),
        "langle" => Tok::Open('('),
        "rangle" => Tok::Close(')'),
        "vert" | "lvert" | "rvert" | "mid" | "Vert" | "lVert" | "rVert" => Tok::Op('|'),
        "colon" => Tok::Op(':'),
        "prime" => Tok::Op('\''),
        "infin" | "infinity" => Tok::Cmd("infty".into()),
        _ if PARSED.contains(&name) => Tok::Cmd(name.into()),
        _ if WORDS.contains(&name) => Tok::Word(name.into()),
        _ => return None,
    };
    Some(tok)
}

/// Reads `text` into tokens.
pub(crate) fn lex(text: &str, dl: &Deadline) -> Result<Vec<Tok>, LexError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        dl.check()?;
        let c = chars[i];
        match c {
            c if c.is_whitespace() || c == '~' || c == '$' => i += 1,
            '0'..='9' | '.' => {
                if c == '.' && !chars.get(i + 1).is_some_and(char::is_ascii_digit) {
                    // A full stop: punctuation.
                    i += 1;
                    continue;
                }
                let (number, next) = read_number(&chars, i);
                out.push(Tok::Num(number));
                i = next;
            }
            '\\' => i = read_command(&chars, i, &mut out, dl)?,
            '(' | '[' | '{' => {
                out.push(Tok::Open(c));
                i += 1;
            }
            ')' | ']' | '}' => {
                out.push(Tok::Close(c));
                i += 1;
            }
            '<' | '>' | '!' if chars.get(i + 1) == Some(&'=') => {
                out.push(Tok::Rel(match c {
                    '<' => 'l',
                    '>' => 'g',
                    _ => 'n',
                }));
                i += 2;
            }
            '=' | '<' | '>' => {
                out.push(Tok::Rel(c));
                i += 1;
            }
            '+' | '-' | '*' | '/' | '^' | '_' | '!' | '\'' | ',' | ';' | ':' | '|' | '&' | '%' => {
                out.push(Tok::Op(c));
                i += 1;
            }
            '×' | '·' | '⋅' | '∗' => {
                out.push(Tok::Op('*'));
                i += 1;
            }
            '÷' => {
                out.push(Tok::Op('/'));
                i += 1;
            }
            '−' | '–' => {
                out.push(Tok::Op('-'));
                i += 1;
            }
            '≤' | '⩽' => {
                out.push(Tok::Rel('l'));
                i += 1;
            }
            '≥' | '⩾' => {
                out.push(Tok::Rel('g'));
                i += 1;
            }
            '≠' => {
                out.push(Tok::Rel('n'));
                i += 1;
            }
            '∈' => {
                out.push(Tok::Rel('i'));
                i += 1;
            }
            '≈' => {
                out.push(Tok::Rel('~'));
                i += 1;
            }
            '±' | '∓' => {
                out.push(Tok::PlusMinus);
                i += 1;
            }
            '∪' => {
                out.push(Tok::Union);
                i += 1;
            }
            'π' => {
                out.push(Tok::Cmd("pi".into()));
                i += 1;
            }
            '∞' => {
                out.push(Tok::Cmd("infty".into()));
                i += 1;
            }
            '√' => {
                out.push(Tok::Cmd("sqrt".into()));
                i += 1;
            }
            '°' => {
                out.push(Tok::Cmd("degree".into()));
                i += 1;
            }
            '²' | '³' => {
                out.push(Tok::Op('^'));
                out.push(Tok::Num(if c == '²' { "2" } else { "3" }.into()));
                i += 1;
            }
            c if c.is_alphabetic() => {
                out.push(Tok::Letter(c));
                i += 1;
            }
            c if c.is_control() => i += 1,
            other => return Err(LexError::Unexpected(other)),
        }
    }
    Ok(out)
}

/// A number at `start`: `123`, `12.5`, `.5`. (A whole answer written `1,234,567` has lost its
/// thousands separators before it gets here: inside brackets `(12,102)` is two numbers.)
fn read_number(chars: &[char], start: usize) -> (String, usize) {
    let digits_from = |mut j: usize| {
        while j < chars.len() && chars[j].is_ascii_digit() {
            j += 1;
        }
        j
    };
    let mut end = digits_from(start);
    let mut text: String = chars[start..end].iter().collect();
    if chars.get(end) == Some(&'.') && chars.get(end + 1).is_some_and(char::is_ascii_digit) {
        let frac_end = digits_from(end + 1);
        text.extend(&chars[end..frac_end]);
        end = frac_end;
    } else if start == end && chars.get(start) == Some(&'.') {
        let frac_end = digits_from(start + 1);
        text = chars[start..frac_end].iter().collect();
        end = frac_end;
    }
    (text, end)
}

/// The balanced `{...}` group starting at `open` (which must be `{`): its contents and the
/// index after the closing brace.
fn braced(chars: &[char], open: usize) -> Result<(String, usize), LexError> {
    let mut depth = 0usize;
    let mut j = open;
    while j < chars.len() {
        match chars[j] {
            '\\' => j += 1,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Ok((chars[open + 1..j].iter().collect(), j + 1));
                }
            }
            _ => {}
        }
        j += 1;
    }
    Err(LexError::Unbalanced)
}

fn skip_spaces(chars: &[char], mut j: usize) -> usize {
    while j < chars.len() && chars[j].is_whitespace() {
        j += 1;
    }
    j
}

fn read_command(
    chars: &[char],
    start: usize,
    out: &mut Vec<Tok>,
    dl: &Deadline,
) -> Result<usize, LexError> {
    let Some(&first) = chars.get(start + 1) else {
        return Ok(start + 1);
    };
    if !first.is_ascii_alphabetic() {
        // A one-character command.
        match first {
            '{' => out.push(Tok::Open('S')),
            '}' => out.push(Tok::Close('S')),
            '\\' => out.push(Tok::Op('\\')),
            '%' => out.push(Tok::Op('%')),
            '|' => out.push(Tok::Op('|')),
            '(' | ')' | '[' | ']' => {} // stray delimiters of inline maths
            _ => {}                     // \, \; \: \! \  \$ \& and the like
        }
        return Ok(start + 2);
    }
    let mut end = start + 1;
    while end < chars.len() && chars[end].is_ascii_alphabetic() {
        end += 1;
    }
    let name: String = chars[start + 1..end].iter().collect();
    command(chars, &name, end, out, dl)
}

fn command(
    chars: &[char],
    name: &str,
    end: usize,
    out: &mut Vec<Tok>,
    dl: &Deadline,
) -> Result<usize, LexError> {
    if SKIPPED.contains(&name) {
        // `\left.` and `\right.` delimit nothing.
        if (name == "left" || name == "right") && chars.get(end) == Some(&'.') {
            return Ok(end + 1);
        }
        return Ok(end);
    }
    if TEXT.contains(&name) || name == "operatorname" || name == "mathbb" {
        let open = skip_spaces(chars, end);
        if chars.get(open) != Some(&'{') {
            return Ok(end); // `\rm` style switch without argument
        }
        let (content, next) = braced(chars, open)?;
        let trimmed = content.trim();
        match name {
            "operatorname" => {
                let fname = trimmed.trim_end_matches('*');
                out.push(canonical_command(fname).unwrap_or_else(|| Tok::Word(fname.into())));
            }
            "mathbb" => out.push(Tok::Word(format!("mathbb_{trimmed}"))),
            // `\mathrm{e}`, `\mathit{x}`: a letter in a maths font is that letter.
            _ if name.starts_with("math")
                && trimmed.chars().count() == 1
                && trimmed.chars().all(|c| c.is_ascii_alphabetic()) =>
            {
                out.push(Tok::Letter(trimmed.chars().next().expect("one letter")));
            }
            _ => {
                let lower = trimmed.to_lowercase();
                if lower == "and" || lower == "or" || lower == "," {
                    out.push(Tok::Op(','));
                } else if !trimmed.is_empty() {
                    out.push(Tok::Text(trimmed.to_string()));
                }
            }
        }
        return Ok(next);
    }
    if TRANSPARENT.contains(&name) {
        return Ok(end);
    }
    if name == "begin" || name == "end" {
        let open = skip_spaces(chars, end);
        if chars.get(open) != Some(&'{') {
            return Err(LexError::Unbalanced);
        }
        let (env, mut next) = braced(chars, open)?;
        let env = env.trim().to_string();
        if name == "begin" {
            // `\begin{array}{cc}`: the column layout is not maths.
            if env == "array" {
                let spec = skip_spaces(chars, next);
                if chars.get(spec) == Some(&'{') {
                    next = braced(chars, spec)?.1;
                }
            }
            out.push(Tok::Begin(env));
        } else {
            out.push(Tok::End(env));
        }
        return Ok(next);
    }
    if let Some(tok) = canonical_command(name) {
        out.push(tok);
        return Ok(end);
    }
    // `\quadx`, `\cdotx`: a known command run into letters.
    for cut in (2..name.len()).rev() {
        let (head, tail) = name.split_at(cut);
        if SKIPPED.contains(&head) || canonical_command(head).is_some() {
            dl.check()?;
            return command(chars, head, end - tail.len(), out, dl);
        }
    }
    Err(LexError::UnknownCommand(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s, &Deadline::none()).unwrap()
    }

    #[test]
    fn numbers() {
        assert_eq!(toks("12.5"), [Tok::Num("12.5".into())]);
        assert_eq!(
            toks("12,102"),
            [Tok::Num("12".into()), Tok::Op(','), Tok::Num("102".into())]
        );
        assert_eq!(toks(".5"), [Tok::Num(".5".into())]);
        assert_eq!(toks("3."), [Tok::Num("3".into())]);
    }

    #[test]
    fn commands_are_canonical() {
        assert_eq!(toks("\\dfrac"), [Tok::Cmd("frac".into())]);
        assert_eq!(
            toks("\\left( x \\right."),
            [Tok::Open('('), Tok::Letter('x')]
        );
        assert_eq!(toks("\\text{ and }"), [Tok::Op(',')]);
        assert_eq!(toks("\\text{(C)}"), [Tok::Text("(C)".into())]);
        assert_eq!(toks("\\quadx"), [Tok::Letter('x')]);
        assert_eq!(toks("\\mathrm{e}"), [Tok::Letter('e')]);
        assert_eq!(toks("\\mathrm{cm}"), [Tok::Text("cm".into())]);
        assert_eq!(
            toks("\\{1\\}"),
            [Tok::Open('S'), Tok::Num("1".into()), Tok::Close('S')]
        );
        assert!(matches!(
            lex("\\zzz", &Deadline::none()),
            Err(LexError::UnknownCommand(_))
        ));
        assert_eq!(
            toks("\\begin{array}{cc}1\\end{array}"),
            [
                Tok::Begin("array".into()),
                Tok::Num("1".into()),
                Tok::End("array".into())
            ]
        );
    }
}
