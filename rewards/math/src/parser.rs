//! LaTeX and plain maths into [`Math`].
//!
//! Precedence, loosest first: `;` lists, `,` lists, relation chains, `∪`, `+ - ±`, explicit
//! `· × / ÷ :`, unary signs, juxtaposition (`2x`, `\frac12 x`: tighter than `/`, so `1/2x` is
//! `1/(2x)`), powers and postfix `! % '`, atoms.

use crate::answer::{Math, RelOp};
use crate::deadline::{Deadline, MAX_DEPTH, Timeout};
use crate::expr::{BigOp, Constant, Expr, Func};
use crate::lexer::{LexError, Tok, lex};
use crate::number::Number;

/// Why an answer could not be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ParseError {
    /// Not well-formed maths.
    #[error("{0}")]
    Syntax(String),
    /// The deadline passed.
    #[error("verification ran past its deadline")]
    Timeout,
}

impl From<Timeout> for ParseError {
    fn from(_: Timeout) -> Self {
        ParseError::Timeout
    }
}

impl From<LexError> for ParseError {
    fn from(e: LexError) -> Self {
        match e {
            LexError::Timeout => ParseError::Timeout,
            LexError::UnknownCommand(c) => ParseError::Syntax(format!("unknown command \\{c}")),
            LexError::Unexpected(c) => ParseError::Syntax(format!("unexpected {c:?}")),
            LexError::Unbalanced => ParseError::Syntax("unbalanced braces".into()),
        }
    }
}

type PResult<T> = Result<T, ParseError>;

fn syntax<T>(message: impl Into<String>) -> PResult<T> {
    Err(ParseError::Syntax(message.into()))
}

/// Single letters read as functions when a parenthesis follows (`f(x)`); other letters
/// multiply (`p(1-p)`, `x(x+1)`).
const FUNCTION_LETTERS: &[char] = &['f', 'g', 'h', 'F', 'G', 'H', 'W'];

/// Parses one answer.
pub(crate) fn parse(text: &str, dl: &Deadline) -> PResult<Math> {
    let tokens = lex(text, dl)?;
    if tokens.is_empty() {
        return syntax("empty");
    }
    let mut p = Parser {
        toks: tokens,
        pos: 0,
        dl,
        depth: 0,
        abs_depth: 0,
    };
    let m = p.semicolon_list()?;
    if p.pos < p.toks.len() {
        return syntax(format!("unexpected {:?}", p.toks[p.pos]));
    }
    Ok(m)
}

struct Parser<'a> {
    toks: Vec<Tok>,
    pos: usize,
    dl: &'a Deadline,
    depth: usize,
    abs_depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.pos + k)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += usize::from(t.is_some());
        t
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        if self.peek() == Some(tok) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, tok: &Tok) -> PResult<()> {
        if self.eat(tok) {
            Ok(())
        } else {
            syntax(format!("expected {tok:?}, found {:?}", self.peek()))
        }
    }

    fn enter(&mut self) -> PResult<()> {
        self.dl.check()?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return syntax("nested too deeply");
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    /// Whether the next token ends a list or group.
    fn at_end(&self) -> bool {
        matches!(
            self.peek(),
            None | Some(Tok::Close(_) | Tok::End(_) | Tok::Op('&' | '\\'))
        ) || (self.abs_depth > 0 && self.peek() == Some(&Tok::Op('|')))
    }

    fn semicolon_list(&mut self) -> PResult<Math> {
        let mut items = vec![self.comma_list()?];
        while self.eat(&Tok::Op(';')) {
            if self.at_end() {
                break;
            }
            items.push(self.comma_list()?);
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one item")
        } else {
            Math::Set {
                items,
                braces: false,
            }
        })
    }

    fn comma_list(&mut self) -> PResult<Math> {
        let mut items = vec![self.relation()?];
        while self.eat(&Tok::Op(',')) {
            if self.at_end() || self.peek() == Some(&Tok::Op(';')) {
                break;
            }
            // `1, 2, and 3` leaves an empty item
            if self.peek() == Some(&Tok::Op(',')) {
                continue;
            }
            items.push(self.relation()?);
        }
        if items.len() == 1 {
            return Ok(items.pop().expect("one item"));
        }
        // `n = 1, 2, 3` is n = {1, 2, 3}; `a = 1, b = 2` is a list of equations.
        if let Math::Relation { ops, .. } = &items[0]
            && ops.len() == 1
            && matches!(ops[0], RelOp::Eq | RelOp::In)
            && !items[1..].iter().any(Math::is_relation)
        {
            let mut rest = items.split_off(1);
            let Math::Relation { mut terms, ops } = items.pop().expect("first item") else {
                unreachable!("matched above")
            };
            let rhs = terms.pop().expect("two sides");
            rest.insert(0, rhs);
            terms.push(Math::Set {
                items: rest,
                braces: false,
            });
            return Ok(Math::Relation { terms, ops });
        }
        Ok(Math::Set {
            items,
            braces: false,
        })
    }

    fn relation(&mut self) -> PResult<Math> {
        let mut terms = vec![self.union()?];
        let mut ops = Vec::new();
        while let Some(Tok::Rel(r)) = self.peek() {
            let op = match r {
                '=' => RelOp::Eq,
                '<' => RelOp::Lt,
                '>' => RelOp::Gt,
                'l' => RelOp::Le,
                'g' => RelOp::Ge,
                'n' => RelOp::Ne,
                'i' => RelOp::In,
                _ => return syntax("≈ left in an answer"),
            };
            self.pos += 1;
            ops.push(op);
            terms.push(self.union()?);
        }
        Ok(if ops.is_empty() {
            terms.pop().expect("one term")
        } else {
            Math::Relation { terms, ops }
        })
    }

    fn union(&mut self) -> PResult<Math> {
        let mut parts = vec![self.sum()?];
        while self.eat(&Tok::Union) {
            parts.push(self.sum()?);
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            Math::Union(parts)
        })
    }

    fn sum(&mut self) -> PResult<Math> {
        self.enter()?;
        let first = self.term()?;
        if !matches!(self.peek(), Some(Tok::Op('+' | '-') | Tok::PlusMinus)) {
            self.leave();
            return Ok(first);
        }
        // One flat sum however long (`1+1+...+1` must not nest a thousand levels deep).
        let mut terms = vec![into_expr(first)?];
        loop {
            self.dl.check()?;
            match self.peek() {
                Some(Tok::Op('+')) => {
                    self.pos += 1;
                    terms.push(into_expr(self.term()?)?);
                }
                Some(Tok::Op('-')) => {
                    self.pos += 1;
                    terms.push(Expr::negated(into_expr(self.term()?)?));
                }
                Some(Tok::PlusMinus) => {
                    self.pos += 1;
                    let rhs = into_expr(self.term()?)?;
                    let lhs = if terms.len() == 1 {
                        terms.pop().expect("one term")
                    } else {
                        Expr::Add(std::mem::take(&mut terms))
                    };
                    terms.push(Expr::PlusMinus(Box::new(lhs), Box::new(rhs)));
                }
                _ => break,
            }
        }
        self.leave();
        Ok(Math::Expr(if terms.len() == 1 {
            terms.pop().expect("one term")
        } else {
            Expr::Add(terms)
        }))
    }

    fn term(&mut self) -> PResult<Math> {
        let first = self.unary()?;
        if !matches!(self.peek(), Some(Tok::Op('*' | '/' | ':'))) {
            return Ok(first);
        }
        // One flat product: `a / b / c` is a · b⁻¹ · c⁻¹.
        let mut factors = vec![into_expr(first)?];
        while let Some(Tok::Op(op @ ('*' | '/' | ':'))) = self.peek().cloned() {
            self.dl.check()?;
            self.pos += 1;
            let rhs = into_expr(self.unary()?)?;
            factors.push(if op == '*' {
                rhs
            } else {
                Expr::Pow(Box::new(rhs), Box::new(Expr::int(-1)))
            });
        }
        Ok(Math::Expr(Expr::Mul(factors)))
    }

    fn unary(&mut self) -> PResult<Math> {
        self.enter()?;
        let out = match self.peek() {
            Some(Tok::Op('-')) => {
                self.pos += 1;
                Math::Expr(Expr::negated(into_expr(self.unary()?)?))
            }
            Some(Tok::Op('+')) => {
                self.pos += 1;
                self.unary()?
            }
            Some(Tok::PlusMinus) => {
                self.pos += 1;
                let operand = into_expr(self.unary()?)?;
                Math::Expr(Expr::PlusMinus(Box::new(Expr::int(0)), Box::new(operand)))
            }
            _ => self.juxtaposition()?,
        };
        self.leave();
        Ok(out)
    }

    /// Whether the next token can start a factor of an implicit product.
    fn starts_factor(&self) -> bool {
        match self.peek() {
            Some(Tok::Num(_) | Tok::Letter(_) | Tok::Word(_) | Tok::Text(_) | Tok::Begin(_)) => {
                true
            }
            Some(Tok::Open('(' | '{')) => true,
            Some(Tok::Op('|')) => self.abs_depth == 0,
            Some(Tok::Cmd(c)) => !matches!(
                c.as_str(),
                "circ" | "degree" | "prime" | "pmod" | "bmod" | "mod" | "rfloor" | "rceil"
            ),
            _ => false,
        }
    }

    fn juxtaposition(&mut self) -> PResult<Math> {
        let first = self.postfix()?;
        if !self.starts_factor() {
            return Ok(first);
        }
        let mut factors = vec![into_expr(first)?];
        while self.starts_factor() {
            factors.push(into_expr(self.postfix()?)?);
        }
        // Words next to quantities are units: `10\text{ cm}`, `\frac13\textbf{meters}`.
        let is_text = |e: &Expr| match e {
            Expr::Text(_) => true,
            Expr::Pow(b, _) => matches!(b.as_ref(), Expr::Text(_)),
            _ => false,
        };
        if factors.iter().any(|f| !is_text(f)) {
            factors.retain(|f| !is_text(f));
        }
        Ok(Math::Expr(if factors.len() == 1 {
            factors.pop().expect("one factor")
        } else {
            Expr::Mul(factors)
        }))
    }

    fn postfix(&mut self) -> PResult<Math> {
        self.enter()?;
        let mut base = self.atom()?;
        loop {
            match self.peek() {
                Some(Tok::Op('^')) => {
                    self.pos += 1;
                    if self.degree_sign() {
                        continue;
                    }
                    let exp = into_expr(self.script()?)?;
                    base = Math::Expr(Expr::Pow(Box::new(into_expr(base)?), Box::new(exp)));
                }
                Some(Tok::Cmd(c)) if c == "degree" => self.pos += 1,
                Some(Tok::Op('!')) => {
                    self.pos += 1;
                    base = Math::Expr(Expr::Func(Func::Factorial, vec![into_expr(base)?]));
                }
                Some(Tok::Op('%')) => {
                    self.pos += 1;
                    base = Math::Expr(Expr::Percent(Box::new(into_expr(base)?)));
                }
                Some(Tok::Op('\'')) => {
                    self.pos += 1;
                    base = match into_expr(base)? {
                        Expr::Sym(s) => Math::Expr(Expr::Sym(format!("{s}'"))),
                        Expr::Apply(s, args) => Math::Expr(Expr::Apply(format!("{s}'"), args)),
                        _ => return syntax("a prime after something that is not a name"),
                    };
                }
                _ => break,
            }
        }
        self.leave();
        Ok(base)
    }

    /// `^\circ`, `^{\circ}`: degrees, which an answer in degrees does not need.
    fn degree_sign(&mut self) -> bool {
        let circ = |t: Option<&Tok>| matches!(t, Some(Tok::Cmd(c)) if c == "circ");
        if circ(self.peek()) {
            self.pos += 1;
            return true;
        }
        if self.peek() == Some(&Tok::Open('{'))
            && circ(self.peek_at(1))
            && self.peek_at(2) == Some(&Tok::Close('}'))
        {
            self.pos += 3;
            return true;
        }
        false
    }

    /// The argument of `^`, `_`, `\frac`, `\sqrt`: a braced group, or one token (one digit
    /// of a number: `\frac12` is ½).
    fn script(&mut self) -> PResult<Math> {
        match self.peek().cloned() {
            Some(Tok::Open('{')) => {
                self.pos += 1;
                let m = self.semicolon_list()?;
                self.expect(&Tok::Close('}'))?;
                Ok(m)
            }
            Some(Tok::Num(n)) => {
                let mut chars = n.chars();
                let first = chars.next().expect("numbers are not empty");
                let rest: String = chars.collect();
                if rest.is_empty() || first == '.' {
                    self.pos += 1;
                    return Ok(Math::Expr(Expr::Num(number(&n)?)));
                }
                self.toks[self.pos] = Tok::Num(rest);
                Ok(Math::Expr(Expr::Num(number(&first.to_string())?)))
            }
            Some(Tok::Op('-')) => {
                // `x^(-1)`
                self.pos += 1;
                Ok(Math::Expr(Expr::negated(into_expr(self.script()?)?)))
            }
            _ => self.atom(),
        }
    }

    fn atom(&mut self) -> PResult<Math> {
        self.enter()?;
        let Some(tok) = self.next() else {
            return syntax("unexpected end");
        };
        let out = match tok {
            Tok::Num(n) => {
                // `204_5`: digits in a base, equal only to the same digits in the same base.
                if self.eat(&Tok::Op('_')) {
                    let base = match self.script()? {
                        Math::Expr(e) => crate::expr::simplify(&e, self.dl)?.to_string(),
                        other => other.to_string(),
                    };
                    let digits = n.trim_start_matches('0');
                    let digits = if digits.is_empty() { "0" } else { digits };
                    return Ok(Math::Expr(Expr::Sym(format!("{digits}_{base}"))));
                }
                Math::Expr(Expr::Num(number(&n)?))
            }
            Tok::Letter(c) => self.letter(c)?,
            Tok::Word(w) => {
                let name = self.subscripted(w)?;
                self.maybe_apply(name, true)?
            }
            Tok::Open('(') => self.group('(')?,
            Tok::Open('[') => self.group('[')?,
            Tok::Open('{') => {
                let m = self.semicolon_list()?;
                self.expect(&Tok::Close('}'))?;
                m
            }
            Tok::Open('S') => {
                if self.eat(&Tok::Close('S')) {
                    Math::Set {
                        items: Vec::new(),
                        braces: true,
                    }
                } else {
                    let m = self.semicolon_list()?;
                    self.expect(&Tok::Close('S'))?;
                    let items = match m {
                        Math::Set { items, .. } => items,
                        other => vec![other],
                    };
                    Math::Set {
                        items,
                        braces: true,
                    }
                }
            }
            Tok::Op('|') => {
                self.abs_depth += 1;
                let inner = self.sum();
                self.abs_depth -= 1;
                let inner = into_expr(inner?)?;
                self.expect(&Tok::Op('|'))?;
                Math::Expr(Expr::Func(Func::Abs, vec![inner]))
            }
            Tok::Text(t) => Math::Expr(text(&t)),
            Tok::Begin(env) => self.matrix(&env)?,
            Tok::Cmd(c) => self.command(&c)?,
            other => return syntax(format!("unexpected {other:?}")),
        };
        self.leave();
        Ok(out)
    }

    fn letter(&mut self, c: char) -> PResult<Math> {
        let subscripted = self.peek() == Some(&Tok::Op('_'));
        let name = self.subscripted(c.to_string())?;
        if !subscripted && self.peek() != Some(&Tok::Op('\'')) {
            match c {
                'e' => return Ok(Math::Expr(Expr::Const(Constant::E))),
                'i' => return Ok(Math::Expr(Expr::Const(Constant::I))),
                _ => {}
            }
        }
        let primes = {
            let mut n = 0;
            while self.peek_at(n) == Some(&Tok::Op('\'')) {
                n += 1;
            }
            n
        };
        let callable =
            FUNCTION_LETTERS.contains(&c) && self.peek_at(primes) == Some(&Tok::Open('('));
        if callable {
            self.pos += primes;
            let name = format!("{name}{}", "'".repeat(primes));
            return self.maybe_apply(name, true);
        }
        Ok(Math::Expr(Expr::Sym(name)))
    }

    /// `name` with its subscript, if one follows: `a_3` and `a_{3}` are both `a_3`.
    fn subscripted(&mut self, name: String) -> PResult<String> {
        if !self.eat(&Tok::Op('_')) {
            return Ok(name);
        }
        let sub = self.script()?;
        let sub = match sub {
            Math::Expr(e) => crate::expr::simplify(&e, self.dl)?.to_string(),
            other => other.to_string(),
        };
        Ok(format!("{name}_{}", sub.replace(' ', "")))
    }

    /// `name(args)` when a parenthesis follows and `callable`; the bare name otherwise.
    fn maybe_apply(&mut self, name: String, callable: bool) -> PResult<Math> {
        if !callable || self.peek() != Some(&Tok::Open('(')) {
            return Ok(Math::Expr(Expr::Sym(name)));
        }
        self.pos += 1;
        let args = self.arguments(')')?;
        Ok(Math::Expr(Expr::Apply(name, args)))
    }

    /// Comma-separated expressions up to `close` (consumed).
    fn arguments(&mut self, close: char) -> PResult<Vec<Expr>> {
        let mut args = Vec::new();
        if self.eat(&Tok::Close(close)) {
            return Ok(args);
        }
        loop {
            args.push(into_expr(self.sum()?)?);
            if self.eat(&Tok::Close(close)) {
                return Ok(args);
            }
            self.expect(&Tok::Op(','))?;
        }
    }

    /// After `(` or `[`: a group, an interval, a pair or a tuple.
    fn group(&mut self, open: char) -> PResult<Math> {
        let mut items = vec![self.relation()?];
        while matches!(self.peek(), Some(Tok::Op(',' | ';'))) {
            self.pos += 1;
            items.push(self.relation()?);
        }
        let close = match self.next() {
            Some(Tok::Close(c @ (')' | ']'))) => c,
            other => return syntax(format!("expected ) or ], found {other:?}")),
        };
        match items.len() {
            1 if (open == '(') == (close == ')') => Ok(items.pop().expect("one item")),
            1 => syntax("a bracket that opens and closes differently around one value"),
            2 => {
                let hi = items.pop().expect("two items");
                let lo = items.pop().expect("two items");
                match (lo, hi) {
                    (Math::Expr(lo), Math::Expr(hi)) => Ok(Math::Interval {
                        lo,
                        hi,
                        lo_open: open == '(',
                        hi_open: close == ')',
                        pair: open == '(' && close == ')',
                    }),
                    (lo, hi) if open == '(' && close == ')' => Ok(Math::Tuple(vec![lo, hi])),
                    _ => syntax("an interval whose ends are not numbers"),
                }
            }
            _ if (open == '(') == (close == ')') => Ok(Math::Tuple(items)),
            _ => syntax("a tuple that opens and closes differently"),
        }
    }

    fn matrix(&mut self, env: &str) -> PResult<Math> {
        if !matches!(
            env,
            "pmatrix"
                | "bmatrix"
                | "Bmatrix"
                | "vmatrix"
                | "Vmatrix"
                | "matrix"
                | "smallmatrix"
                | "array"
        ) {
            return syntax(format!("environment {env} is not an answer"));
        }
        let mut rows: Vec<Vec<Expr>> = vec![Vec::new()];
        loop {
            self.dl.check()?;
            match self.peek() {
                Some(Tok::End(e)) if e == env => {
                    self.pos += 1;
                    break;
                }
                Some(Tok::Op('&')) => self.pos += 1,
                Some(Tok::Op('\\')) => {
                    self.pos += 1;
                    rows.push(Vec::new());
                }
                None => return syntax(format!("\\begin{{{env}}} without \\end")),
                _ => {
                    let cell = into_expr(self.sum()?)?;
                    rows.last_mut().expect("a row").push(cell);
                }
            }
        }
        rows.retain(|r| !r.is_empty());
        let width = rows.first().map_or(0, Vec::len);
        if width == 0 || rows.iter().any(|r| r.len() != width) {
            return syntax("a matrix with ragged rows");
        }
        Ok(Math::Expr(Expr::Matrix(rows)))
    }

    fn command(&mut self, name: &str) -> PResult<Math> {
        let e = match name {
            "frac" => {
                let num = into_expr(self.script()?)?;
                let den = into_expr(self.script()?)?;
                Expr::quotient(num, den)
            }
            "binom" => {
                let n = into_expr(self.script()?)?;
                let k = into_expr(self.script()?)?;
                Expr::Func(Func::Binom, vec![n, k])
            }
            "sqrt" => {
                let index = if self.eat(&Tok::Open('[')) {
                    let n = into_expr(self.sum()?)?;
                    self.expect(&Tok::Close(']'))?;
                    n
                } else {
                    Expr::int(2)
                };
                let radicand = into_expr(self.script()?)?;
                Expr::Pow(
                    Box::new(radicand),
                    Box::new(Expr::Pow(Box::new(index), Box::new(Expr::int(-1)))),
                )
            }
            "pi" => Expr::Const(Constant::Pi),
            "infty" => Expr::Const(Constant::Infinity),
            "emptyset" | "varnothing" => {
                return Ok(Math::Set {
                    items: Vec::new(),
                    braces: true,
                });
            }
            "sum" | "prod" => {
                return self.big(if name == "sum" {
                    BigOp::Sum
                } else {
                    BigOp::Product
                });
            }
            "lfloor" | "lceil" => {
                let inner = into_expr(self.sum()?)?;
                let close = if name == "lfloor" { "rfloor" } else { "rceil" };
                self.expect(&Tok::Cmd(close.into()))?;
                Expr::Func(
                    if name == "lfloor" {
                        Func::Floor
                    } else {
                        Func::Ceil
                    },
                    vec![inner],
                )
            }
            _ => {
                if let Some(f) = Func::from_name(name) {
                    return self.function(f);
                }
                return syntax(format!("\\{name} cannot start a value"));
            }
        };
        Ok(Math::Expr(e))
    }

    /// `\sin x`, `\sin(x)`, `\sin^2 x`, `\log_2 8`, `\max(a, b)`.
    fn function(&mut self, f: Func) -> PResult<Math> {
        let base = if f == Func::Log && self.eat(&Tok::Op('_')) {
            Some(into_expr(self.script()?)?)
        } else {
            None
        };
        let power = if self.eat(&Tok::Op('^')) {
            Some(into_expr(self.script()?)?)
        } else {
            None
        };
        let mut args = if self.eat(&Tok::Open('(')) {
            self.arguments(')')?
        } else if self.peek() == Some(&Tok::Open('{')) {
            vec![into_expr(self.script()?)?]
        } else {
            // `\sin 2x`: the numbers and letters that follow.
            let mut factors = vec![into_expr(self.postfix()?)?];
            while matches!(
                self.peek(),
                Some(Tok::Num(_) | Tok::Letter(_) | Tok::Word(_))
            ) {
                factors.push(into_expr(self.postfix()?)?);
            }
            vec![if factors.len() == 1 {
                factors.pop().expect("one factor")
            } else {
                Expr::Mul(factors)
            }]
        };
        if f == Func::Log && args.len() == 1 {
            // `\log x` is base 10 (natural logarithms are `\ln`).
            if let Some(b) = base {
                args.push(b);
            }
        }
        let mut e = Expr::Func(f, args);
        if let Some(p) = power {
            // \sin^{-1} x is the inverse function.
            e = match (&e, p.as_num().and_then(Number::to_i64)) {
                (Expr::Func(Func::Sin, a), Some(-1)) => Expr::Func(Func::Asin, a.clone()),
                (Expr::Func(Func::Cos, a), Some(-1)) => Expr::Func(Func::Acos, a.clone()),
                (Expr::Func(Func::Tan, a), Some(-1)) => Expr::Func(Func::Atan, a.clone()),
                _ => Expr::Pow(Box::new(e), Box::new(p)),
            };
        }
        Ok(Math::Expr(e))
    }

    /// `\sum_{k=0}^{n} body`.
    fn big(&mut self, op: BigOp) -> PResult<Math> {
        self.expect(&Tok::Op('_'))?;
        let (var, lo) = match self.script()? {
            Math::Relation { terms, ops } if ops == [RelOp::Eq] && terms.len() == 2 => {
                match (&terms[0], &terms[1]) {
                    (Math::Expr(Expr::Sym(v)), Math::Expr(lo)) => (v.clone(), lo.clone()),
                    _ => return syntax("a sum index that is not a name"),
                }
            }
            _ => return syntax("a sum without its index"),
        };
        self.expect(&Tok::Op('^'))?;
        let hi = into_expr(self.script()?)?;
        let body = into_expr(self.juxtaposition()?)?;
        Ok(Math::Expr(Expr::Big {
            op,
            var,
            lo: Box::new(lo),
            hi: Box::new(hi),
            body: Box::new(body),
        }))
    }
}

fn number(text: &str) -> PResult<Number> {
    Number::parse(text).ok_or_else(|| ParseError::Syntax(format!("bad number {text}")))
}

fn into_expr(m: Math) -> PResult<Expr> {
    match m {
        Math::Expr(e) => Ok(e),
        other => syntax(format!("{other} used in arithmetic")),
    }
}

/// `\text{...}`: a choice letter `(C)`, a number, or words.
fn text(raw: &str) -> Expr {
    let trimmed = raw.trim();
    let unwrapped = trimmed
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or(trimmed);
    if let Some(n) = Number::parse(unwrapped) {
        return Expr::Num(n);
    }
    let words: String = unwrapped
        .chars()
        .filter(|c| !c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect();
    Expr::Text(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> String {
        parse(s, &Deadline::none()).unwrap().to_string()
    }

    #[test]
    fn precedence_follows_latex_habits() {
        assert_eq!(p("1/2x"), "1*(2*x)^(-1)");
        assert_eq!(p("\\frac12 x"), "1*2^(-1)*x");
        assert_eq!(p("-x^2"), "-x^2");
        assert_eq!(p("2 \\sin b \\cos a"), "2*sin(b)*cos(a)");
        assert_eq!(p("\\sin 2x"), "sin(2*x)");
        assert_eq!(p("\\tan^2(y)+1"), "tan(y)^2 + 1");
    }

    #[test]
    fn structures() {
        assert_eq!(p("[0,1)"), "[0, 1)");
        assert_eq!(p("(3, \\frac{\\pi}{2})"), "(3, pi*2^(-1))");
        assert_eq!(p("(6,31,-1)"), "(6, 31, -1)");
        assert_eq!(p("\\{1,2\\}"), "{1, 2}");
        assert_eq!(p("n=1, 2, 3"), "n = {1, 2, 3}");
        assert_eq!(p("a=1, b=2"), "{a = 1, b = 2}");
        assert_eq!(p("(0;0;1)"), "(0, 0, 1)");
        assert_eq!(p("-12;-11"), "{-12, -11}");
        assert_eq!(p("x \\in [-2,7]"), "x in [-2, 7]");
        assert_eq!(p("[1, 2) \\cup (3, \\infty)"), "[1, 2) U (3, oo)");
        assert_eq!(
            p("\\begin{pmatrix}1 & 2\\\\3 & 4\\end{pmatrix}"),
            "Matrix([[1, 2], [3, 4]])"
        );
    }

    #[test]
    fn names_units_and_functions() {
        assert_eq!(p("a_{37}"), "a_37");
        assert_eq!(p("a_3"), "a_3");
        assert_eq!(p("f(x)"), "f(x)");
        assert_eq!(p("p(1-p)"), "p*(1 - p)");
        assert_eq!(p("10\\text{ cm}"), "10");
        assert_eq!(p("\\text{(C)}"), "\"c\"");
        assert_eq!(p("90^\\circ"), "90");
        assert_eq!(p("204_5"), "204_5");
        assert_eq!(p("0204_{5}"), "204_5");
        assert_eq!(p("28\\%"), "28%");
        assert_eq!(p("\\sqrt[3]{x}"), "x^(3^(-1))");
    }

    #[test]
    fn long_sums_and_products_stay_flat() {
        let sum = vec!["1"; 20_000].join("+");
        let m = parse(&sum, &Deadline::none()).unwrap();
        let Math::Expr(Expr::Add(terms)) = &m else {
            panic!("{m}")
        };
        assert_eq!(terms.len(), 20_000);
        let product = vec!["2"; 20_000].join("/");
        assert!(matches!(
            parse(&product, &Deadline::none()).unwrap(),
            Math::Expr(Expr::Mul(_))
        ));
        assert_eq!(p("a-b+c"), "a - b + c");
        assert_eq!(p("a/b/c"), "a*b^(-1)*c^(-1)");
    }

    #[test]
    fn refuses_what_is_not_maths() {
        for bad in [
            "-[0,1)",
            "(1,2]x",
            "\\frac{1}",
            "\\begin{align}x\\end{align}",
            "((((",
            "x^",
        ] {
            assert!(parse(bad, &Deadline::none()).is_err(), "{bad}");
        }
        let deep = "(".repeat(10_000) + "1" + &")".repeat(10_000);
        assert!(parse(&deep, &Deadline::none()).is_err());
    }
}
