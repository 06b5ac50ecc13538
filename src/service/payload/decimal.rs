//! JSON numbers as exact decimal values, with one plain spelling per value: what Courier
//! stores, delivers and hashes, so no number is ever rounded through a binary float.
//!
//! The plain form has no exponent, no leading zeros, no trailing fractional zeros and no
//! negative zero: `1E2` -> `100`, `1.50` -> `1.5`, `-0` -> `0`, `1e-3` -> `0.001`. It is also
//! how PostgreSQL prints a `numeric` with no trailing zeros, so `jsonb` keeps it unchanged.

use std::fmt;

/// Most digits a number's plain form may have. An exponent makes a short text stand for
/// an enormous one (`1e999999999`), so the plain form is bounded before it is written; a
/// thousand digits is far beyond any real quantity and well within PostgreSQL's `numeric`.
pub const MAX_NUMBER_DIGITS: usize = 1_000;

/// Why a number has no acceptable plain form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NumberError {
    /// The text is not a JSON number.
    #[error("`{0}` is not a JSON number")]
    Malformed(String),
    /// Its plain form would be longer than [`MAX_NUMBER_DIGITS`].
    #[error("a number must have at most {MAX_NUMBER_DIGITS} digits when written out in full")]
    TooLong,
}

/// An exact decimal value: `-digits × 10^exponent` when negative, else `digits × 10^exponent`.
/// `digits` has no leading or trailing zeros; zero is the empty string, never negative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decimal {
    negative: bool,
    digits: String,
    exponent: i64,
}

/// Exponents are read saturating at this magnitude: any such number is zero or too long.
const EXPONENT_CAP: i64 = i64::MAX / 4;

impl Decimal {
    /// Reads a JSON number (`-?digits(.digits)?([eE][+-]?digits)?`) exactly, refusing one
    /// whose plain form would exceed [`MAX_NUMBER_DIGITS`].
    pub fn parse(text: &str) -> Result<Decimal, NumberError> {
        let malformed = || NumberError::Malformed(text.to_owned());
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
            Some(at) => (
                &unsigned[..at],
                parse_exponent(&unsigned[at + 1..]).ok_or_else(malformed)?,
            ),
            None => (unsigned, 0),
        };
        let (integer, fraction) = match mantissa.split_once('.') {
            Some((integer, fraction)) if !fraction.is_empty() => (integer, fraction),
            Some(_) => return Err(malformed()),
            None => (mantissa, ""),
        };
        if !all_digits(integer) || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed());
        }
        let all = format!("{integer}{fraction}");
        let significant = all.trim_start_matches('0');
        let digits = significant.trim_end_matches('0');
        if digits.is_empty() {
            return Ok(Decimal {
                negative: false,
                digits: String::new(),
                exponent: 0,
            });
        }
        // Bounded by the input's length, so these fit easily; the exponent is capped.
        let fraction_len = i64::try_from(fraction.len()).map_err(|_| NumberError::TooLong)?;
        let trailing =
            i64::try_from(significant.len() - digits.len()).map_err(|_| NumberError::TooLong)?;
        let decimal = Decimal {
            negative,
            digits: digits.to_owned(),
            exponent: exponent - fraction_len + trailing,
        };
        match decimal.plain_digits() {
            Some(n) if n <= MAX_NUMBER_DIGITS => Ok(decimal),
            _ => Err(NumberError::TooLong),
        }
    }

    /// How many digits the plain form has (`None` if beyond any `usize`).
    fn plain_digits(&self) -> Option<usize> {
        let len = self.digits.len().max(1);
        if self.exponent >= 0 {
            len.checked_add(usize::try_from(self.exponent).ok()?)
        } else {
            let fraction = usize::try_from(self.exponent.checked_neg()?).ok()?;
            // `0.` then zeros when every digit is fractional.
            Some(if len > fraction { len } else { fraction + 1 })
        }
    }

    /// Length in bytes of the plain form.
    pub fn plain_len(&self) -> usize {
        let digits = self.plain_digits().unwrap_or(usize::MAX);
        let point = usize::from(self.exponent < 0);
        digits
            .saturating_add(point)
            .saturating_add(usize::from(self.negative))
    }
}

impl fmt::Display for Decimal {
    /// The plain form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.digits.is_empty() {
            return f.write_str("0");
        }
        if self.negative {
            f.write_str("-")?;
        }
        let len = self.digits.len();
        match usize::try_from(self.exponent) {
            Ok(zeros) => {
                f.write_str(&self.digits)?;
                write_zeros(f, zeros)
            }
            Err(_) => {
                let fraction = usize::try_from(self.exponent.unsigned_abs()).unwrap_or(usize::MAX);
                if len > fraction {
                    let (integer, fraction) = self.digits.split_at(len - fraction);
                    write!(f, "{integer}.{fraction}")
                } else {
                    f.write_str("0.")?;
                    write_zeros(f, fraction - len)?;
                    f.write_str(&self.digits)
                }
            }
        }
    }
}

fn write_zeros(f: &mut fmt::Formatter<'_>, count: usize) -> fmt::Result {
    (0..count).try_for_each(|_| f.write_str("0"))
}

fn all_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// `[+-]?digits`, saturating at [`EXPONENT_CAP`].
fn parse_exponent(text: &str) -> Option<i64> {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if !all_digits(digits) {
        return None;
    }
    let magnitude = digits.bytes().fold(0_i64, |acc, digit| {
        acc.saturating_mul(10)
            .saturating_add(i64::from(digit - b'0'))
            .min(EXPONENT_CAP)
    });
    Some(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str) -> Result<String, NumberError> {
        Decimal::parse(text).map(|decimal| decimal.to_string())
    }

    #[test]
    fn every_spelling_of_a_value_has_one_plain_form() {
        for (text, expected) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.000", "0"),
            ("0e999999999999999999999", "0"),
            ("-0.0e-5", "0"),
            ("100", "100"),
            ("1E2", "100"),
            ("1e+2", "100"),
            ("1.00e2", "100"),
            ("10000e-2", "100"),
            ("1.50", "1.5"),
            ("-1.50", "-1.5"),
            ("1e-3", "0.001"),
            ("-12.5e-3", "-0.0125"),
            (
                "0.1000000000000000055511151231257827",
                "0.1000000000000000055511151231257827",
            ),
            ("18446744073709551617", "18446744073709551617"),
            (
                "-123456789012345678901234567890",
                "-123456789012345678901234567890",
            ),
            ("1.8446744073709552e19", "18446744073709552000"),
            ("123.456", "123.456"),
            ("0.5", "0.5"),
        ] {
            assert_eq!(plain(text).as_deref(), Ok(expected), "{text}");
        }
    }

    #[test]
    fn plain_forms_longer_than_the_limit_are_refused() {
        let longest = format!("1e{}", MAX_NUMBER_DIGITS - 1);
        assert_eq!(plain(&longest).map(|p| p.len()), Ok(MAX_NUMBER_DIGITS));
        let smallest = format!("1e-{}", MAX_NUMBER_DIGITS - 1);
        assert_eq!(plain(&smallest).map(|p| p.len()), Ok(MAX_NUMBER_DIGITS + 1));
        for text in [
            format!("1e{MAX_NUMBER_DIGITS}"),
            format!("1e-{MAX_NUMBER_DIGITS}"),
            "1e999999999".to_owned(),
            "-1e-999999999999999999999999".to_owned(),
            "9".repeat(MAX_NUMBER_DIGITS + 1),
        ] {
            assert_eq!(plain(&text), Err(NumberError::TooLong), "{text}");
        }
    }

    #[test]
    fn plain_len_is_the_length_written() {
        for text in ["-0.0125", "100", "0", "-1e-5", "123.456", "-7e3"] {
            let decimal = Decimal::parse(text).unwrap();
            assert_eq!(decimal.plain_len(), decimal.to_string().len(), "{text}");
        }
    }

    #[test]
    fn text_that_is_not_a_number_is_refused() {
        for text in [
            "", "-", "1.", ".5", "1e", "1e+", "1.2.3", "0x10", "1_000", "+1", "NaN",
        ] {
            assert!(
                matches!(plain(text), Err(NumberError::Malformed(_))),
                "{text}"
            );
        }
    }
}
