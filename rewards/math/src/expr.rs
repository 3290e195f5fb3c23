//! Expressions: the tree both answers are parsed into, its canonical form, and its value.
//!
//! [`simplify`] brings an expression to a canonical form: sums and products flattened, numbers
//! folded exactly, like terms and like factors collected, operands in a fixed order. Two
//! expressions with the same canonical form are equal; the comparison falls back to
//! evaluation ([`eval`]) for the rest.

use std::collections::BTreeMap;
use std::fmt;

use num_complex::Complex64;
use num_traits::{Signed, Zero};

use crate::deadline::{Deadline, Timeout};
use crate::number::Number;

/// Named constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Constant {
    /// π.
    Pi,
    /// Euler's number.
    E,
    /// The imaginary unit.
    I,
    /// ∞ (−∞ is `-1 · ∞`).
    Infinity,
}

/// Functions that are known and evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum Func {
    Sin,
    Cos,
    Tan,
    Sec,
    Csc,
    Cot,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Tanh,
    /// Natural logarithm.
    Ln,
    /// `log(x, base)`.
    Log,
    Exp,
    Abs,
    Floor,
    Ceil,
    Factorial,
    /// `binom(n, k)`.
    Binom,
    Gcd,
    Lcm,
    Max,
    Min,
}

impl Func {
    /// The LaTeX command (or operator name) for this function, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "sin" => Func::Sin,
            "cos" => Func::Cos,
            "tan" => Func::Tan,
            "sec" => Func::Sec,
            "csc" | "cosec" => Func::Csc,
            "cot" => Func::Cot,
            "arcsin" | "asin" => Func::Asin,
            "arccos" | "acos" => Func::Acos,
            "arctan" | "atan" => Func::Atan,
            "sinh" => Func::Sinh,
            "cosh" => Func::Cosh,
            "tanh" => Func::Tanh,
            "ln" => Func::Ln,
            "log" | "lg" => Func::Log,
            "exp" => Func::Exp,
            "floor" => Func::Floor,
            "ceil" => Func::Ceil,
            "gcd" => Func::Gcd,
            "lcm" => Func::Lcm,
            "max" => Func::Max,
            "min" => Func::Min,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Func::Sin => "sin",
            Func::Cos => "cos",
            Func::Tan => "tan",
            Func::Sec => "sec",
            Func::Csc => "csc",
            Func::Cot => "cot",
            Func::Asin => "asin",
            Func::Acos => "acos",
            Func::Atan => "atan",
            Func::Sinh => "sinh",
            Func::Cosh => "cosh",
            Func::Tanh => "tanh",
            Func::Ln => "ln",
            Func::Log => "log",
            Func::Exp => "exp",
            Func::Abs => "abs",
            Func::Floor => "floor",
            Func::Ceil => "ceil",
            Func::Factorial => "factorial",
            Func::Binom => "binom",
            Func::Gcd => "gcd",
            Func::Lcm => "lcm",
            Func::Max => "max",
            Func::Min => "min",
        }
    }
}

/// `\sum` or `\prod` over an integer range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BigOp {
    /// Σ.
    Sum,
    /// Π.
    Product,
}

/// An expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// An exact number.
    Num(Number),
    /// A variable, with its subscript: `x`, `a_37`, `F_{n-k-1}`.
    Sym(String),
    /// A named constant.
    Const(Constant),
    /// A sum.
    Add(Vec<Expr>),
    /// A product (matrices keep their order).
    Mul(Vec<Expr>),
    /// A power.
    Pow(Box<Expr>, Box<Expr>),
    /// A known function.
    Func(Func, Vec<Expr>),
    /// An unknown function applied to arguments: `f(x)`.
    Apply(String, Vec<Expr>),
    /// `a ± b` (for a leading `±b`, `a` is 0). Expanded into a set of values before comparing.
    PlusMinus(Box<Expr>, Box<Expr>),
    /// `x%`: equal to `x/100`, and to `x` when the other side is a plain number.
    Percent(Box<Expr>),
    /// Words: `\text{Evelyn}` (lower case, no spaces).
    Text(String),
    /// A matrix, by rows.
    Matrix(Vec<Vec<Expr>>),
    /// `\sum_{var=lo}^{hi} body` or `\prod`.
    Big {
        /// Sum or product.
        op: BigOp,
        /// The index variable.
        var: String,
        /// The first index.
        lo: Box<Expr>,
        /// The last index.
        hi: Box<Expr>,
        /// The summand.
        body: Box<Expr>,
    },
}

impl Expr {
    /// An integer.
    pub fn int(i: i64) -> Self {
        Expr::Num(Number::int(i))
    }

    /// `-e`.
    pub fn negated(e: Expr) -> Self {
        Expr::Mul(vec![Expr::int(-1), e])
    }

    /// `a / b`.
    pub fn quotient(a: Expr, b: Expr) -> Self {
        Expr::Mul(vec![a, Expr::Pow(Box::new(b), Box::new(Expr::int(-1)))])
    }

    /// `a - b`.
    pub fn difference(a: Expr, b: Expr) -> Self {
        Expr::Add(vec![a, Expr::negated(b)])
    }

    /// The number, if this is one.
    pub fn as_num(&self) -> Option<&Number> {
        match self {
            Expr::Num(n) => Some(n),
            _ => None,
        }
    }

    /// Whether this is a number written as a decimal, or a percentage of one: such answers are
    /// compared after rounding.
    pub fn is_decimal_atom(&self) -> bool {
        match self {
            Expr::Num(n) => n.decimal,
            Expr::Percent(inner) => inner.is_decimal_atom(),
            Expr::Mul(factors) => {
                // -0.5 is `-1 · 0.5`.
                factors.len() == 2
                    && factors[0].as_num().is_some_and(|n| !n.decimal)
                    && factors[1].is_decimal_atom()
            }
            _ => false,
        }
    }

    /// Whether any matrix appears.
    pub fn has_matrix(&self) -> bool {
        let mut found = false;
        self.walk(&mut |e| found |= matches!(e, Expr::Matrix(_)));
        found
    }

    /// Calls `f` on this expression and every subexpression.
    pub fn walk(&self, f: &mut dyn FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Num(_) | Expr::Sym(_) | Expr::Const(_) | Expr::Text(_) => {}
            Expr::Add(xs) | Expr::Mul(xs) | Expr::Func(_, xs) | Expr::Apply(_, xs) => {
                xs.iter().for_each(|x| x.walk(f));
            }
            Expr::Pow(a, b) | Expr::PlusMinus(a, b) => {
                a.walk(f);
                b.walk(f);
            }
            Expr::Percent(a) => a.walk(f),
            Expr::Matrix(rows) => rows.iter().flatten().for_each(|x| x.walk(f)),
            Expr::Big { lo, hi, body, .. } => {
                lo.walk(f);
                hi.walk(f);
                body.walk(f);
            }
        }
    }

    /// The free variables (the index of a sum is bound), sorted.
    pub fn free_symbols(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect_symbols(&mut out, &[]);
        out.sort();
        out.dedup();
        out
    }

    fn collect_symbols(&self, out: &mut Vec<String>, bound: &[&str]) {
        match self {
            Expr::Sym(s) => {
                if !bound.contains(&s.as_str()) {
                    out.push(s.clone());
                }
            }
            Expr::Num(_) | Expr::Const(_) | Expr::Text(_) => {}
            Expr::Add(xs) | Expr::Mul(xs) | Expr::Func(_, xs) | Expr::Apply(_, xs) => {
                xs.iter().for_each(|x| x.collect_symbols(out, bound));
            }
            Expr::Pow(a, b) | Expr::PlusMinus(a, b) => {
                a.collect_symbols(out, bound);
                b.collect_symbols(out, bound);
            }
            Expr::Percent(a) => a.collect_symbols(out, bound),
            Expr::Matrix(rows) => rows
                .iter()
                .flatten()
                .for_each(|x| x.collect_symbols(out, bound)),
            Expr::Big {
                var, lo, hi, body, ..
            } => {
                lo.collect_symbols(out, bound);
                hi.collect_symbols(out, bound);
                let mut inner = bound.to_vec();
                inner.push(var);
                body.collect_symbols(out, &inner);
            }
        }
    }

    /// Whether the expression is made of variables only (no numbers, no constants): the left
    /// side of an assignment such as `x`, `AB`, `\frac{NO}{BO}`, `|AB|`, `f(x)`, `S_{MBCN}:S`.
    pub fn is_only_symbols(&self) -> bool {
        match self {
            Expr::Sym(_) => true,
            Expr::Apply(_, args) => args.iter().all(Expr::is_only_symbols),
            Expr::Add(xs) | Expr::Mul(xs) => xs.iter().all(|x| match x {
                // the -1 of a difference and the -1 power of a quotient
                Expr::Num(n) => n.to_i64() == Some(-1),
                other => other.is_only_symbols(),
            }),
            Expr::Pow(base, exp) => {
                base.is_only_symbols() && (exp.as_num().is_some_and(|n| n.to_i64() == Some(-1)))
            }
            Expr::Func(Func::Abs, args) => args.iter().all(Expr::is_only_symbols),
            _ => false,
        }
    }

    /// Replaces variables by `map(name)` where it gives `Some`.
    pub fn substitute(&self, map: &dyn Fn(&str) -> Option<Expr>) -> Expr {
        match self {
            Expr::Sym(s) => map(s).unwrap_or_else(|| self.clone()),
            Expr::Apply(name, xs) => {
                let renamed = match map(name) {
                    Some(Expr::Sym(other)) => other,
                    _ => name.clone(),
                };
                Expr::Apply(renamed, xs.iter().map(|x| x.substitute(map)).collect())
            }
            // The index of a sum is bound inside its body.
            Expr::Big {
                op,
                var,
                lo,
                hi,
                body,
            } => Expr::Big {
                op: *op,
                var: var.clone(),
                lo: Box::new(lo.substitute(map)),
                hi: Box::new(hi.substitute(map)),
                body: Box::new(body.substitute(&|name| {
                    if name == var { None } else { map(name) }
                })),
            },
            _ => self.map_children(&mut |x| x.substitute(map)),
        }
    }

    /// The same node with each direct child replaced by `f(child)`, children in order (for a
    /// sum over a range: the first index, the last, the body).
    pub fn map_children(&self, f: &mut dyn FnMut(&Expr) -> Expr) -> Expr {
        let mut all = |xs: &[Expr]| xs.iter().map(&mut *f).collect::<Vec<_>>();
        match self {
            Expr::Num(_) | Expr::Sym(_) | Expr::Const(_) | Expr::Text(_) => self.clone(),
            Expr::Add(xs) => Expr::Add(all(xs)),
            Expr::Mul(xs) => Expr::Mul(all(xs)),
            Expr::Func(g, xs) => Expr::Func(*g, all(xs)),
            Expr::Apply(name, xs) => Expr::Apply(name.clone(), all(xs)),
            Expr::Matrix(rows) => Expr::Matrix(rows.iter().map(|row| all(row)).collect()),
            Expr::Pow(a, b) => {
                let a = f(a);
                Expr::Pow(Box::new(a), Box::new(f(b)))
            }
            Expr::PlusMinus(a, b) => {
                let a = f(a);
                Expr::PlusMinus(Box::new(a), Box::new(f(b)))
            }
            Expr::Percent(a) => Expr::Percent(Box::new(f(a))),
            Expr::Big {
                op,
                var,
                lo,
                hi,
                body,
            } => {
                let lo = f(lo);
                let hi = f(hi);
                Expr::Big {
                    op: *op,
                    var: var.clone(),
                    lo: Box::new(lo),
                    hi: Box::new(hi),
                    body: Box::new(f(body)),
                }
            }
        }
    }

    /// The values of `a ± b`: every choice of sign for every `±` (at most 2^6 of them).
    pub fn expand_plus_minus(&self) -> Vec<Expr> {
        let mut count = 0;
        self.walk(&mut |e| count += usize::from(matches!(e, Expr::PlusMinus(..))));
        if count == 0 {
            return vec![self.clone()];
        }
        let count = count.min(6);
        (0..1u32 << count)
            .map(|signs| {
                let mut index = 0;
                self.choose_signs(signs, &mut index)
            })
            .collect()
    }

    /// `self` with the `index`-th `±` met in pre-order (as [`Expr::walk`] meets them) taken
    /// as `−` when bit `index` of `signs` is set, as `+` otherwise.
    fn choose_signs(&self, signs: u32, index: &mut u32) -> Expr {
        let Expr::PlusMinus(a, b) = self else {
            return self.map_children(&mut |x| x.choose_signs(signs, index));
        };
        let minus = *index < 6 && signs & (1 << *index) != 0;
        *index += 1;
        let a = a.choose_signs(signs, index);
        let b = b.choose_signs(signs, index);
        if minus {
            Expr::difference(a, b)
        } else {
            Expr::Add(vec![a, b])
        }
    }
}

/// The canonical form of `e`.
pub fn simplify(e: &Expr, dl: &Deadline) -> Result<Expr, Timeout> {
    dl.check()?;
    Ok(match e {
        Expr::Num(_) | Expr::Sym(_) | Expr::Const(_) | Expr::Text(_) => e.clone(),
        Expr::Add(terms) => {
            let terms = terms
                .iter()
                .map(|t| simplify(t, dl))
                .collect::<Result<Vec<_>, _>>()?;
            simplify_add(terms, dl)?
        }
        Expr::Mul(factors) => {
            let factors = factors
                .iter()
                .map(|f| simplify(f, dl))
                .collect::<Result<Vec<_>, _>>()?;
            simplify_mul(factors, dl)?
        }
        Expr::Pow(base, exp) => simplify_pow(simplify(base, dl)?, simplify(exp, dl)?, dl)?,
        Expr::Func(f, args) => {
            let args = args
                .iter()
                .map(|a| simplify(a, dl))
                .collect::<Result<Vec<_>, _>>()?;
            simplify_func(*f, args, dl)?
        }
        Expr::Apply(name, args) => Expr::Apply(
            name.clone(),
            args.iter()
                .map(|a| simplify(a, dl))
                .collect::<Result<_, _>>()?,
        ),
        Expr::PlusMinus(a, b) => {
            Expr::PlusMinus(Box::new(simplify(a, dl)?), Box::new(simplify(b, dl)?))
        }
        Expr::Percent(a) => Expr::Percent(Box::new(simplify(a, dl)?)),
        Expr::Matrix(rows) => Expr::Matrix(
            rows.iter()
                .map(|row| row.iter().map(|x| simplify(x, dl)).collect())
                .collect::<Result<_, _>>()?,
        ),
        Expr::Big {
            op,
            var,
            lo,
            hi,
            body,
        } => {
            let lo = simplify(lo, dl)?;
            let hi = simplify(hi, dl)?;
            let body = simplify(body, dl)?;
            // A sum over a small integer range is written out.
            if let (Some(a), Some(b)) = (
                lo.as_num().and_then(Number::to_i64),
                hi.as_num().and_then(Number::to_i64),
            ) && b >= a
                && b - a <= 1000
            {
                let items = (a..=b)
                    .map(|k| body.substitute(&|name| (name == var).then(|| Expr::int(k))))
                    .collect();
                return simplify(
                    &match op {
                        BigOp::Sum => Expr::Add(items),
                        BigOp::Product => Expr::Mul(items),
                    },
                    dl,
                );
            }
            Expr::Big {
                op: *op,
                var: var.clone(),
                lo: Box::new(lo),
                hi: Box::new(hi),
                body: Box::new(body),
            }
        }
    })
}

/// A term as coefficient × rest.
fn split_coefficient(term: Expr) -> (Number, Expr) {
    match term {
        Expr::Num(n) => (n, Expr::int(1)),
        Expr::Mul(mut factors) if factors.first().and_then(Expr::as_num).is_some() => {
            let Expr::Num(c) = factors.remove(0) else {
                unreachable!("checked above")
            };
            let rest = if factors.len() == 1 {
                factors.pop().expect("one factor")
            } else {
                Expr::Mul(factors)
            };
            (c, rest)
        }
        other => (Number::int(1), other),
    }
}

fn simplify_add(terms: Vec<Expr>, dl: &Deadline) -> Result<Expr, Timeout> {
    let mut flat = Vec::with_capacity(terms.len());
    for t in terms {
        match t {
            Expr::Add(inner) => flat.extend(inner),
            other => flat.push(other),
        }
    }
    // Matrices of one shape add element by element.
    if flat.iter().all(|t| matches!(t, Expr::Matrix(_))) && flat.len() > 1 {
        let shape = |t: &Expr| match t {
            Expr::Matrix(rows) => (rows.len(), rows.first().map_or(0, Vec::len)),
            _ => (0, 0),
        };
        let first = shape(&flat[0]);
        if flat.iter().all(|t| shape(t) == first) {
            let mut rows = vec![vec![Vec::new(); first.1]; first.0];
            for t in &flat {
                if let Expr::Matrix(m) = t {
                    for (i, row) in m.iter().enumerate() {
                        for (j, x) in row.iter().enumerate() {
                            rows[i][j].push(x.clone());
                        }
                    }
                }
            }
            return simplify(
                &Expr::Matrix(
                    rows.into_iter()
                        .map(|row| row.into_iter().map(Expr::Add).collect())
                        .collect(),
                ),
                dl,
            );
        }
    }
    let mut constant = Number::int(0);
    // like terms: canonical text of the rest → (coefficient, rest)
    let mut like: BTreeMap<String, (Number, Expr)> = BTreeMap::new();
    let mut others = Vec::new();
    for t in flat {
        dl.check()?;
        if matches!(t, Expr::Matrix(_)) {
            others.push(t);
            continue;
        }
        let (c, rest) = split_coefficient(t);
        if rest == Expr::int(1) {
            constant = constant.add(&c);
            continue;
        }
        let key = rest.to_string();
        match like.get_mut(&key) {
            Some((sum, _)) => *sum = sum.add(&c),
            None => {
                like.insert(key, (c, rest));
            }
        }
    }
    let mut out: Vec<Expr> = Vec::new();
    for (_, (c, rest)) in like {
        if c.is_zero() {
            continue;
        }
        out.push(with_coefficient(c, rest));
    }
    out.extend(others);
    if out.is_empty() {
        return Ok(Expr::Num(constant));
    }
    if !constant.is_zero() {
        out.insert(0, Expr::Num(constant));
    }
    Ok(match out.len() {
        1 => out.pop().expect("one term"),
        _ => Expr::Add(out),
    })
}

fn with_coefficient(c: Number, rest: Expr) -> Expr {
    if c.is_one() && !c.decimal {
        return rest;
    }
    match rest {
        Expr::Mul(mut factors) => {
            factors.insert(0, Expr::Num(c));
            Expr::Mul(factors)
        }
        other => Expr::Mul(vec![Expr::Num(c), other]),
    }
}

fn simplify_mul(factors: Vec<Expr>, dl: &Deadline) -> Result<Expr, Timeout> {
    simplify_mul_pass(factors, dl, true)
}

/// One pass of collecting factors; a power that opens into a product (`(xy)^2`, `√12`) gets
/// a second pass so that its factors meet their likes.
fn simplify_mul_pass(factors: Vec<Expr>, dl: &Deadline, again: bool) -> Result<Expr, Timeout> {
    let mut flat = Vec::with_capacity(factors.len());
    for f in factors {
        match f {
            Expr::Mul(inner) => flat.extend(inner),
            other => flat.push(other),
        }
    }
    let mut coefficient = Number::int(1);
    // base text → (base, exponents)
    let mut powers: BTreeMap<String, (Expr, Vec<Expr>)> = BTreeMap::new();
    let mut matrices: Vec<Expr> = Vec::new();
    for f in flat {
        dl.check()?;
        match f {
            Expr::Num(n) => coefficient = coefficient.mul(&n),
            Expr::Matrix(_) => matrices.push(f),
            other => {
                let (base, exp) = match other {
                    Expr::Pow(b, e) => (*b, *e),
                    x => (x, Expr::int(1)),
                };
                let key = base.to_string();
                powers
                    .entry(key)
                    .or_insert_with(|| (base, Vec::new()))
                    .1
                    .push(exp);
            }
        }
    }
    let mut out = Vec::new();
    let mut opened = false;
    for (_, (base, exps)) in powers {
        let exp = if exps.len() == 1 {
            exps.into_iter().next().expect("one exponent")
        } else {
            simplify_add(exps, dl)?
        };
        match simplify_pow(base, exp, dl)? {
            Expr::Num(n) => coefficient = coefficient.mul(&n),
            Expr::Mul(inner) => {
                opened = true;
                for x in inner {
                    match x {
                        Expr::Num(n) => coefficient = coefficient.mul(&n),
                        other => out.push(other),
                    }
                }
            }
            other => out.push(other),
        }
    }
    if opened && again {
        out.push(Expr::Num(coefficient));
        out.extend(matrices);
        return simplify_mul_pass(out, dl, false);
    }
    if coefficient.is_zero() && !out.iter().any(is_infinite) && matrices.is_empty() {
        return Ok(Expr::Num(coefficient));
    }
    out.sort_by_cached_key(|x| x.to_string());
    // Matrices multiply in their written order; a scalar scales them.
    if !matrices.is_empty() {
        let mut product = matrices.remove(0);
        for m in matrices {
            product = match matmul(&product, &m) {
                Some(p) => p,
                None => {
                    return Ok(Expr::Mul(
                        std::iter::once(Expr::Num(coefficient))
                            .chain(out)
                            .chain([product, m])
                            .collect(),
                    ));
                }
            };
        }
        if let Expr::Matrix(rows) = product {
            let mut scale = out;
            if !coefficient.is_one() {
                scale.insert(0, Expr::Num(coefficient));
            }
            let scaled = rows
                .into_iter()
                .map(|row| {
                    row.into_iter()
                        .map(|x| {
                            let mut f = scale.clone();
                            f.push(x);
                            Expr::Mul(f)
                        })
                        .collect()
                })
                .collect();
            return simplify(&Expr::Matrix(scaled), dl);
        }
        unreachable!("products of matrices are matrices");
    }
    if !coefficient.is_one() || coefficient.decimal || out.is_empty() {
        out.insert(0, Expr::Num(coefficient));
    }
    Ok(if out.len() == 1 {
        out.pop().expect("one factor")
    } else {
        Expr::Mul(out)
    })
}

fn matmul(a: &Expr, b: &Expr) -> Option<Expr> {
    let (Expr::Matrix(a), Expr::Matrix(b)) = (a, b) else {
        return None;
    };
    let inner = a.first()?.len();
    if inner != b.len() || a.iter().any(|r| r.len() != inner) {
        return None;
    }
    let cols = b.first()?.len();
    Some(Expr::Matrix(
        a.iter()
            .map(|row| {
                (0..cols)
                    .map(|j| {
                        Expr::Add(
                            row.iter()
                                .zip(b)
                                .map(|(x, brow)| Expr::Mul(vec![x.clone(), brow[j].clone()]))
                                .collect(),
                        )
                    })
                    .collect()
            })
            .collect(),
    ))
}

fn is_infinite(e: &Expr) -> bool {
    matches!(e, Expr::Const(Constant::Infinity))
}

fn simplify_pow(base: Expr, exp: Expr, dl: &Deadline) -> Result<Expr, Timeout> {
    dl.check()?;
    if let Expr::Num(e) = &exp {
        if e.is_zero() && !e.decimal {
            return Ok(Expr::int(1));
        }
        if e.is_one() && !e.decimal {
            return Ok(base);
        }
        if let Expr::Num(b) = &base
            && let Some(value) = b.pow(e)
        {
            return Ok(Expr::Num(value));
        }
        if let Expr::Num(b) = &base
            && e.value.denom() == &num_bigint::BigInt::from(2)
            && b.value.is_positive()
            && b.is_integer()
        {
            // √(k²m) = k√m: one canonical form for every way of writing a surd.
            if let Some((outer, rest)) = split_square(b, e, dl)? {
                let root = Expr::Pow(Box::new(Expr::Num(rest)), Box::new(exp.clone()));
                return simplify_mul(vec![Expr::Num(outer), root], dl);
            }
        }
        // (b^p)^q = b^(pq) when q is an integer; (xy)^n = x^n y^n.
        if e.is_integer() {
            match base {
                Expr::Pow(b, p) => {
                    let exp = simplify_mul(vec![*p, exp], dl)?;
                    return simplify_pow(*b, exp, dl);
                }
                Expr::Mul(factors) if !factors.iter().any(|f| matches!(f, Expr::Matrix(_))) => {
                    let powered = factors
                        .into_iter()
                        .map(|f| Expr::Pow(Box::new(f), Box::new(exp.clone())))
                        .collect();
                    return simplify_mul(powered, dl);
                }
                _ => {}
            }
        }
    }
    if let Expr::Num(b) = &base
        && b.is_one()
        && !b.decimal
    {
        return Ok(base);
    }
    Ok(Expr::Pow(Box::new(base), Box::new(exp)))
}

/// `n^(p/2)` with `n = k²·m` as `(k^p, m)`, when `n` has a square factor below 10⁶.
fn split_square(
    n: &Number,
    e: &Number,
    dl: &Deadline,
) -> Result<Option<(Number, Number)>, Timeout> {
    let Some(value) = n.to_i64() else {
        return Ok(None);
    };
    let mut rest = value;
    let mut k: i64 = 1;
    let mut d: i64 = 2;
    while d * d <= rest && d < 1000 {
        dl.check()?;
        while rest % (d * d) == 0 {
            rest /= d * d;
            k *= d;
        }
        d += 1;
    }
    if k == 1 {
        return Ok(None);
    }
    let Some(outer) = Number::int(k).pow(&e.mul(&Number::int(2))) else {
        return Ok(None); // too large to write out
    };
    let rest = Number {
        value: Number::int(rest).value,
        decimal: n.decimal,
    };
    Ok(Some((outer, rest)))
}

fn simplify_func(f: Func, args: Vec<Expr>, dl: &Deadline) -> Result<Expr, Timeout> {
    let nums: Option<Vec<&Number>> = args.iter().map(Expr::as_num).collect();
    if let Some(nums) = nums {
        let exact = match (f, nums.as_slice()) {
            (Func::Abs, [x]) => Some(Number {
                value: x.value.abs(),
                decimal: x.decimal,
            }),
            (Func::Factorial, [x]) => x.factorial(),
            (Func::Binom, [n, k]) => binomial(n, k),
            (Func::Floor, [x]) => Some(Number::exact(x.value.floor())),
            (Func::Ceil, [x]) => Some(Number::exact(x.value.ceil())),
            (Func::Max, xs) if !xs.is_empty() => xs
                .iter()
                .max_by(|a, b| a.value.cmp(&b.value))
                .map(|x| (*x).clone()),
            (Func::Min, xs) if !xs.is_empty() => xs
                .iter()
                .min_by(|a, b| a.value.cmp(&b.value))
                .map(|x| (*x).clone()),
            (Func::Gcd | Func::Lcm, [a, b]) if a.is_integer() && b.is_integer() => {
                use num_integer::Integer;
                let (a, b) = (a.value.numer(), b.value.numer());
                Some(Number::exact(num_rational::BigRational::from_integer(
                    if f == Func::Gcd { a.gcd(b) } else { a.lcm(b) },
                )))
            }
            (Func::Sin | Func::Tan | Func::Asin | Func::Atan | Func::Sinh | Func::Tanh, [x])
                if x.is_zero() =>
            {
                Some(Number::int(0))
            }
            (Func::Cos | Func::Cosh | Func::Exp, [x]) if x.is_zero() => Some(Number::int(1)),
            (Func::Ln, [x]) if x.is_one() => Some(Number::int(0)),
            _ => None,
        };
        if let Some(n) = exact {
            return Ok(Expr::Num(n));
        }
    }
    // log(b^k, b) = k for integer powers; exp(x) = e^x.
    if f == Func::Log
        && let [x, b] = args.as_slice()
        && let (Some(x), Some(b)) = (x.as_num(), b.as_num())
        && let Some(k) = exact_log(x, b)
    {
        return Ok(Expr::int(k));
    }
    if f == Func::Exp && args.len() == 1 {
        let arg = args.into_iter().next().expect("one argument");
        return simplify_pow(Expr::Const(Constant::E), arg, dl);
    }
    Ok(Expr::Func(f, args))
}

fn binomial(n: &Number, k: &Number) -> Option<Number> {
    let (n, k) = (n.to_i64()?, k.to_i64()?);
    if !(0..=5_000).contains(&n) {
        return None;
    }
    if k < 0 || k > n {
        return Some(Number::int(0));
    }
    let k = k.min(n - k);
    let mut acc = num_bigint::BigInt::from(1);
    for i in 0..k {
        acc = acc * (n - i) / (i + 1);
    }
    Some(Number::exact(num_rational::BigRational::from_integer(acc)))
}

fn exact_log(x: &Number, base: &Number) -> Option<i64> {
    let b = base.value.clone();
    if b <= num_rational::BigRational::zero()
        || b == num_rational::BigRational::from_integer(1.into())
    {
        return None;
    }
    let mut acc = num_rational::BigRational::from_integer(1.into());
    for k in 0..64 {
        if acc == x.value {
            return Some(k);
        }
        acc = &acc * &b;
    }
    None
}

/// The numeric value of `e` with variables from `env`, in complex arithmetic (principal
/// branches), so that `√(x²)` and `x` differ at negative `x`. NaN where undefined.
pub fn eval(e: &Expr, env: &dyn Fn(&str) -> Option<Complex64>) -> Complex64 {
    let nan = Complex64::new(f64::NAN, f64::NAN);
    match e {
        Expr::Num(n) => Complex64::new(n.to_f64(), 0.0),
        Expr::Sym(s) => env(s).unwrap_or(nan),
        Expr::Const(c) => match c {
            Constant::Pi => Complex64::new(std::f64::consts::PI, 0.0),
            Constant::E => Complex64::new(std::f64::consts::E, 0.0),
            Constant::I => Complex64::new(0.0, 1.0),
            Constant::Infinity => Complex64::new(f64::INFINITY, 0.0),
        },
        Expr::Add(xs) => xs.iter().map(|x| eval(x, env)).sum(),
        Expr::Mul(xs) => {
            let mut acc = Complex64::new(1.0, 0.0);
            for x in xs {
                let v = eval(x, env);
                acc = real_aware_mul(acc, v);
            }
            acc
        }
        Expr::Pow(b, p) => {
            let base = eval(b, env);
            let exp = eval(p, env);
            power(base, exp)
        }
        Expr::Func(f, args) => {
            let vals: Vec<Complex64> = args.iter().map(|a| eval(a, env)).collect();
            eval_func(*f, &vals)
        }
        Expr::Apply(name, args) => {
            // An unknown function is a fixed, arbitrary smooth function of its arguments:
            // f(x) + 1 equals 1 + f(x), f(x) differs from f(y) and from g(x).
            let seed = name.bytes().fold(0x9E37_79B9u64, |h, b| {
                h.wrapping_mul(31).wrapping_add(u64::from(b))
            });
            let a = 0.5 + (seed % 97) as f64 / 97.0;
            let c = (seed / 97 % 89) as f64 / 89.0;
            let mut acc = Complex64::new(c, 0.0);
            for (i, arg) in args.iter().enumerate() {
                let v = eval(arg, env);
                acc += (v * (a + i as f64) + c).sin() + v * 0.1 * (i + 1) as f64;
            }
            acc
        }
        Expr::PlusMinus(..) | Expr::Text(_) | Expr::Matrix(_) | Expr::Big { .. } => nan,
        Expr::Percent(x) => eval(x, env) / 100.0,
    }
}

/// Products where one side is an exact real infinity and the other a nonzero real stay real.
fn real_aware_mul(a: Complex64, b: Complex64) -> Complex64 {
    if a.im == 0.0 && b.im == 0.0 {
        Complex64::new(a.re * b.re, 0.0)
    } else {
        a * b
    }
}

fn power(base: Complex64, exp: Complex64) -> Complex64 {
    if exp.im == 0.0 && exp.re.fract() == 0.0 && exp.re.abs() <= 64.0 {
        // Integer powers by repeated multiplication: exact for reals of any sign.
        if base.im == 0.0 {
            return Complex64::new(base.re.powi(exp.re as i32), 0.0);
        }
        return base.powi(exp.re as i32);
    }
    if base.im == 0.0 && exp.im == 0.0 {
        if base.re >= 0.0 {
            return Complex64::new(base.re.powf(exp.re), 0.0);
        }
        // Odd roots of negative reals are real (∛(−8) = −2), as in school maths.
        let recip = 1.0 / exp.re;
        if (recip - recip.round()).abs() < 1e-12 && (recip.round() as i64) % 2 != 0 {
            return Complex64::new(-(-base.re).powf(exp.re), 0.0);
        }
    }
    if base == Complex64::zero() {
        return if exp.re > 0.0 {
            Complex64::zero()
        } else {
            Complex64::new(f64::NAN, f64::NAN)
        };
    }
    base.powc(exp)
}

fn eval_func(f: Func, v: &[Complex64]) -> Complex64 {
    let nan = Complex64::new(f64::NAN, f64::NAN);
    let one = |g: fn(Complex64) -> Complex64| if v.len() == 1 { g(v[0]) } else { nan };
    let real = |x: Complex64| (x.im.abs() < 1e-12).then_some(x.re);
    match f {
        Func::Sin => one(|x| x.sin()),
        Func::Cos => one(|x| x.cos()),
        Func::Tan => one(|x| x.tan()),
        Func::Sec => one(|x| x.cos().inv()),
        Func::Csc => one(|x| x.sin().inv()),
        Func::Cot => one(|x| x.tan().inv()),
        Func::Asin => one(|x| x.asin()),
        Func::Acos => one(|x| x.acos()),
        Func::Atan => one(|x| x.atan()),
        Func::Sinh => one(|x| x.sinh()),
        Func::Cosh => one(|x| x.cosh()),
        Func::Tanh => one(|x| x.tanh()),
        Func::Ln => one(|x| x.ln()),
        Func::Exp => one(|x| x.exp()),
        Func::Abs => one(|x| Complex64::new(x.norm(), 0.0)),
        Func::Log => match v {
            [x] => x.log10(),
            [x, b] => x.ln() / b.ln(),
            _ => nan,
        },
        Func::Floor | Func::Ceil => match v {
            [x] => real(*x).map_or(nan, |r| {
                Complex64::new(
                    if f == Func::Floor {
                        r.floor()
                    } else {
                        r.ceil()
                    },
                    0.0,
                )
            }),
            _ => nan,
        },
        Func::Factorial => match v {
            [x] => real(*x).map_or(nan, |r| Complex64::new(gamma(r + 1.0), 0.0)),
            _ => nan,
        },
        Func::Binom => match v {
            [n, k] => match (real(*n), real(*k)) {
                (Some(n), Some(k)) => {
                    Complex64::new(gamma(n + 1.0) / (gamma(k + 1.0) * gamma(n - k + 1.0)), 0.0)
                }
                _ => nan,
            },
            _ => nan,
        },
        Func::Max | Func::Min => {
            let reals: Option<Vec<f64>> = v.iter().map(|x| real(*x)).collect();
            match reals {
                Some(r) if !r.is_empty() => Complex64::new(
                    if f == Func::Max {
                        r.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                    } else {
                        r.iter().copied().fold(f64::INFINITY, f64::min)
                    },
                    0.0,
                ),
                _ => nan,
            }
        }
        Func::Gcd | Func::Lcm => nan,
    }
}

/// Γ(x) by the Lanczos approximation (g = 7), for factorials of non-integers.
fn gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return std::f64::consts::PI / ((std::f64::consts::PI * x).sin() * gamma(1.0 - x));
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    (2.0 * std::f64::consts::PI).sqrt() * t.powf(x + 0.5) * (-t).exp() * a
}

fn write_list(f: &mut fmt::Formatter<'_>, items: &[Expr], sep: &str) -> fmt::Result {
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(sep)?;
        }
        write_operand(f, x)?;
    }
    Ok(())
}

/// `name(a, b)`.
fn write_call(f: &mut fmt::Formatter<'_>, name: &str, args: &[Expr]) -> fmt::Result {
    write!(f, "{name}(")?;
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{a}")?;
    }
    f.write_str(")")
}

fn write_operand(f: &mut fmt::Formatter<'_>, e: &Expr) -> fmt::Result {
    match e {
        Expr::Add(_) | Expr::PlusMinus(..) => write!(f, "({e})"),
        Expr::Num(n) if n.value.is_negative() || !n.value.is_integer() && !n.decimal => {
            write!(f, "({e})")
        }
        _ => write!(f, "{e}"),
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Num(n) => write!(f, "{n}"),
            Expr::Sym(s) => f.write_str(s),
            Expr::Const(c) => f.write_str(match c {
                Constant::Pi => "pi",
                Constant::E => "E",
                Constant::I => "I",
                Constant::Infinity => "oo",
            }),
            Expr::Add(xs) => {
                for (i, x) in xs.iter().enumerate() {
                    // `a + -b` is written `a - b`.
                    let negated = match x {
                        Expr::Num(n) if i > 0 && n.value.is_negative() => Some(Expr::Num(n.neg())),
                        Expr::Mul(factors) if i > 0 => match factors.as_slice() {
                            [Expr::Num(n), rest @ ..]
                                if n.value.is_negative() && !rest.is_empty() =>
                            {
                                let positive = n.neg();
                                let mut kept = rest.to_vec();
                                if !positive.is_one() || positive.decimal {
                                    kept.insert(0, Expr::Num(positive));
                                }
                                Some(if kept.len() == 1 {
                                    kept.remove(0)
                                } else {
                                    Expr::Mul(kept)
                                })
                            }
                            _ => None,
                        },
                        _ => None,
                    };
                    let (sign, term) = match &negated {
                        Some(t) => (" - ", t),
                        None => (" + ", x),
                    };
                    if i > 0 {
                        f.write_str(sign)?;
                    }
                    match term {
                        Expr::PlusMinus(..) | Expr::Add(_) => write!(f, "({term})")?,
                        _ => write!(f, "{term}")?,
                    }
                }
                Ok(())
            }
            Expr::Mul(xs) => {
                if let [Expr::Num(n), rest @ ..] = xs.as_slice()
                    && n.to_i64() == Some(-1)
                    && !n.decimal
                    && !rest.is_empty()
                {
                    f.write_str("-")?;
                    return write_list(f, rest, "*");
                }
                write_list(f, xs, "*")
            }
            Expr::Pow(b, e) => {
                match b.as_ref() {
                    Expr::Sym(_) | Expr::Const(_) | Expr::Func(..) | Expr::Apply(..) => {
                        write!(f, "{b}")?
                    }
                    Expr::Num(n) if n.value.is_integer() && !n.value.is_negative() => {
                        write!(f, "{b}")?
                    }
                    _ => write!(f, "({b})")?,
                }
                match e.as_ref() {
                    Expr::Num(n) if n.value.is_integer() && !n.value.is_negative() => {
                        write!(f, "^{e}")
                    }
                    Expr::Sym(_) | Expr::Const(_) => write!(f, "^{e}"),
                    _ => write!(f, "^({e})"),
                }
            }
            Expr::Func(func, args) => write_call(f, func.name(), args),
            Expr::Apply(name, args) => write_call(f, name, args),
            Expr::PlusMinus(a, b) => {
                if a.as_num().is_some_and(Number::is_zero) {
                    write!(f, "±")?;
                } else {
                    write!(f, "{a} ± ")?;
                }
                write_operand(f, b)
            }
            Expr::Percent(x) => {
                write_operand(f, x)?;
                f.write_str("%")
            }
            Expr::Text(t) => write!(f, "\"{t}\""),
            Expr::Matrix(rows) => {
                f.write_str("Matrix([")?;
                for (i, row) in rows.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str("[")?;
                    for (j, x) in row.iter().enumerate() {
                        if j > 0 {
                            f.write_str(", ")?;
                        }
                        write!(f, "{x}")?;
                    }
                    f.write_str("]")?;
                }
                f.write_str("])")
            }
            Expr::Big {
                op,
                var,
                lo,
                hi,
                body,
            } => write!(
                f,
                "{}({body}, ({var}, {lo}, {hi}))",
                match op {
                    BigOp::Sum => "Sum",
                    BigOp::Product => "Product",
                }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(s: &str) -> Expr {
        Expr::Sym(s.into())
    }

    fn simp(e: Expr) -> Expr {
        simplify(&e, &Deadline::none()).unwrap()
    }

    #[test]
    fn folds_numbers_and_collects_like_terms() {
        // x/7 + 2/7 and (x + 2)/7 share no canonical form, but x + x = 2x and 3·(1/3) = 1.
        let e = Expr::Add(vec![sym("x"), sym("x"), Expr::int(3), Expr::int(-3)]);
        assert_eq!(simp(e).to_string(), "2*x");
        let e = Expr::Mul(vec![
            Expr::int(3),
            Expr::Pow(Box::new(Expr::int(3)), Box::new(Expr::int(-1))),
        ]);
        assert_eq!(simp(e), Expr::int(1));
        let e = Expr::Mul(vec![sym("y"), sym("x"), sym("x")]);
        assert_eq!(simp(e).to_string(), "x^2*y");
    }

    #[test]
    fn surds_have_one_form() {
        let sqrt = |n| {
            Expr::Pow(
                Box::new(Expr::int(n)),
                Box::new(Expr::Num(Number::ratio(1, 2))),
            )
        };
        assert_eq!(
            simp(sqrt(117)),
            simp(Expr::Mul(vec![Expr::int(3), sqrt(13)]))
        );
        assert_eq!(simp(sqrt(16)), Expr::int(4));
    }

    #[test]
    fn matrices_add_and_multiply_in_order() {
        let m = |a, b, c, d| {
            Expr::Matrix(vec![
                vec![Expr::int(a), Expr::int(b)],
                vec![Expr::int(c), Expr::int(d)],
            ])
        };
        assert_eq!(
            simp(Expr::Add(vec![m(1, 2, 3, 4), m(5, 6, 7, 8)])),
            m(6, 8, 10, 12)
        );
        assert_eq!(
            simp(Expr::Mul(vec![m(1, 2, 3, 4), m(0, 1, 1, 0)])),
            m(2, 1, 4, 3)
        );
        assert_eq!(
            simp(Expr::Mul(vec![m(0, 1, 1, 0), m(1, 2, 3, 4)])),
            m(3, 4, 1, 2)
        );
    }

    #[test]
    fn plus_minus_expands_to_every_sign() {
        let e = Expr::PlusMinus(Box::new(Expr::int(1)), Box::new(sym("s")));
        let values: Vec<String> = e
            .expand_plus_minus()
            .iter()
            .map(|x| simp(x.clone()).to_string())
            .collect();
        assert_eq!(values, ["1 + s", "1 - s"]);
    }

    #[test]
    fn evaluates_in_complex_arithmetic() {
        let x = sym("x");
        let sqrt_x2 = Expr::Pow(
            Box::new(Expr::Pow(Box::new(x.clone()), Box::new(Expr::int(2)))),
            Box::new(Expr::Num(Number::ratio(1, 2))),
        );
        let at = |v: f64| move |_: &str| Some(Complex64::new(v, 0.0));
        assert!((eval(&sqrt_x2, &at(-2.0)).re - 2.0).abs() < 1e-12);
        let cbrt = Expr::Pow(
            Box::new(Expr::int(-8)),
            Box::new(Expr::Num(Number::ratio(1, 3))),
        );
        assert!((eval(&cbrt, &at(0.0)).re + 2.0).abs() < 1e-12);
        assert!((gamma(5.0) - 24.0).abs() < 1e-9);
    }

    #[test]
    fn only_symbols_recognises_assignment_targets() {
        assert!(sym("x").is_only_symbols());
        assert!(Expr::quotient(sym("N"), sym("B")).is_only_symbols());
        assert!(Expr::Apply("f".into(), vec![sym("x")]).is_only_symbols());
        assert!(
            !Expr::Add(vec![sym("a"), Expr::Mul(vec![Expr::int(3), sym("z")])]).is_only_symbols()
        );
        assert!(!Expr::int(7).is_only_symbols());
    }
}
