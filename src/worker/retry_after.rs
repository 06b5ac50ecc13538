//! Reading a receiver's `Retry-After` header (on a `429` or `503`): seconds or an HTTP
//! date, a number too large to hold read as the longest wait (the caller caps it). A date
//! is read against the answer's own `Date` header, the receiver's clock, so that neither
//! this host's clock nor the receiver's skews the wait; only an answer without a readable
//! `Date` is read against the database's clock as this process measured it.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue, DATE, RETRY_AFTER};

/// The wait an answer's headers ask for, if they carry a readable `Retry-After`: see the
/// module docs. `now` is the database's time as measured, for an answer without a `Date`.
pub fn wait_asked(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?;
    let answered_at = headers
        .get(DATE)
        .and_then(|date| date.to_str().ok())
        .and_then(|date| httpdate::parse_http_date(date.trim()).ok())
        .unwrap_or(now);
    parse(value, answered_at)
}

/// `Retry-After` as seconds or an HTTP date, relative to `now`. A number of seconds too
/// large to hold is as long as can be (the caller caps it).
fn parse(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Some(
            text.parse::<u64>()
                .map_or(Duration::MAX, Duration::from_secs),
        );
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_accepts_seconds_and_http_dates() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let seconds = HeaderValue::from_static("120");
        assert_eq!(parse(&seconds, now), Some(Duration::from_secs(120)));
        let date =
            HeaderValue::from_str(&httpdate::fmt_http_date(now + Duration::from_secs(30))).unwrap();
        assert_eq!(parse(&date, now), Some(Duration::from_secs(30)));
        let past =
            HeaderValue::from_str(&httpdate::fmt_http_date(now - Duration::from_secs(30))).unwrap();
        assert_eq!(parse(&past, now), Some(Duration::ZERO));
        assert_eq!(parse(&HeaderValue::from_static("soon"), now), None);
        assert_eq!(
            parse(&HeaderValue::from_static("99999999999999999999999"), now),
            Some(Duration::MAX),
            "too many seconds to hold is as long as can be, not ignored"
        );
        assert_eq!(parse(&HeaderValue::from_static("-5"), now), None);
    }

    #[test]
    fn a_date_is_read_against_the_answers_own_date() {
        let receiver_now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let date = |at: SystemTime| HeaderValue::from_str(&httpdate::fmt_http_date(at)).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, date(receiver_now + Duration::from_secs(60)));
        headers.insert(DATE, date(receiver_now));
        // This host ten minutes ahead of the receiver, or ten behind: the same minute.
        for skew in [600, -600] {
            let here = if skew > 0 {
                receiver_now + Duration::from_secs(600)
            } else {
                receiver_now - Duration::from_secs(600)
            };
            assert_eq!(
                wait_asked(&headers, here),
                Some(Duration::from_secs(60)),
                "{skew}"
            );
        }
        // Without a readable `Date`, this host's clock.
        headers.insert(DATE, HeaderValue::from_static("yesterday"));
        assert_eq!(
            wait_asked(&headers, receiver_now + Duration::from_secs(30)),
            Some(Duration::from_secs(30))
        );
        headers.remove(DATE);
        assert_eq!(
            wait_asked(&headers, receiver_now),
            Some(Duration::from_secs(60))
        );
        // Seconds need no clock.
        headers.insert(RETRY_AFTER, HeaderValue::from_static("5"));
        assert_eq!(
            wait_asked(&headers, receiver_now),
            Some(Duration::from_secs(5))
        );
        headers.remove(RETRY_AFTER);
        assert_eq!(wait_asked(&headers, receiver_now), None);
    }
}
