//! Expressions: the tree both answers are parsed into, its canonical form, and its value.
//!
//! `simplify` brings an expression to a canonical form: sums and products flattened, numbers
//! folded exactly, like terms and like factors collected, operands in a fixed order. Two
//! expressions with the same canonical form are equal; the comparison falls back to
//! evaluation (`eval`) for the rest.

use crate::number::Number;

mod display;
mod eval;
mod simplify;
#[cfg(test)]
mod tests;

pub(crate) use eval::eval;
pub(crate) use simplify::simplify;

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
#[allow(missing_docs, reason = "the variants are the functions' own names")]
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
