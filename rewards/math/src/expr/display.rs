//! Writing an expression back as plain maths.

use std::fmt;

use num_traits::Signed;

use super::{BigOp, Constant, Expr};
use crate::number::Number;

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
