//! Reading a receiver's `Retry-After` header (on a `429` or `503`): seconds or an HTTP
//! date, a number too large to hold read as the longest wait (the caller caps it).

use std::time::Duration;

use reqwest::header::HeaderValue;

/// `Retry-After` as seconds or an HTTP date, relative to `now`. A number of seconds too
/// large to hold is as long as can be (the caller caps it).
pub fn parse(value: &HeaderValue, now: std::time::SystemTime) -> Option<Duration> {
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
}
