//! Reading a request's body: within the body limit, and whole within
//! `COURIER_BODY_TIMEOUT_MS` of when reading began, so that a client sending a large body a
//! byte at a time (each byte soon enough after the last to pass the stall timeout of
//! [`super::connections`]) cannot hold a connection, and the cap on connections, for days;
//! and a body refused unread is read and thrown away for a moment first (unless its client
//! waits to be asked for it).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Version};
use axum::response::Response;
use futures_util::StreamExt as _;

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum Unreadable {
    /// It is (or declares itself) over the limit.
    TooLarge,
    /// It stopped arriving for the stall timeout.
    Stalled,
    /// It was not whole within the body timeout.
    TooSlow,
    /// The connection failed while it was read.
    Broken,
}

impl Unreadable {
    /// The HTTP status and the message of its refusal.
    pub fn refusal(&self) -> (StatusCode, &'static str) {
        match self {
            Unreadable::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is over the size limit",
            ),
            Unreadable::Stalled => (
                StatusCode::REQUEST_TIMEOUT,
                "the request body stopped arriving",
            ),
            Unreadable::TooSlow => (
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time (COURIER_BODY_TIMEOUT_MS)",
            ),
            Unreadable::Broken => (
                StatusCode::BAD_REQUEST,
                "the request body could not be read",
            ),
        }
    }
}

/// Reads `body` whole: at most `limit` bytes, all of it `within` the deadline. (A request
/// whose `Content-Length` is over the limit never gets here: it is answered `413` before
/// anything else, see [`super::router`].)
pub async fn read(body: Body, limit: usize, within: Duration) -> Result<Bytes, Unreadable> {
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    let reading = async {
        let mut chunks = body.into_data_stream();
        let mut whole = Vec::new();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|err| {
                if stalled(&err) {
                    Unreadable::Stalled
                } else {
                    Unreadable::Broken
                }
            })?;
            let length = u64::try_from(whole.len() + chunk.len()).unwrap_or(u64::MAX);
            if length > limit {
                return Err(Unreadable::TooLarge);
            }
            whole.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(whole))
    };
    tokio::time::timeout(within, reading)
        .await
        .unwrap_or(Err(Unreadable::TooSlow))
}

/// How long a body is read and thrown away before a request refused unread is answered.
const DISCARD_WITHIN: Duration = Duration::from_secs(1);

/// `refusal`, the answer to a request refused before its body was read. What arrives of
/// `body` is read and thrown away first (at most `limit` bytes, for at most a second): a
/// connection closed with unread bytes is reset, and a client still sending a large body
/// would see the reset instead of the answer. A client that waits to be asked (by the
/// request's `version` and `headers`, see [`waits_to_be_asked`]) is not asked (the
/// server's `100 Continue` goes out as the body is first read) for a body only to have it
/// thrown away: it gets the refusal at once, sends nothing, and is told that the
/// connection closes after the answer.
pub async fn refuse_unread(
    mut refusal: Response,
    body: Body,
    limit: usize,
    version: Version,
    headers: &HeaderMap,
) -> Response {
    if waits_to_be_asked(version, headers) {
        refusal
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return refusal;
    }
    let mut chunks = body.into_data_stream();
    let draining = async {
        let mut read = 0;
        while let Some(Ok(chunk)) = chunks.next().await {
            read += chunk.len();
            if read > limit {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DISCARD_WITHIN, draining).await;
    refusal
}

/// Whether a request (over HTTP `version`, with `headers`) waits for a `100 Continue`
/// before it sends its body, as the HTTP server reads it: HTTP/1.1, a body announced (a
/// length above zero, or chunks), and `Expect: 100-continue` (RFC 9110, section 10.1.1;
/// an HTTP/1.0 client's `Expect` is ignored).
fn waits_to_be_asked(version: Version, headers: &HeaderMap) -> bool {
    let announced = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|length| length.to_str().ok())
            .and_then(|length| length.trim().parse::<u64>().ok())
            .is_some_and(|length| length > 0);
    version == Version::HTTP_11
        && announced
        && headers
            .get_all(header::EXPECT)
            .iter()
            .next_back()
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Whether `err`, or what caused it, is the body's stall timeout (see
/// [`super::connections`]).
fn stalled(err: &axum::Error) -> bool {
    let err: &(dyn std::error::Error + 'static) = err;
    std::iter::successors(Some(err), |err| err.source())
        .any(|err| err.is::<tower_http::timeout::TimeoutError>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn a_client_waits_to_be_asked_as_the_server_reads_it() {
        let asks = [("content-length", "10"), ("expect", "100-Continue")];
        assert!(waits_to_be_asked(Version::HTTP_11, &headers(&asks)));
        let chunked = [("transfer-encoding", "chunked"), ("expect", "100-continue")];
        assert!(waits_to_be_asked(Version::HTTP_11, &headers(&chunked)));
        // HTTP/1.0 ignores `Expect`; no body, nothing to wait with.
        assert!(!waits_to_be_asked(Version::HTTP_10, &headers(&asks)));
        let empty = [("content-length", "0"), ("expect", "100-continue")];
        assert!(!waits_to_be_asked(Version::HTTP_11, &headers(&empty)));
        let nothing = [("expect", "100-continue")];
        assert!(!waits_to_be_asked(Version::HTTP_11, &headers(&nothing)));
        // The last `Expect` counts, and only this expectation.
        let overruled = [
            ("content-length", "10"),
            ("expect", "100-continue"),
            ("expect", "something-else"),
        ];
        assert!(!waits_to_be_asked(Version::HTTP_11, &headers(&overruled)));
        let other = [("content-length", "10"), ("expect", "foo")];
        assert!(!waits_to_be_asked(Version::HTTP_11, &headers(&other)));
    }

    const LIMIT: usize = 8;
    const WITHIN: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_body_within_the_limit_is_read_whole() {
        let read = read(Body::from("12345678"), LIMIT, WITHIN).await;
        assert_eq!(read, Ok(Bytes::from_static(b"12345678")));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused() {
        let read = read(Body::from("123456789"), LIMIT, WITHIN).await;
        assert_eq!(read, Err(Unreadable::TooLarge));
        // Streamed, without a declared length, it is refused once it passes the limit.
        let chunks = futures_util::stream::iter(["1234", "5678", "9"].map(Ok::<_, std::io::Error>));
        let read = super::read(Body::from_stream(chunks), LIMIT, WITHIN).await;
        assert_eq!(read, Err(Unreadable::TooLarge));
    }

    #[tokio::test]
    async fn a_body_still_arriving_at_the_deadline_is_refused() {
        // A byte every 20 ms: never stalled, but 2 s for the whole.
        let drip = futures_util::stream::unfold(0, |sent| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            (sent < 100).then_some((Ok::<_, std::io::Error>("x"), sent + 1))
        });
        let started = std::time::Instant::now();
        let read = read(Body::from_stream(drip), 1_000, Duration::from_millis(200)).await;
        assert_eq!(read, Err(Unreadable::TooSlow));
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
