//! Card counts and Kubernetes quantities.
//!
//! Every count of cards is a [`Cards`]: one object asks for at most `u64::MAX` cards,
//! and sums are kept in 128 bits with saturating arithmetic, so no count can wrap
//! (a wrapped `allocated` would let the next pod past its quota).

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign};

/// A number of whole cards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cards(u128);

impl Cards {
    pub const ZERO: Cards = Cards(0);

    pub const fn new(n: u64) -> Self {
        // Widening: every u64 fits (a const fn cannot call From).
        Self(n as u128)
    }

    /// A count from a plain integer (a flow or a sum computed elsewhere).
    pub const fn from_u128(n: u128) -> Self {
        Self(n)
    }

    /// The count as a plain integer.
    pub const fn get(self) -> u128 {
        self.0
    }

    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// `self - other`, or zero.
    pub fn saturating_sub(self, other: Cards) -> Cards {
        Cards(self.0.saturating_sub(other.0))
    }

    /// `k` objects of `self` cards each.
    pub fn times(self, k: u64) -> Cards {
        Cards(self.0.saturating_mul(u128::from(k)))
    }

    /// `self - other` as a signed number (room left; negative when over).
    pub fn signed_minus(self, other: Cards) -> i128 {
        let a = i128::try_from(self.0).unwrap_or(i128::MAX);
        let b = i128::try_from(other.0).unwrap_or(i128::MAX);
        a.saturating_sub(b)
    }

    /// The count clamped into an `i64` (metrics gauges).
    pub fn as_i64_saturating(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }
}

impl From<u64> for Cards {
    fn from(n: u64) -> Self {
        Self::new(n)
    }
}

impl Add for Cards {
    type Output = Cards;
    fn add(self, o: Cards) -> Cards {
        Cards(self.0.saturating_add(o.0))
    }
}

impl AddAssign for Cards {
    fn add_assign(&mut self, o: Cards) {
        *self = *self + o;
    }
}

impl Sum for Cards {
    fn sum<I: Iterator<Item = Cards>>(iter: I) -> Cards {
        iter.fold(Cards::ZERO, Add::add)
    }
}

impl<'a> Sum<&'a Cards> for Cards {
    fn sum<I: Iterator<Item = &'a Cards>>(iter: I) -> Cards {
        iter.copied().sum()
    }
}

impl fmt::Display for Cards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl serde::Serialize for Cards {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Counts that fit (all real ones) are plain u64 numbers every JSON reader takes.
        match u64::try_from(self.0) {
            Ok(n) => s.serialize_u64(n),
            Err(_) => s.serialize_u128(self.0),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Cards {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u128::deserialize(d).map(Cards)
    }
}

/// Why a quantity is not a whole number of cards.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a Kubernetes quantity")]
    Syntax(String),
    #[error("expected a whole, non-negative number of cards, got {0:?}")]
    NotWhole(String),
    #[error("quantity {0:?} is larger than 18446744073709551615 cards")]
    TooLarge(String),
}

/// Parses a Kubernetes quantity (`3`, `2000m`, `1k`, `1Ki`, `1e3`, `1.5k`, `+4`) that
/// must be a whole, non-negative number of cards no larger than `u64::MAX`.
pub fn parse_whole(q: &str) -> Result<u64, QuantityError> {
    let syntax = || QuantityError::Syntax(q.to_string());
    let not_whole = || QuantityError::NotWhole(q.to_string());
    let too_large = || QuantityError::TooLarge(q.to_string());
    let s = q.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(num_end);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return Err(syntax());
    }
    // value = digits * 10^exp10 * 2^exp2
    let (mut exp10, exp2): (i64, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        s if s.starts_with(['e', 'E']) => {
            let e = &s[1..];
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax());
            }
            // Anything beyond a few hundred is zero or too large anyway.
            let v: i64 = digits.parse::<i64>().unwrap_or(i64::MAX).min(1000);
            (if e.starts_with('-') { -v } else { v }, 0)
        }
        _ => return Err(syntax()),
    };
    // A plain count ("1", "8"), as card requests are: no exponent, nothing to join.
    if let ("", "", 1..=19) = (suffix, frac_part, int_part.len()) {
        if !negative {
            return int_part.parse().map_err(|_| syntax());
        }
    }
    let mut digits: String = format!("{int_part}{frac_part}");
    exp10 = exp10.saturating_sub(i64::try_from(frac_part.len()).unwrap_or(i64::MAX));
    // Trailing zeros move into the exponent; leading zeros carry nothing.
    while digits.len() > 1 && digits.ends_with('0') {
        digits.pop();
        exp10 += 1;
    }
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(not_whole());
    }
    if digits.len() > 38 {
        return Err(if exp10 >= 0 { too_large() } else { not_whole() });
    }
    let mut value: u128 = digits.parse().map_err(|_| syntax())?;
    value = value
        .checked_shl(exp2)
        .filter(|v| v >> exp2 == value)
        .ok_or_else(too_large)?;
    if exp10 >= 0 {
        for _ in 0..exp10 {
            value = value.checked_mul(10).ok_or_else(too_large)?;
        }
    } else {
        for _ in 0..(-exp10) {
            if !value.is_multiple_of(10) {
                return Err(not_whole());
            }
            value /= 10;
        }
    }
    u64::try_from(value).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Plain counts take a short path; it reads what the general one reads.
    #[test]
    fn plain_counts_read_as_their_decimal_forms() {
        for n in [
            "0",
            "1",
            "8",
            "007",
            "10",
            "1000",
            "9999999999999999999",
            "18446744073709551615",
            "18446744073709551616",
            "-0",
            "-3",
            "+2",
        ] {
            // Errors name their input: compare their kinds.
            let read = |q: &str| parse_whole(q).map_err(|e| std::mem::discriminant(&e));
            assert_eq!(read(n), read(&format!("{n}.0")), "{n}");
        }
    }

    #[test]
    fn whole_quantities_parse_and_fractions_are_refused() {
        assert_eq!(parse_whole("3"), Ok(3));
        assert_eq!(parse_whole("2000m"), Ok(2));
        assert_eq!(parse_whole("1k"), Ok(1000));
        assert_eq!(parse_whole("1Ki"), Ok(1024));
        assert_eq!(parse_whole("1.5k"), Ok(1500));
        assert_eq!(parse_whole("1e3"), Ok(1000));
        assert_eq!(
            parse_whole("5E-1Ki"),
            Err(QuantityError::Syntax("5E-1Ki".into()))
        );
        assert_eq!(parse_whole("+4"), Ok(4));
        assert_eq!(parse_whole("0.5Ki"), Ok(512));
        assert_eq!(parse_whole("-0"), Ok(0));
        assert_eq!(parse_whole("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_whole("16Ei"),
            Err(QuantityError::TooLarge("16Ei".into()))
        );
        assert_eq!(parse_whole("15Ei"), Ok(15 << 60));
        assert_eq!(
            parse_whole("18446744073709551616"),
            Err(QuantityError::TooLarge("18446744073709551616".into()))
        );
        assert!(matches!(
            parse_whole("500m"),
            Err(QuantityError::NotWhole(_))
        ));
        assert!(matches!(parse_whole("-1"), Err(QuantityError::NotWhole(_))));
        assert!(matches!(
            parse_whole("1.5"),
            Err(QuantityError::NotWhole(_))
        ));
        assert!(matches!(parse_whole(""), Err(QuantityError::Syntax(_))));
        assert!(matches!(parse_whole("1x"), Err(QuantityError::Syntax(_))));
        assert!(matches!(parse_whole("1e"), Err(QuantityError::Syntax(_))));
        assert!(matches!(
            parse_whole("1e99999999999999999999"),
            Err(QuantityError::TooLarge(_))
        ));
    }

    #[test]
    fn sums_saturate_instead_of_wrapping() {
        let max = Cards::new(u64::MAX);
        assert_eq!((max + max).get(), 2 * u128::from(u64::MAX));
        assert_eq!(Cards::new(1).saturating_sub(max), Cards::ZERO);
        assert_eq!(
            Cards::new(u64::MAX).signed_minus(Cards::new(1)),
            i128::from(u64::MAX) - 1
        );
        assert_eq!(serde_json::to_string(&max).unwrap(), "18446744073709551615");
    }

    proptest! {
        #[test]
        fn every_u64_round_trips_in_several_spellings(n in any::<u64>()) {
            prop_assert_eq!(parse_whole(&n.to_string()), Ok(n));
            if let Some(milli) = u128::from(n).checked_mul(1000) {
                prop_assert_eq!(parse_whole(&format!("{milli}m")), Ok(n));
            }
            if n % 1000 == 0 {
                prop_assert_eq!(parse_whole(&format!("{}k", n / 1000)), Ok(n));
            }
        }

        #[test]
        fn arbitrary_text_never_panics(s in ".{0,40}") {
            let _ = parse_whole(&s);
        }
    }
}
