//! What the receiver answered an attempt, kept for operators: the start of the body and
//! the headers, read with a bound so that a receiver streaming for ever is cut off.

/// How much of a response body is read before the connection is released: a receiver
/// that streams more is cut off here, never buffered.
const MAX_RESPONSE_BYTES: usize = 16 * 1024;

/// How much of a response body an attempt keeps, for operators to read.
pub const KEPT_BODY_BYTES: usize = 4 * 1024;

/// How much of the response headers an attempt keeps: each value is cut at
/// [`KEPT_HEADER_VALUE_BYTES`], and headers past this many bytes in all are left out.
const KEPT_HEADER_BYTES: usize = 8 * 1024;

/// The longest header value an attempt keeps.
const KEPT_HEADER_VALUE_BYTES: usize = 1024;

/// What the receiver answered, as kept with the attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiverAnswer {
    /// The first [`KEPT_BODY_BYTES`] of the body as text (invalid UTF-8 and NULs replaced).
    pub body: String,
    /// The headers as a JSON object text, name to value (repeated headers joined by `, `).
    pub headers: String,
}

impl ReceiverAnswer {
    /// Reads the headers and at most [`MAX_RESPONSE_BYTES`] of the body of `response`
    /// (enough for the connection to be reused when the body is small), keeping the start.
    pub async fn read(response: &mut reqwest::Response) -> Self {
        let headers = kept_headers(response.headers());
        let mut kept = Vec::new();
        let mut read = 0;
        while read < MAX_RESPONSE_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    read += chunk.len();
                    let room = KEPT_BODY_BYTES.saturating_sub(kept.len());
                    kept.extend_from_slice(&chunk[..room.min(chunk.len())]);
                }
                Ok(None) | Err(_) => break,
            }
        }
        ReceiverAnswer {
            body: kept_text(&kept),
            headers,
        }
    }
}

/// The kept start of a body as text: a multi-byte character cut at the limit is dropped,
/// other invalid UTF-8 is replaced, and so are NULs (which PostgreSQL's text refuses).
pub fn kept_text(bytes: &[u8]) -> String {
    let bytes = &bytes[..bytes.len().min(KEPT_BODY_BYTES)];
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(cut) if cut.error_len().is_none() => {
            String::from_utf8_lossy(&bytes[..cut.valid_up_to()])
        }
        Err(_) => String::from_utf8_lossy(bytes),
    };
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text.into_owned()
    }
}

/// The response headers as a JSON object text, bounded (see [`KEPT_HEADER_BYTES`]).
fn kept_headers(headers: &reqwest::header::HeaderMap) -> String {
    let mut kept = serde_json::Map::new();
    let mut size = 0;
    for name in headers.keys() {
        let joined = headers
            .get_all(name)
            .iter()
            .map(|value| String::from_utf8_lossy(value.as_bytes()))
            .collect::<Vec<_>>()
            .join(", ");
        let value = truncate_on_char(&joined, KEPT_HEADER_VALUE_BYTES).replace('\0', "\u{FFFD}");
        size += name.as_str().len() + value.len() + 6;
        if size > KEPT_HEADER_BYTES {
            break;
        }
        kept.insert(name.as_str().to_owned(), serde_json::Value::String(value));
    }
    serde_json::Value::Object(kept).to_string()
}

/// At most `limit` bytes of `text`, cut on a character boundary.
fn truncate_on_char(text: &str, limit: usize) -> &str {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn kept_text_is_bounded_valid_text() {
        assert_eq!(kept_text(b"ok"), "ok");
        assert_eq!(kept_text(b"a\0b\xffc"), "a\u{FFFD}b\u{FFFD}c");
        let long = vec![b'y'; 10_000];
        assert_eq!(kept_text(&long).len(), KEPT_BODY_BYTES);
        // A three-byte character cut by the limit is dropped, not half-kept.
        let mut cut = vec![b'a'; KEPT_BODY_BYTES - 1];
        cut.extend_from_slice("€".as_bytes());
        assert_eq!(kept_text(&cut), "a".repeat(KEPT_BODY_BYTES - 1));
    }

    #[test]
    fn kept_headers_are_a_bounded_object() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("x-one", HeaderValue::from_static("1"));
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        headers.insert("x-long", HeaderValue::from_str(&"z".repeat(5_000)).unwrap());
        let kept: serde_json::Value = serde_json::from_str(&kept_headers(&headers)).unwrap();
        assert_eq!(kept["x-one"], "1");
        assert_eq!(kept["set-cookie"], "a=1, b=2");
        assert_eq!(
            kept["x-long"].as_str().unwrap().len(),
            KEPT_HEADER_VALUE_BYTES
        );
        let mut many = reqwest::header::HeaderMap::new();
        for n in 0..100 {
            let name =
                reqwest::header::HeaderName::from_bytes(format!("x-h{n}").as_bytes()).unwrap();
            many.insert(name, HeaderValue::from_str(&"v".repeat(500)).unwrap());
        }
        assert!(kept_headers(&many).len() <= KEPT_HEADER_BYTES + 2);
    }
}
