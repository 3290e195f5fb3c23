//! Deciding whether a predicted answer equals the gold one.
//!
//! In order: assignments are unwrapped (`x = 3` against `3`); a relation is compared to a set
//! by membership; equal canonical forms are equal; relations compare link by link (same
//! relation with equal or proportional sides); sets, tuples and intervals compare element by
//! element (sets in any order); numbers compare exactly, or after rounding when one side is
//! a decimal; other expressions compare by value, at random points when they have variables.

use num_complex::Complex64;

use crate::Options;
use crate::answer::{Math, RelOp};
use crate::deadline::{Deadline, Timeout};
use crate::expr::{Constant, Expr, eval, simplify};
use num_traits::ToPrimitive;

use crate::number::{Number, round_f64};

/// How many random points an expression with variables is evaluated at.
const TRIALS: usize = 8;
/// Relative tolerance of comparisons by value.
const TOLERANCE: f64 = 1e-9;

/// Canonical form of an answer: expressions simplified, `±` expanded into sets, duplicate
/// set elements dropped.
pub(crate) fn prepare(m: &Math, dl: &Deadline) -> Result<Math, Timeout> {
    dl.check()?;
    Ok(match m {
        Math::Expr(e) => {
            let branches = e.expand_plus_minus();
            if branches.len() == 1 {
                Math::Expr(simplify(e, dl)?)
            } else {
                let items = branches
                    .iter()
                    .map(|b| simplify(b, dl).map(Math::Expr))
                    .collect::<Result<Vec<_>, _>>()?;
                Math::Set {
                    items: dedup(items),
                    braces: false,
                }
            }
        }
        Math::Set { items, braces } => {
            let mut out = Vec::new();
            for item in items {
                let from_plus_minus =
                    matches!(item, Math::Expr(e) if e.expand_plus_minus().len() > 1);
                match prepare(item, dl)? {
                    Math::Set { items: inner, .. } if from_plus_minus => out.extend(inner),
                    other => out.push(other),
                }
            }
            Math::Set {
                items: dedup(out),
                braces: *braces,
            }
        }
        Math::Tuple(items) => Math::Tuple(
            items
                .iter()
                .map(|x| prepare(x, dl))
                .collect::<Result<_, _>>()?,
        ),
        Math::Union(items) => Math::Union(
            items
                .iter()
                .map(|x| prepare(x, dl))
                .collect::<Result<_, _>>()?,
        ),
        Math::Relation { terms, ops } => Math::Relation {
            terms: terms
                .iter()
                .map(|x| prepare(x, dl))
                .collect::<Result<_, _>>()?,
            ops: ops.clone(),
        },
        Math::Interval {
            lo,
            hi,
            lo_open,
            hi_open,
            pair,
        } => Math::Interval {
            lo: simplify(lo, dl)?,
            hi: simplify(hi, dl)?,
            lo_open: *lo_open,
            hi_open: *hi_open,
            pair: *pair,
        },
    })
}

fn dedup(items: Vec<Math>) -> Vec<Math> {
    let mut out: Vec<Math> = Vec::with_capacity(items.len());
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// Compares prepared answers.
pub(crate) struct Comparer<'a> {
    options: &'a Options,
    dl: &'a Deadline,
}

impl<'a> Comparer<'a> {
    /// A comparer with these options and deadline.
    pub(crate) fn new(options: &'a Options, dl: &'a Deadline) -> Self {
        Self { options, dl }
    }

    /// Whether `pred` answers `gold` (not symmetric: the gold answer's form leads).
    pub(crate) fn equal(&self, gold: &Math, pred: &Math) -> Result<bool, Timeout> {
        self.dl.check()?;
        let renamed;
        let pred = if self.options.strict {
            pred
        } else {
            renamed = rename_like(gold, pred);
            &renamed
        };
        let gold_assignment = is_assignment(gold);
        let mut gold = if gold_assignment {
            truncate_chain(gold)
        } else {
            gold.clone()
        };
        let mut pred = if is_assignment(pred) {
            truncate_chain(pred)
        } else {
            pred.clone()
        };
        // The gold answer's form leads: `1` against `x = 1` compares 1 with 1, but `2x + z = 1`
        // against `1` does not become 1 against 1.
        if pred.is_equation() && !gold.is_equation() {
            pred = last_side(pred);
        } else if gold_assignment && !pred.is_equation() {
            gold = last_side(gold);
        }
        if gold.is_relation() && pred.is_set_like() {
            return self.relation_vs_set(&gold, &pred);
        }
        if self.options.allow_set_relation_comp && pred.is_relation() && gold.is_set_like() {
            return self.relation_vs_set(&pred, &gold);
        }
        if gold == pred {
            return Ok(true);
        }
        match (&gold, &pred) {
            (Math::Relation { .. }, Math::Relation { .. }) => self.relations(&gold, &pred),
            (Math::Relation { .. }, _) | (_, Math::Relation { .. }) => Ok(false),
            (Math::Expr(g), Math::Expr(p)) => self.exprs(g, p),
            _ => self.sets(&gold, &pred),
        }
    }

    // ---- expressions ----

    /// Whether two canonical expressions are equal.
    pub(crate) fn exprs(&self, g: &Expr, p: &Expr) -> Result<bool, Timeout> {
        self.dl.check()?;
        if g == p {
            return Ok(true);
        }
        match (g, p) {
            (Expr::Percent(a), Expr::Percent(b)) => return self.exprs(a, b),
            (Expr::Percent(a), other) | (other, Expr::Percent(a)) => {
                // 28% is 0.28, and is 28 when the other side says 28.
                let hundredth = simplify(&Expr::quotient((**a).clone(), Expr::int(100)), self.dl)?;
                let (left, right) = if matches!(g, Expr::Percent(_)) {
                    ((**a).clone(), other.clone())
                } else {
                    (other.clone(), (**a).clone())
                };
                if self.exprs(&left, &right)? {
                    return Ok(true);
                }
                return if matches!(g, Expr::Percent(_)) {
                    self.exprs(&hundredth, other)
                } else {
                    self.exprs(other, &hundredth)
                };
            }
            (Expr::Text(a), Expr::Text(b)) => return Ok(a == b),
            (Expr::Text(t), other) | (other, Expr::Text(t)) => return Ok(text_matches(t, other)),
            (Expr::Matrix(a), Expr::Matrix(b)) => {
                if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.len() != y.len()) {
                    return Ok(false);
                }
                for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
                    if !self.exprs(x, y)? {
                        return Ok(false);
                    }
                }
                return Ok(true);
            }
            (Expr::Matrix(_), _) | (_, Expr::Matrix(_)) => return Ok(false),
            _ => {}
        }
        let mut vars = g.free_symbols();
        vars.extend(p.free_symbols());
        vars.sort();
        vars.dedup();
        if vars.is_empty() {
            return Ok(self.constants(g, p));
        }
        self.at_random_points(g, p, &vars)
    }

    /// Two expressions without variables. When a side is a decimal both are rounded to
    /// `float_rounding` places, or to as many as a decimal gold answer is written with
    /// (`0.0000672` is not `0.0000673`).
    fn constants(&self, g: &Expr, p: &Expr) -> bool {
        let gold_places = match g {
            Expr::Num(n) if n.decimal => n.exact_places().unwrap_or(0),
            _ => 0,
        };
        let digits = self.options.float_rounding.max(gold_places.min(15));
        if let (Expr::Num(a), Expr::Num(b)) = (g, p) {
            return if a.decimal || b.decimal {
                a.rounded(digits) == b.rounded(digits)
            } else {
                a.value == b.value
            };
        }
        let (a, b) = (value(g), value(p));
        if !(finite(a) && finite(b)) {
            return false;
        }
        if g.is_decimal_atom() || p.is_decimal_atom() {
            // A rounded answer against an exact one: compare at the answer's precision.
            if a.im.abs() > 1e-12 || b.im.abs() > 1e-12 {
                return false;
            }
            let round = |e: &Expr, v: f64| match e {
                Expr::Num(n) => n.rounded(digits).to_f64().unwrap_or(f64::NAN),
                _ => round_f64(v, digits),
            };
            return round(g, a.re) == round(p, b.re);
        }
        close(a, b)
    }

    fn at_random_points(&self, g: &Expr, p: &Expr, vars: &[String]) -> Result<bool, Timeout> {
        let mut agreed = 0;
        for trial in 0..TRIALS {
            self.dl.check()?;
            let env = point(vars, trial);
            let lookup = |name: &str| vars.iter().position(|v| v == name).map(|i| env[i]);
            let (a, b) = (eval(g, &lookup), eval(p, &lookup));
            match (finite(a), finite(b)) {
                (true, true) => {
                    if !close(a, b) {
                        return Ok(false);
                    }
                    agreed += 1;
                }
                (false, false) => {}
                _ => return Ok(false),
            }
        }
        Ok(agreed >= 3)
    }

    // ---- relations ----

    fn relations(&self, gold: &Math, pred: &Math) -> Result<bool, Timeout> {
        let (
            Math::Relation {
                terms: gt,
                ops: gops,
            },
            Math::Relation {
                terms: pt,
                ops: pops,
            },
        ) = (gold, pred)
        else {
            return Ok(false);
        };
        if gops.len() != pops.len() {
            return Ok(false);
        }
        for (i, (gop, pop)) in gops.iter().zip(pops).enumerate() {
            if !self.link(&gt[i], *gop, &gt[i + 1], &pt[i], *pop, &pt[i + 1])? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// One link `gl gop gr` against `pl pop pr`.
    fn link(
        &self,
        gl: &Math,
        gop: RelOp,
        gr: &Math,
        pl: &Math,
        pop: RelOp,
        pr: &Math,
    ) -> Result<bool, Timeout> {
        let same_sides = |a: &Math, b: &Math, c: &Math, d: &Math| -> Result<bool, Timeout> {
            Ok(self.equal(a, c)? && self.equal(b, d)?)
        };
        let (Math::Expr(gl), Math::Expr(gr), Math::Expr(pl), Math::Expr(pr)) = (gl, gr, pl, pr)
        else {
            // Sets, tuples: the same relation between equal sides.
            return Ok(if gop == pop {
                same_sides(gl, gr, pl, pr)?
            } else if gop == pop.flipped() {
                same_sides(gl, gr, pr, pl)?
            } else {
                false
            });
        };
        if gop == RelOp::In || pop == RelOp::In {
            return Ok(false);
        }
        let dg = simplify(&Expr::difference(gl.clone(), gr.clone()), self.dl)?;
        let dp = simplify(&Expr::difference(pl.clone(), pr.clone()), self.dl)?;
        if gop == pop && self.exprs(&dg, &dp)? {
            return Ok(true);
        }
        if gop == pop.flipped() && gop != pop {
            let flipped = simplify(&Expr::negated(dp.clone()), self.dl)?;
            if self.exprs(&dg, &flipped)? {
                return Ok(true);
            }
        }
        // Proportional sides: 2x + 4y - 3 = 0 is y = -x/2 + 3/4; -x > -1 is x < 1.
        let mut vars = dg.free_symbols();
        vars.extend(dp.free_symbols());
        vars.sort();
        vars.dedup();
        if vars.is_empty() {
            return Ok(false);
        }
        let Some(ratio) = self.constant_ratio(&dg, &dp, &vars)? else {
            return Ok(false);
        };
        Ok(match (gop, pop) {
            (RelOp::Eq, RelOp::Eq) | (RelOp::Ne, RelOp::Ne) => true,
            (g, p) if g.is_order() && g == p => ratio > 0.0,
            (g, p) if g.is_order() && g == p.flipped() => ratio < 0.0,
            _ => false,
        })
    }

    /// `a / b` when it is the same nonzero real number at every random point.
    fn constant_ratio(&self, a: &Expr, b: &Expr, vars: &[String]) -> Result<Option<f64>, Timeout> {
        let mut ratio: Option<Complex64> = None;
        let mut agreed = 0;
        for trial in 0..TRIALS {
            self.dl.check()?;
            let env = point(vars, trial);
            let lookup = |name: &str| vars.iter().position(|v| v == name).map(|i| env[i]);
            let (x, y) = (eval(a, &lookup), eval(b, &lookup));
            if !finite(x) || !finite(y) || y.norm() < 1e-12 || x.norm() < 1e-12 {
                continue;
            }
            let r = x / y;
            match ratio {
                None => ratio = Some(r),
                Some(first) if close(first, r) => {}
                Some(_) => return Ok(None),
            }
            agreed += 1;
        }
        Ok(match ratio {
            Some(r) if agreed >= 3 && r.im.abs() < 1e-9 * r.norm() => Some(r.re),
            _ => None,
        })
    }

    /// A relation in one variable against a set: the same members at every probe point.
    fn relation_vs_set(&self, relation: &Math, set: &Math) -> Result<bool, Timeout> {
        let Math::Relation { terms, ops } = relation else {
            return Ok(false);
        };
        let Some(terms) = terms
            .iter()
            .map(|t| t.as_expr().map(unwrap_applications))
            .collect::<Option<Vec<Expr>>>()
        else {
            return Ok(false);
        };
        if ops.contains(&RelOp::In) {
            return Ok(false);
        }
        let mut vars: Vec<String> = terms.iter().flat_map(Expr::free_symbols).collect();
        vars.sort();
        vars.dedup();
        let [var] = vars.as_slice() else {
            return Ok(false);
        };
        // Probe at the set's ends, the relation's numbers, just beside each, between them,
        // and far out.
        let mut critical: Vec<f64> = vec![0.0];
        set_ends(set, &mut critical);
        for t in &terms {
            t.walk(&mut |e| {
                if let Expr::Num(n) = e {
                    let v = n.to_f64();
                    critical.push(v);
                    critical.push(-v);
                }
            });
        }
        critical.retain(|v| v.is_finite());
        critical.sort_by(f64::total_cmp);
        critical.dedup();
        let mut probes = Vec::new();
        for (k, c) in critical.iter().enumerate() {
            let delta = 1e-7 * c.abs().max(1.0);
            probes.extend([*c, c - delta, c + delta]);
            if let Some(next) = critical.get(k + 1) {
                probes.push((c + next) / 2.0);
            }
        }
        let lowest = critical.first().copied().unwrap_or(0.0);
        let highest = critical.last().copied().unwrap_or(0.0);
        probes.extend([lowest - 1.0, highest + 1.0, -1e6, 1e6]);
        for t in probes {
            self.dl.check()?;
            let lookup = |name: &str| (name == var).then_some(Complex64::new(t, 0.0));
            let values: Vec<Complex64> = terms.iter().map(|e| eval(e, &lookup)).collect();
            let holds = ops
                .iter()
                .enumerate()
                .all(|(i, op)| holds(*op, values[i], values[i + 1]));
            if holds != contains(set, t) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    // ---- sets, tuples, intervals ----

    fn sets(&self, gold: &Math, pred: &Math) -> Result<bool, Timeout> {
        let singleton = |m: &Math| match m {
            Math::Expr(_) => Math::Set {
                items: vec![m.clone()],
                braces: false,
            },
            other => other.clone(),
        };
        let (gold, pred) = (singleton(gold), singleton(pred));
        match (&gold, &pred) {
            (
                Math::Interval {
                    lo: gl,
                    hi: gh,
                    lo_open: glo,
                    hi_open: gho,
                    ..
                },
                Math::Interval {
                    lo: pl,
                    hi: ph,
                    lo_open: plo,
                    hi_open: pho,
                    ..
                },
            ) => Ok(glo == plo && gho == pho && self.exprs(gl, pl)? && self.exprs(gh, ph)?),
            (
                Math::Set {
                    items: g,
                    braces: gb,
                },
                Math::Set {
                    items: p,
                    braces: pb,
                },
            ) => {
                if g.len() != p.len() {
                    return Ok(false);
                }
                // A bare list against a braced set: still a set, order free.
                let _ = (gb, pb);
                self.matching(g, p)
            }
            (Math::Tuple(g), Math::Tuple(p)) => self.in_order(g, p),
            (Math::Tuple(t), Math::Set { items, .. })
            | (Math::Set { items, .. }, Math::Tuple(t)) => {
                let (g, p) = if matches!(gold, Math::Tuple(_)) {
                    (t, items)
                } else {
                    (items, t)
                };
                self.in_order(g, p)
            }
            (
                Math::Interval {
                    pair: true, lo, hi, ..
                },
                other @ (Math::Tuple(_) | Math::Set { .. }),
            )
            | (
                other @ (Math::Tuple(_) | Math::Set { .. }),
                Math::Interval {
                    pair: true, lo, hi, ..
                },
            ) => {
                let ends = vec![Math::Expr(lo.clone()), Math::Expr(hi.clone())];
                let items = match other {
                    Math::Tuple(items) | Math::Set { items, .. } => items,
                    _ => unreachable!("matched above"),
                };
                if matches!(gold, Math::Interval { .. }) {
                    self.in_order(&ends, items)
                } else {
                    self.in_order(items, &ends)
                }
            }
            (Math::Union(g), Math::Union(p)) if g.len() == p.len() => {
                if self.matching(g, p)? {
                    return Ok(true);
                }
                Ok(self.same_members(&gold, &pred))
            }
            _ => Ok(self.same_members(&gold, &pred)),
        }
    }

    fn in_order(&self, g: &[Math], p: &[Math]) -> Result<bool, Timeout> {
        if g.len() != p.len() {
            return Ok(false);
        }
        for (a, b) in g.iter().zip(p) {
            if !self.equal(a, b)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether the elements pair off one to one (any order).
    fn matching(&self, g: &[Math], p: &[Math]) -> Result<bool, Timeout> {
        let n = g.len();
        if n != p.len() {
            return Ok(false);
        }
        let mut adjacent = vec![Vec::new(); n];
        for (i, a) in g.iter().enumerate() {
            for (j, b) in p.iter().enumerate() {
                if self.equal(a, b)? {
                    adjacent[i].push(j);
                }
            }
            if adjacent[i].is_empty() {
                return Ok(false);
            }
        }
        // Kuhn's augmenting paths.
        let mut owner: Vec<Option<usize>> = vec![None; n];
        for i in 0..n {
            let mut seen = vec![false; n];
            if !augment(i, &adjacent, &mut owner, &mut seen) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Sets of real numbers (intervals, unions, finite sets) with the same members at every
    /// end, beside every end and between ends.
    fn same_members(&self, a: &Math, b: &Math) -> bool {
        let mut ends = Vec::new();
        if !set_ends(a, &mut ends) || !set_ends(b, &mut ends) {
            return false;
        }
        ends.retain(|v| v.is_finite());
        ends.sort_by(f64::total_cmp);
        ends.dedup();
        let mut probes = vec![-1e9, 1e9];
        for (k, e) in ends.iter().enumerate() {
            let delta = 1e-7 * e.abs().max(1.0);
            probes.extend([*e, e - delta, e + delta]);
            if let Some(next) = ends.get(k + 1) {
                probes.push((e + next) / 2.0);
            }
        }
        probes.iter().all(|t| contains(a, *t) == contains(b, *t))
    }
}

fn augment(
    i: usize,
    adjacent: &[Vec<usize>],
    owner: &mut [Option<usize>],
    seen: &mut [bool],
) -> bool {
    for &j in &adjacent[i] {
        if seen[j] {
            continue;
        }
        seen[j] = true;
        if owner[j].is_none_or(|k| augment(k, adjacent, owner, seen)) {
            owner[j] = Some(i);
            return true;
        }
    }
    false
}

/// Whether `m` is `x = ...` (or `x ∈ ...`) with only variables on the left: `x`, `AB`,
/// `f(x)`, `(p, q)`.
fn is_assignment(m: &Math) -> bool {
    let Math::Relation { terms, ops } = m else {
        return false;
    };
    if !ops.iter().all(|op| matches!(op, RelOp::Eq | RelOp::In)) {
        return false;
    }
    only_symbols(&terms[0])
}

fn only_symbols(m: &Math) -> bool {
    match m {
        Math::Expr(e) => e.is_only_symbols(),
        Math::Tuple(items) => items.iter().all(only_symbols),
        Math::Interval {
            lo, hi, pair: true, ..
        } => lo.is_only_symbols() && hi.is_only_symbols(),
        _ => false,
    }
}

/// `x = a = b = c` as `x = c`.
fn truncate_chain(m: &Math) -> Math {
    match m {
        Math::Relation { terms, ops } if terms.len() > 2 => Math::Relation {
            terms: vec![terms[0].clone(), terms[terms.len() - 1].clone()],
            ops: vec![*ops.last().expect("a relation")],
        },
        other => other.clone(),
    }
}

fn last_side(m: Math) -> Math {
    match m {
        Math::Relation { mut terms, .. } => terms.pop().expect("a relation has sides"),
        other => other,
    }
}

/// `pred` with its variables renamed to `gold`'s, in sorted order, when both have as many.
fn rename_like(gold: &Math, pred: &Math) -> Math {
    let (g, p) = (gold.free_symbols(), pred.free_symbols());
    if g.len() != p.len() || g == p {
        return pred.clone();
    }
    let map = |name: &str| {
        p.iter()
            .position(|v| v == name)
            .map(|i| Expr::Sym(g[i].clone()))
    };
    pred.map_exprs::<()>(&mut |e| Ok(e.substitute(&map)))
        .unwrap_or_else(|()| pred.clone())
}

/// `f(x)` as a variable named `f(x)`, so that `0 < f(x) < 1` is a relation in one variable.
fn unwrap_applications(e: &Expr) -> Expr {
    match e {
        Expr::Apply(..) => Expr::Sym(e.to_string()),
        other => other.map_children(&mut unwrap_applications),
    }
}

/// Whether the words of `\text{...}` are what `other` spells: `\text{odd}` and `odd` (the
/// product o·d·d), `\text{E}` and `E`, `\text{e}` and Euler's e.
fn text_matches(text: &str, other: &Expr) -> bool {
    let mut letters = Vec::new();
    if !spell(other, &mut letters) {
        return false;
    }
    let mut want: Vec<char> = text.chars().flat_map(char::to_lowercase).collect();
    want.sort_unstable();
    letters.sort_unstable();
    want == letters
}

fn spell(e: &Expr, out: &mut Vec<char>) -> bool {
    match e {
        Expr::Sym(s) if s.chars().count() == 1 => {
            out.extend(s.chars().flat_map(char::to_lowercase));
            true
        }
        Expr::Const(Constant::E) => {
            out.push('e');
            true
        }
        Expr::Const(Constant::I) => {
            out.push('i');
            true
        }
        Expr::Mul(xs) => xs.iter().all(|x| spell(x, out)),
        Expr::Pow(b, k) => match k.as_num().and_then(Number::to_i64) {
            Some(k @ 1..=20) => (0..k).all(|_| spell(b, out)),
            _ => false,
        },
        _ => false,
    }
}

/// Numbers at which a set changes membership; `false` if some end is not a number.
fn set_ends(m: &Math, out: &mut Vec<f64>) -> bool {
    match m {
        Math::Interval { lo, hi, .. } => {
            let (a, b) = (value(lo), value(hi));
            if a.im != 0.0 || b.im != 0.0 || a.re.is_nan() || b.re.is_nan() {
                return false;
            }
            out.extend([a.re, b.re]);
            true
        }
        Math::Union(parts) => parts.iter().all(|p| set_ends(p, out)),
        Math::Set { items, .. } => items.iter().all(|i| match i {
            Math::Expr(e) => {
                let v = value(e);
                let ok = v.im == 0.0 && v.re.is_finite();
                out.push(v.re);
                ok
            }
            _ => false,
        }),
        _ => false,
    }
}

/// Whether the real number `t` is in the set `m`.
fn contains(m: &Math, t: f64) -> bool {
    match m {
        Math::Interval {
            lo,
            hi,
            lo_open,
            hi_open,
            ..
        } => {
            let (a, b) = (value(lo).re, value(hi).re);
            let above = if *lo_open { t > a } else { t >= a };
            let below = if *hi_open { t < b } else { t <= b };
            above && below
        }
        Math::Union(parts) => parts.iter().any(|p| contains(p, t)),
        Math::Set { items, .. } => items.iter().any(|i| match i {
            Math::Expr(e) => close(value(e), Complex64::new(t, 0.0)),
            _ => false,
        }),
        _ => false,
    }
}

fn holds(op: RelOp, a: Complex64, b: Complex64) -> bool {
    if !finite(a) || !finite(b) || a.im.abs() > 1e-9 || b.im.abs() > 1e-9 {
        return false;
    }
    let (a, b) = (a.re, b.re);
    let equal = (a - b).abs() <= TOLERANCE * a.abs().max(b.abs()).max(1.0);
    match op {
        RelOp::Eq => equal,
        RelOp::Ne => !equal,
        RelOp::Lt => a < b && !equal,
        RelOp::Le => a < b || equal,
        RelOp::Gt => a > b && !equal,
        RelOp::Ge => a > b || equal,
        RelOp::In => false,
    }
}

/// The value of an expression without variables.
fn value(e: &Expr) -> Complex64 {
    eval(e, &|_| None)
}

fn finite(z: Complex64) -> bool {
    z.re.is_finite() && z.im.is_finite()
}

fn close(a: Complex64, b: Complex64) -> bool {
    if !finite(a) || !finite(b) {
        return false;
    }
    (a - b).norm() <= TOLERANCE * a.norm().max(b.norm()).max(1.0)
}

/// The `trial`-th random point for `vars`: deterministic, in ±[0.3, 3], so that every run
/// grades alike.
fn point(vars: &[String], trial: usize) -> Vec<Complex64> {
    let mut state = 0x2545_F491_4F6C_DD1Du64 ^ (trial as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    vars.iter()
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 11) as f64 / (1u64 << 53) as f64;
            let magnitude = 0.3 + 2.7 * unit;
            let sign = if state & 1 == 0 { 1.0 } else { -1.0 };
            Complex64::new(sign * magnitude, 0.0)
        })
        .collect()
}
