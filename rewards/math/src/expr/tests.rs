//! Tests of the canonical form and the evaluator.

use num_complex::Complex64;

use super::eval::gamma;
use super::*;
use crate::Deadline;

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
    assert!(!Expr::Add(vec![sym("a"), Expr::Mul(vec![Expr::int(3), sym("z")])]).is_only_symbols());
    assert!(!Expr::int(7).is_only_symbols());
}
