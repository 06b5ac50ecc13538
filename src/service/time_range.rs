//! A time range given as a filter (`createdAfter`/`createdBefore`, `since`/`until`): each
//! bound a moment both databases can compare, and the bounds in order.

use chrono::{DateTime, Datelike, Utc};

use crate::error::{Error, Result};

/// The years a bound may name: those RFC 3339 can write. PostgreSQL cannot store a moment
/// before 4713 BC, and SQLite compares times as text, which orders a year past 9999 before
/// the year 2000; within these years both agree.
pub(crate) const YEARS: std::ops::RangeInclusive<i32> = 1..=9999;

/// Refuses a range whose bounds (named `from_name` and `to_name` in the message) are out
/// of [`YEARS`] or out of order.
pub fn validate(
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    from_name: &str,
    to_name: &str,
) -> Result<()> {
    for (at, name) in [(from, from_name), (to, to_name)] {
        if at.is_some_and(|at| !YEARS.contains(&at.year())) {
            return Err(Error::bad_input(format!(
                "{name} must be between the years {} and {}",
                YEARS.start(),
                YEARS.end()
            )));
        }
    }
    if let (Some(from), Some(to)) = (from, to) {
        if from > to {
            return Err(Error::bad_input(format!(
                "{from_name} is later than {to_name}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Option<DateTime<Utc>> {
        Some(
            DateTime::parse_from_rfc3339(text)
                .map(|at| at.with_timezone(&Utc))
                .unwrap_or_else(|err| panic!("{text}: {err}")),
        )
    }

    #[test]
    fn bounds_must_be_writable_years_in_order() {
        let (first, last) = (at("0001-01-01T00:00:00Z"), at("9999-12-31T23:59:59Z"));
        assert!(validate(first, last, "a", "b").is_ok());
        assert!(validate(None, None, "a", "b").is_ok());
        let before_one = DateTime::<Utc>::from_timestamp(-62_135_596_801, 0);
        let after_last = DateTime::<Utc>::from_timestamp(253_402_300_800, 0);
        for (from, to) in [(before_one, None), (None, after_last), (last, first)] {
            let err = validate(from, to, "filter.since", "filter.until")
                .err()
                .unwrap_or_else(|| panic!("{from:?}..{to:?} accepted"));
            assert!(matches!(err, Error::BadInput(_)), "{err:?}");
        }
    }
}
