//! Exact numbers: rationals of any size, remembering whether they were written as decimals.
//!
//! A decimal in an answer (`0.333333`, `16386.20`) is a rounded value, so it is compared after
//! rounding both sides to `float_rounding` places; everything else is compared exactly. The
//! `decimal` flag carries that fact through arithmetic (`2/3.` is still a decimal).

use std::fmt;

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

/// Results larger than this many bits are not computed exactly (`10^{10^{10}}`): they are
/// left as powers and compared numerically.
const MAX_EXACT_BITS: u64 = 4096;

/// Numbers written with more digits than this are not read as numbers: arithmetic on them
/// (a gcd, a rounding) takes seconds that no deadline can interrupt. Such an answer is
/// compared as text, exactly (`equal_answers`), which never accepts a wrong one.
pub const MAX_LITERAL_DIGITS: usize = 10_000;

/// An exact rational, and whether a decimal point took part in writing it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Number {
    /// The exact value.
    pub value: BigRational,
    /// Written (or computed from something written) as a decimal.
    pub decimal: bool,
}

impl Number {
    /// An exact integer.
    pub fn int(i: i64) -> Self {
        Self::exact(BigRational::from_integer(BigInt::from(i)))
    }

    /// An exact rational.
    pub fn exact(value: BigRational) -> Self {
        Self {
            value,
            decimal: false,
        }
    }

    /// `p/q` (q ≠ 0).
    pub fn ratio(p: i64, q: i64) -> Self {
        Self::exact(BigRational::new(BigInt::from(p), BigInt::from(q)))
    }

    /// Parses `123`, `0045`, `12.50`, `.5`: ASCII digits with at most one point, and at
    /// most [`MAX_LITERAL_DIGITS`] of them.
    pub fn parse(text: &str) -> Option<Self> {
        if text.bytes().filter(u8::is_ascii_digit).count() > MAX_LITERAL_DIGITS {
            return None;
        }
        let (int_part, frac_part) = match text.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (text, None),
        };
        let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if !digits_ok(int_part) || !frac_part.is_none_or(digits_ok) {
            return None;
        }
        if int_part.is_empty() && frac_part.is_none_or(str::is_empty) {
            return None;
        }
        let frac = frac_part.unwrap_or("");
        let all: String = format!("{int_part}{frac}");
        let numer: BigInt = if all.is_empty() {
            BigInt::zero()
        } else {
            all.parse().ok()?
        };
        let denom = BigInt::from(10u32).pow(u32::try_from(frac.len()).ok()?);
        Some(Self {
            value: BigRational::new(numer, denom),
            decimal: frac_part.is_some(),
        })
    }

    /// Whether this is zero.
    pub fn is_zero(&self) -> bool {
        self.value.is_zero()
    }

    /// Whether this is one.
    pub fn is_one(&self) -> bool {
        self.value.is_one()
    }

    /// Whether this is an integer.
    pub fn is_integer(&self) -> bool {
        self.value.is_integer()
    }

    /// The value as a float (may be infinite for huge values).
    pub fn to_f64(&self) -> f64 {
        self.value.to_f64().unwrap_or(f64::NAN)
    }

    /// The integer value, when it is a small integer.
    pub fn to_i64(&self) -> Option<i64> {
        if self.value.is_integer() {
            self.value.numer().to_i64()
        } else {
            None
        }
    }

    /// Sum.
    pub fn add(&self, other: &Self) -> Self {
        Self {
            value: &self.value + &other.value,
            decimal: self.decimal || other.decimal,
        }
    }

    /// Product.
    pub fn mul(&self, other: &Self) -> Self {
        Self {
            value: &self.value * &other.value,
            decimal: self.decimal || other.decimal,
        }
    }

    /// Negation.
    pub fn neg(&self) -> Self {
        Self {
            value: -&self.value,
            decimal: self.decimal,
        }
    }

    /// `self^exp` when the result is an exact rational of reasonable size: integer exponents,
    /// and roots of perfect powers (`(9/4)^(1/2) = 3/2`). `None` otherwise (and for 0^-n).
    pub fn pow(&self, exp: &Self) -> Option<Self> {
        let decimal = self.decimal || exp.decimal;
        let numer = exp.value.numer().to_i64()?;
        let denom = exp.value.denom().to_u32()?;
        if self.value.is_zero() {
            return (numer > 0).then(|| Self {
                value: BigRational::zero(),
                decimal,
            });
        }
        // The root first (keeps the numbers small), then the integer power.
        let base = if denom == 1 {
            self.value.clone()
        } else {
            if self.value.is_negative() && denom % 2 == 0 {
                return None;
            }
            let root = |n: &BigInt| -> Option<BigInt> {
                let r = n.nth_root(denom);
                (r.pow(denom) == *n).then_some(r)
            };
            BigRational::new(root(self.value.numer())?, root(self.value.denom())?)
        };
        let bits = base.numer().bits().max(base.denom().bits()).max(1);
        if bits.saturating_mul(numer.unsigned_abs()) > MAX_EXACT_BITS {
            return None;
        }
        let magnitude = u32::try_from(numer.unsigned_abs()).ok()?;
        let mut value = BigRational::new(base.numer().pow(magnitude), base.denom().pow(magnitude));
        if numer < 0 {
            value = value.recip();
        }
        Some(Self { value, decimal })
    }

    /// The reciprocal (`None` for zero).
    pub fn recip(&self) -> Option<Self> {
        (!self.value.is_zero()).then(|| Self {
            value: self.value.recip(),
            decimal: self.decimal,
        })
    }

    /// `n!` for 0 ≤ n ≤ 1000.
    pub fn factorial(&self) -> Option<Self> {
        let n = self.to_i64()?;
        if !(0..=1000).contains(&n) {
            return None;
        }
        let mut acc = BigInt::one();
        for k in 2..=n {
            acc *= k;
        }
        Some(Self::exact(BigRational::from_integer(acc)))
    }

    /// The decimal places needed to write the value exactly (`0.0000672`: 7), if it has a
    /// finite decimal expansion of at most 40 places.
    pub fn exact_places(&self) -> Option<u32> {
        let text = decimal_text(&self.value)?;
        let frac = text.split_once('.').map_or("", |(_, f)| f);
        let significant = frac.trim_end_matches('0');
        u32::try_from(significant.len()).ok()
    }

    /// Rounded to `digits` decimal places, halves away from zero.
    pub fn rounded(&self, digits: u32) -> BigRational {
        round_rational(&self.value, digits)
    }
}

/// `value` rounded to `digits` decimal places, halves away from zero.
pub fn round_rational(value: &BigRational, digits: u32) -> BigRational {
    let scale = BigInt::from(10u32).pow(digits);
    let scaled = value * BigRational::from_integer(scale.clone());
    let half = BigRational::new(BigInt::one(), BigInt::from(2));
    let magnitude = (scaled.abs() + half).floor().to_integer();
    let signed = if scaled.is_negative() {
        -magnitude
    } else {
        magnitude
    };
    BigRational::new(signed, scale)
}

/// `value` rounded to `digits` decimal places as a float comparison key. Floats carry ~16
/// significant digits, so values past 1e9 at 6 places compare on what the float holds.
pub fn round_f64(value: f64, digits: u32) -> f64 {
    let scale = 10f64.powi(digits as i32);
    let scaled = value * scale;
    if !scaled.is_finite() || scaled.abs() > 1e15 {
        return value;
    }
    scaled.round() / scale
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.decimal {
            // A decimal prints as one: exact when its denominator is a power of ten.
            if let Some(text) = decimal_text(&self.value) {
                return f.write_str(&text);
            }
        }
        if self.value.is_integer() {
            write!(f, "{}", self.value.numer())
        } else {
            write!(f, "{}/{}", self.value.numer(), self.value.denom())
        }
    }
}

/// The exact decimal expansion of a rational whose denominator divides a power of ten
/// (up to 40 places), e.g. `1.25`; `None` for `1/3`.
fn decimal_text(value: &BigRational) -> Option<String> {
    let mut denom = value.denom().clone();
    let mut places = 0u32;
    let ten = BigInt::from(10u32);
    let two = BigInt::from(2u32);
    let five = BigInt::from(5u32);
    let mut twos = 0u32;
    let mut fives = 0u32;
    while (&denom % &two).is_zero() {
        denom /= &two;
        twos += 1;
    }
    while (&denom % &five).is_zero() {
        denom /= &five;
        fives += 1;
    }
    if !denom.is_one() {
        return None;
    }
    places += twos.max(fives);
    if places > 40 {
        return None;
    }
    let scaled = (value * BigRational::from_integer(ten.pow(places))).to_integer();
    let negative = scaled.is_negative();
    let digits = scaled.abs().to_string();
    let text = if places == 0 {
        format!("{digits}.0")
    } else {
        let width = places as usize + 1;
        let padded = format!("{digits:0>width$}");
        let (i, f) = padded.split_at(padded.len() - places as usize);
        format!("{i}.{f}")
    };
    Some(if negative { format!("-{text}") } else { text })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decimals_exactly() {
        let n = Number::parse("16386.20").unwrap();
        assert!(n.decimal);
        assert_eq!(
            n.value,
            BigRational::new(BigInt::from(163862), BigInt::from(10))
        );
        assert_eq!(Number::parse(".5").unwrap().to_f64(), 0.5);
        assert_eq!(Number::parse("004").unwrap(), Number::int(4));
        assert!(Number::parse("1.2.3").is_none());
        assert!(Number::parse(".").is_none());
        assert!(Number::parse("").is_none());
        let longest = "9".repeat(MAX_LITERAL_DIGITS);
        assert!(Number::parse(&longest).is_some());
        assert!(Number::parse(&format!("{}.5", &longest[1..])).is_some());
        assert!(Number::parse(&format!("{longest}9")).is_none());
        assert!(Number::parse(&format!("0.{longest}")).is_none());
    }

    #[test]
    fn powers_and_roots_stay_exact_when_they_can() {
        let nine_quarters = Number::ratio(9, 4);
        assert_eq!(
            nine_quarters.pow(&Number::ratio(1, 2)),
            Some(Number::ratio(3, 2))
        );
        assert_eq!(
            nine_quarters.pow(&Number::ratio(-1, 2)),
            Some(Number::ratio(2, 3))
        );
        assert_eq!(Number::int(2).pow(&Number::ratio(1, 2)), None);
        assert_eq!(
            Number::int(-8).pow(&Number::ratio(1, 3)),
            Some(Number::int(-2))
        );
        assert_eq!(Number::int(-4).pow(&Number::ratio(1, 2)), None);
        assert_eq!(
            Number::int(2).pow(&Number::int(10)),
            Some(Number::int(1024))
        );
        assert_eq!(Number::int(10).pow(&Number::int(100_000)), None);
        assert_eq!(Number::int(0).pow(&Number::int(-1)), None);
    }

    #[test]
    fn rounds_halves_away_from_zero() {
        let r = |s: &str, d| Number::parse(s).unwrap().rounded(d);
        assert_eq!(r("2.6667", 2), Number::ratio(267, 100).value);
        assert_eq!(r("0.125", 2), Number::ratio(13, 100).value);
        assert_eq!(
            Number::ratio(-1, 8).rounded(2),
            Number::ratio(-13, 100).value
        );
        assert_eq!(
            Number::ratio(1, 3).rounded(6),
            Number::ratio(333_333, 1_000_000).value
        );
    }

    #[test]
    fn prints_decimals_as_decimals() {
        assert_eq!(Number::parse("0.50").unwrap().to_string(), "0.5");
        assert_eq!(Number::parse("1000.0").unwrap().to_string(), "1000.0");
        assert_eq!(Number::ratio(-1, 3).to_string(), "-1/3");
        assert_eq!(
            Number::parse("1")
                .unwrap()
                .mul(&Number::parse("0.5").unwrap())
                .to_string(),
            "0.5"
        );
    }
}
