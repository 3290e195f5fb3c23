//! A parsed answer: an expression, or a structure of them (tuple, interval, set, union,
//! relation chain).

use std::fmt;

use crate::expr::Expr;

/// A relation between two sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelOp {
    /// `=`
    Eq,
    /// `≠`
    Ne,
    /// `<`
    Lt,
    /// `≤`
    Le,
    /// `>`
    Gt,
    /// `≥`
    Ge,
    /// `∈`
    In,
}

impl RelOp {
    /// The relation read from right to left (`a < b` is `b > a`).
    pub fn flipped(self) -> Self {
        match self {
            RelOp::Lt => RelOp::Gt,
            RelOp::Le => RelOp::Ge,
            RelOp::Gt => RelOp::Lt,
            RelOp::Ge => RelOp::Le,
            other => other,
        }
    }

    /// Whether it is `<`, `≤`, `>` or `≥`.
    pub fn is_order(self) -> bool {
        matches!(self, RelOp::Lt | RelOp::Le | RelOp::Gt | RelOp::Ge)
    }

    fn symbol(self) -> &'static str {
        match self {
            RelOp::Eq => "=",
            RelOp::Ne => "!=",
            RelOp::Lt => "<",
            RelOp::Le => "<=",
            RelOp::Gt => ">",
            RelOp::Ge => ">=",
            RelOp::In => "in",
        }
    }
}

/// A parsed answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Math {
    /// A single expression.
    Expr(Expr),
    /// An ordered tuple: `(6, 31, -1)`, `(0;0;0)`.
    Tuple(Vec<Math>),
    /// An interval. `(a, b)` is also a pair: `pair` marks that reading.
    Interval {
        /// Left end.
        lo: Expr,
        /// Right end.
        hi: Expr,
        /// `(` rather than `[`.
        lo_open: bool,
        /// `)` rather than `]`.
        hi_open: bool,
        /// Written `(a, b)`: an open interval or an ordered pair.
        pair: bool,
    },
    /// A set, `\{1, 2\}`, or a bare list of answers `1, 2`. Order does not matter.
    Set {
        /// The elements, in written order.
        items: Vec<Math>,
        /// Written with set braces (a bare list compares to a tuple in order).
        braces: bool,
    },
    /// A union of sets or intervals.
    Union(Vec<Math>),
    /// A chain `t0 op0 t1 op1 t2 ...`.
    Relation {
        /// The sides, one more than the relations.
        terms: Vec<Math>,
        /// The relations between consecutive sides.
        ops: Vec<RelOp>,
    },
}

impl Math {
    /// The expression, if this is one.
    pub fn as_expr(&self) -> Option<&Expr> {
        match self {
            Math::Expr(e) => Some(e),
            _ => None,
        }
    }

    /// Whether this is a relation chain.
    pub fn is_relation(&self) -> bool {
        matches!(self, Math::Relation { .. })
    }

    /// Whether this is a chain of equations only (`x ∈ S` counts as one: it says what `x` is).
    pub fn is_equation(&self) -> bool {
        matches!(self, Math::Relation { ops, .. } if ops.iter().all(|op| matches!(op, RelOp::Eq | RelOp::In)))
    }

    /// Whether this is a set-like value: interval, set, union.
    pub fn is_set_like(&self) -> bool {
        matches!(
            self,
            Math::Interval { .. } | Math::Set { .. } | Math::Union(_)
        )
    }

    /// Calls `f` on every expression inside.
    pub fn for_each_expr(&self, f: &mut dyn FnMut(&Expr)) {
        match self {
            Math::Expr(e) => f(e),
            Math::Tuple(items) | Math::Union(items) => {
                items.iter().for_each(|m| m.for_each_expr(f));
            }
            Math::Set { items, .. } => items.iter().for_each(|m| m.for_each_expr(f)),
            Math::Interval { lo, hi, .. } => {
                f(lo);
                f(hi);
            }
            Math::Relation { terms, .. } => terms.iter().for_each(|m| m.for_each_expr(f)),
        }
    }

    /// The same structure with every expression mapped by `f`.
    pub fn map_exprs<E>(&self, f: &mut dyn FnMut(&Expr) -> Result<Expr, E>) -> Result<Math, E> {
        Ok(match self {
            Math::Expr(e) => Math::Expr(f(e)?),
            Math::Tuple(items) => Math::Tuple(
                items
                    .iter()
                    .map(|m| m.map_exprs(f))
                    .collect::<Result<_, _>>()?,
            ),
            Math::Union(items) => Math::Union(
                items
                    .iter()
                    .map(|m| m.map_exprs(f))
                    .collect::<Result<_, _>>()?,
            ),
            Math::Set { items, braces } => Math::Set {
                items: items
                    .iter()
                    .map(|m| m.map_exprs(f))
                    .collect::<Result<_, _>>()?,
                braces: *braces,
            },
            Math::Interval {
                lo,
                hi,
                lo_open,
                hi_open,
                pair,
            } => Math::Interval {
                lo: f(lo)?,
                hi: f(hi)?,
                lo_open: *lo_open,
                hi_open: *hi_open,
                pair: *pair,
            },
            Math::Relation { terms, ops } => Math::Relation {
                terms: terms
                    .iter()
                    .map(|m| m.map_exprs(f))
                    .collect::<Result<_, _>>()?,
                ops: ops.clone(),
            },
        })
    }

    /// The free variables of every expression inside, sorted.
    pub fn free_symbols(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.for_each_expr(&mut |e| out.extend(e.free_symbols()));
        out.sort();
        out.dedup();
        out
    }
}

fn write_items(f: &mut fmt::Formatter<'_>, items: &[Math], sep: &str) -> fmt::Result {
    for (i, m) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(sep)?;
        }
        write!(f, "{m}")?;
    }
    Ok(())
}

impl fmt::Display for Math {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Math::Expr(e) => write!(f, "{e}"),
            Math::Tuple(items) => {
                f.write_str("(")?;
                write_items(f, items, ", ")?;
                f.write_str(")")
            }
            Math::Interval {
                lo,
                hi,
                lo_open,
                hi_open,
                ..
            } => write!(
                f,
                "{}{lo}, {hi}{}",
                if *lo_open { "(" } else { "[" },
                if *hi_open { ")" } else { "]" }
            ),
            Math::Set { items, .. } => {
                f.write_str("{")?;
                write_items(f, items, ", ")?;
                f.write_str("}")
            }
            Math::Union(items) => write_items(f, items, " U "),
            Math::Relation { terms, ops } => {
                for (i, t) in terms.iter().enumerate() {
                    if i > 0 {
                        write!(f, " {} ", ops[i - 1].symbol())?;
                    }
                    write!(f, "{t}")?;
                }
                Ok(())
            }
        }
    }
}
