//! GraphQL-over-HTTP content negotiation: which media type to answer with, and which status codes that implies.

use axum::http::{header, HeaderMap};

/// The GraphQL-over-HTTP response media type.
pub const GRAPHQL_RESPONSE_JSON: &str = "application/graphql-response+json";
/// The legacy response media type, used only when the client asks for it.
pub const APPLICATION_JSON: &str = "application/json";

/// The media type a response is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaType {
    /// `application/graphql-response+json`: request errors get 4xx statuses.
    GraphqlResponse,
    /// `application/json`: every well-formed request gets 200.
    Json,
}

impl MediaType {
    /// The `Content-Type` header value.
    pub fn content_type(self) -> &'static str {
        match self {
            MediaType::GraphqlResponse => "application/graphql-response+json; charset=utf-8",
            MediaType::Json => "application/json; charset=utf-8",
        }
    }
}

/// Picks the response media type from `Accept`; `None` when nothing acceptable was offered.
/// No header, `*/*` and `application/*` get `application/json` (what a client that did
/// not ask for the newer type can be assumed to understand, as the specification advises);
/// `application/graphql-response+json` is chosen when named, and wins ties with `application/json`.
pub fn response_media_type(headers: &HeaderMap) -> Option<MediaType> {
    // No `Accept` it can read: as if there were none.
    if headers
        .get_all(header::ACCEPT)
        .iter()
        .all(|value| value.to_str().is_err())
    {
        return Some(MediaType::Json);
    }
    let mut best: Option<(f32, MediaType)> = None;
    for (media, quality) in accepted(headers) {
        let candidate = match media.as_str() {
            GRAPHQL_RESPONSE_JSON => MediaType::GraphqlResponse,
            APPLICATION_JSON | "*/*" | "application/*" => MediaType::Json,
            _ => continue,
        };
        if quality <= 0.0 {
            continue;
        }
        let better = match best {
            None => true,
            Some((q, current)) => {
                quality > q
                    || (quality == q
                        && current == MediaType::Json
                        && candidate == MediaType::GraphqlResponse)
            }
        };
        if better {
            best = Some((quality, candidate));
        }
    }
    best.map(|(_, media)| media)
}

/// Each media range of the request's `Accept` headers, lowercased, with its quality (`q`,
/// 1 when not given).
pub fn accepted(headers: &HeaderMap) -> impl Iterator<Item = (String, f32)> + '_ {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let quality = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            (media, quality)
        })
}

/// Whether a request body is declared as JSON (`application/json`) in UTF-8: a `charset`
/// parameter, if there is one, must say so (JSON exchanged between systems is UTF-8, RFC
/// 8259; a body declared in another one would be read wrongly, so it is refused).
pub fn is_json_request(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let mut parts = value.split(';');
    let media = parts.next().unwrap_or_default();
    media.trim().eq_ignore_ascii_case(APPLICATION_JSON)
        && parts.all(|parameter| match parameter.split_once('=') {
            Some((name, charset)) if name.trim().eq_ignore_ascii_case("charset") => {
                let charset = charset.trim().trim_matches('"');
                charset.eq_ignore_ascii_case("utf-8") || charset.eq_ignore_ascii_case("utf8")
            }
            _ => true,
        })
}

/// Whether a request body is sent as it is: no `Content-Encoding`, or only `identity`.
/// Courier decodes no content coding, so a body declared compressed is refused rather than
/// read as if it were not.
pub fn is_unencoded(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .all(|value| {
            value.to_str().is_ok_and(|value| {
                value
                    .split(',')
                    .map(str::trim)
                    .all(|coding| coding.is_empty() || coding.eq_ignore_ascii_case("identity"))
            })
        })
}

/// Whether the client names a JSON response type in `Accept` (a GraphQL client, not a
/// browser or a bare request).
pub fn names_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|range| range.split(';').next())
        .any(|media| {
            let media = media.trim();
            media.eq_ignore_ascii_case(APPLICATION_JSON)
                || media.eq_ignore_ascii_case("application/graphql-response+json")
        })
}

/// Whether the client prefers an HTML page (a browser opening GraphiQL).
pub fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_json_request_is_declared_json_in_utf8() {
        let declared = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
            is_json_request(&headers)
        };
        for json in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=\"UTF-8\"",
            "application/json; charset=utf8; foo=bar",
        ] {
            assert!(declared(json), "{json}");
        }
        for other in [
            "text/plain",
            "application/json; charset=utf-16",
            "application/json; charset=iso-8859-1",
            "application/jsonx",
        ] {
            assert!(!declared(other), "{other}");
        }
        assert!(!is_json_request(&HeaderMap::new()));
    }

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(header::ACCEPT, value);
        }
        headers
    }

    #[test]
    fn negotiates_like_the_graphql_over_http_spec() {
        assert_eq!(
            response_media_type(&HeaderMap::new()),
            Some(MediaType::Json)
        );
        assert_eq!(response_media_type(&accept("*/*")), Some(MediaType::Json));
        assert_eq!(
            response_media_type(&accept("application/*")),
            Some(MediaType::Json)
        );
        assert_eq!(
            response_media_type(&accept("*/*, application/graphql-response+json")),
            Some(MediaType::GraphqlResponse)
        );
        assert_eq!(
            response_media_type(&accept("application/json")),
            Some(MediaType::Json)
        );
        assert_eq!(
            response_media_type(&accept(
                "application/graphql-response+json, application/json;q=0.9"
            )),
            Some(MediaType::GraphqlResponse)
        );
        assert_eq!(
            response_media_type(&accept(
                "application/graphql-response+json;q=0.5, application/json"
            )),
            Some(MediaType::Json)
        );
        assert_eq!(response_media_type(&accept("text/plain")), None);
    }
}
