//! Every answer's `Date`, by Courier's clock: the database's, as this process measured it,
//! which expiries, pauses and every stamp Courier hands out are judged by. hyper would stamp
//! this host's own clock, which may be off (a client comparing an `expiresAt` with `Date`,
//! as the console does, would then be off as much).

use std::cell::RefCell;

use axum::http::{header, HeaderValue};
use axum::response::Response;
use chrono::{DateTime, Utc};

thread_local! {
    /// The last `Date` made on this thread, and the second it is for.
    static LAST: RefCell<Option<(i64, HeaderValue)>> = const { RefCell::new(None) };
}

/// `response` with its `Date` by Courier's clock.
pub async fn stamp(mut response: Response) -> Response {
    if let Some(date) = now_header() {
        response.headers_mut().insert(header::DATE, date);
    }
    response
}

/// The `Date` value for now, by Courier's clock (for answers written outside the router).
pub fn now_header() -> Option<HeaderValue> {
    date_header(crate::db::now())
}

/// The `Date` value (RFC 9110's IMF-fixdate) for `now`, made once a second per thread.
fn date_header(now: DateTime<Utc>) -> Option<HeaderValue> {
    let second = now.timestamp();
    LAST.with_borrow_mut(|last| {
        if let Some((made_for, value)) = last.as_ref() {
            if *made_for == second {
                return Some(value.clone());
            }
        }
        let text = now.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
        let value = HeaderValue::from_str(&text).ok()?;
        *last = Some((second, value.clone()));
        Some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_is_an_imf_fixdate_of_the_second() {
        let at: DateTime<Utc> = "2026-12-07T01:42:33.900Z".parse().expect("a time");
        let date = date_header(at).expect("a header value");
        assert_eq!(date, "Mon, 07 Dec 2026 01:42:33 GMT");
        let later: DateTime<Utc> = "2026-12-07T01:42:34.000Z".parse().expect("a time");
        assert_eq!(
            date_header(later).expect("a header value"),
            "Mon, 07 Dec 2026 01:42:34 GMT"
        );
    }
}
