//! Cross-origin requests to `/graphql`, for dashboards served from another origin: which
//! origins may read its answers (`COURIER_CORS_ORIGINS`). Courier authenticates with bearer
//! tokens, never cookies, so a page of another origin can do nothing with it without a
//! token of its own; the other paths (the console, `/metrics`) are never shared.

use std::time::Duration;

use axum::http::{header, HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// The one path shared with other origins.
const API_PATH: &str = "/graphql";

/// Which origins may read `/graphql`'s answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    /// Any origin (`*`).
    Any,
    /// These origins only (`https://dashboard.example.com`, ...); none: no page of
    /// another origin may.
    Listed(Vec<HeaderValue>),
}

impl CorsOrigins {
    /// Parses `COURIER_CORS_ORIGINS`: `*`, or comma-separated origins (`scheme://host[:port]`;
    /// an empty entry is refused), or empty for none.
    pub fn parse(value: &str) -> Result<Self, String> {
        let value = value.trim();
        if value == "*" {
            return Ok(CorsOrigins::Any);
        }
        let mut origins = Vec::new();
        if value.is_empty() {
            return Ok(CorsOrigins::Listed(origins));
        }
        for (n, part) in value.split(',').map(str::trim).enumerate() {
            // A list put together from a setting that was unset: not the list meant.
            if part.is_empty() {
                return Err(format!("entry {} is empty", n + 1));
            }
            let url = url::Url::parse(part).map_err(|_| format!("{part:?} is not an origin"))?;
            let origin = url.origin().ascii_serialization();
            if !matches!(url.scheme(), "http" | "https") || origin != part.trim_end_matches('/') {
                return Err(format!(
                    "{part:?} is not an origin: write scheme://host[:port], as a browser sends it"
                ));
            }
            let origin =
                HeaderValue::from_str(&origin).map_err(|_| format!("{part:?} is not an origin"))?;
            origins.push(origin);
        }
        Ok(CorsOrigins::Listed(origins))
    }

    /// Whether `origin` is one of these.
    fn allows(&self, origin: &HeaderValue) -> bool {
        match self {
            CorsOrigins::Any => true,
            CorsOrigins::Listed(origins) => origins.contains(origin),
        }
    }

    /// The layer that answers preflights and marks `/graphql`'s answers readable by these
    /// origins. It wraps every other layer, so that refusals made before a request reaches
    /// the API (a body over the limit) are readable too; other paths are never shared.
    pub fn layer(&self) -> CorsLayer {
        let origins = self.clone();
        let allowed = AllowOrigin::predicate(move |origin, request| {
            request.uri.path() == API_PATH && origins.allows(origin)
        });
        CorsLayer::new()
            .allow_origin(allowed)
            .allow_methods([Method::GET, Method::POST])
            // Whatever headers the client asks to send (a GraphQL client library adds its
            // own, such as `apollographql-client-name`): none of them carries authority
            // a token does not.
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([header::RETRY_AFTER])
            .max_age(Duration::from_secs(600))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_any_a_list_or_none() {
        assert_eq!(CorsOrigins::parse("*"), Ok(CorsOrigins::Any));
        assert_eq!(CorsOrigins::parse(" "), Ok(CorsOrigins::Listed(Vec::new())));
        assert_eq!(
            CorsOrigins::parse("https://dash.example.com, http://localhost:3000/"),
            Ok(CorsOrigins::Listed(vec![
                HeaderValue::from_static("https://dash.example.com"),
                HeaderValue::from_static("http://localhost:3000"),
            ]))
        );
        for bad in [
            "dash.example.com",
            "https://dash.example.com/app",
            "ftp://x.example",
            "*, https://a.example",
            "https://a.example,",
            "https://a.example, ,https://b.example",
        ] {
            assert!(CorsOrigins::parse(bad).is_err(), "{bad:?}");
        }
    }
}
