//! The numeric value of an expression, in complex arithmetic.

use num_complex::Complex64;
use num_traits::Zero;

use super::{Constant, Expr, Func};

/// The numeric value of `e` with variables from `env`, in complex arithmetic (principal
/// branches), so that `√(x²)` and `x` differ at negative `x`. NaN where undefined.
pub(crate) fn eval(e: &Expr, env: &dyn Fn(&str) -> Option<Complex64>) -> Complex64 {
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
pub(super) fn gamma(x: f64) -> f64 {
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
