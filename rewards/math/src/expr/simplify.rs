//! The canonical form: sums and products flattened, numbers folded exactly, like terms and
//! like factors collected, operands in a fixed order.

use std::collections::BTreeMap;

use num_traits::{Signed, Zero};

use super::{BigOp, Constant, Expr, Func};
use crate::deadline::{Deadline, Timeout};
use crate::number::Number;

/// The canonical form of `e`.
pub(crate) fn simplify(e: &Expr, dl: &Deadline) -> Result<Expr, Timeout> {
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
