//! The operator console at `/`, GraphiQL's page, and the static assets both load from
//! `/assets/*`: all embedded in the binary, so a browser never needs another origin.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// One embedded file.
struct Asset {
    /// Its path under `/assets/`.
    path: &'static str,
    /// Its `content-type`.
    content_type: &'static str,
    /// Its bytes, as committed.
    body: &'static [u8],
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// Everything under `/assets/`. The vendored GraphiQL build and its licences are listed in
/// `assets/vendor/README.md`, with how to update them.
const ASSETS: &[Asset] = &[
    Asset {
        path: "console.js",
        content_type: JS,
        body: include_bytes!("assets/console.js"),
    },
    Asset {
        path: "console-socket.js",
        content_type: JS,
        body: include_bytes!("assets/console-socket.js"),
    },
    Asset {
        path: "console-chart.js",
        content_type: JS,
        body: include_bytes!("assets/console-chart.js"),
    },
    Asset {
        path: "console.css",
        content_type: CSS,
        body: include_bytes!("assets/console.css"),
    },
    Asset {
        path: "graphiql-init.js",
        content_type: JS,
        body: include_bytes!("assets/graphiql-init.js"),
    },
    Asset {
        path: "vendor/graphiql.min.js",
        content_type: JS,
        body: include_bytes!("assets/vendor/graphiql.min.js"),
    },
    Asset {
        path: "vendor/graphiql.min.css",
        content_type: CSS,
        body: include_bytes!("assets/vendor/graphiql.min.css"),
    },
    Asset {
        path: "vendor/react.production.min.js",
        content_type: JS,
        body: include_bytes!("assets/vendor/react.production.min.js"),
    },
    Asset {
        path: "vendor/react-dom.production.min.js",
        content_type: JS,
        body: include_bytes!("assets/vendor/react-dom.production.min.js"),
    },
    Asset {
        path: "vendor/LICENSE.graphiql",
        content_type: TEXT,
        body: include_bytes!("assets/vendor/LICENSE.graphiql"),
    },
    Asset {
        path: "vendor/LICENSE.react",
        content_type: TEXT,
        body: include_bytes!("assets/vendor/LICENSE.react"),
    },
    Asset {
        path: "vendor/LICENSE.react-dom",
        content_type: TEXT,
        body: include_bytes!("assets/vendor/LICENSE.react-dom"),
    },
];

/// The console's policy: its own scripts, styles and connections (the WebSocket included:
/// `'self'` covers `ws:`/`wss:` to the same host), nothing inline, no other origin.
pub const CONSOLE_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// GraphiQL's policy: as the console's, but its React components set inline styles and its
/// stylesheet embeds its fonts and icons as `data:` URLs.
pub const GRAPHIQL_CSP: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// `GET /`: the console. Sign-in happens in the page (`/#token=` or its form): the token stays
/// in the tab and reaches the server only as an `Authorization` header or WebSocket payload.
pub async fn page() -> Response {
    html(include_str!("assets/console.html"), CONSOLE_CSP)
}

/// GraphiQL, wired for Courier's auth: open `/graphql#token=<API token>`, or come from the
/// console in the same tab.
pub fn graphiql() -> Response {
    html(include_str!("assets/graphiql.html"), GRAPHIQL_CSP)
}

/// `GET /assets/{*path}`: one embedded file, or 404.
pub async fn asset(Path(path): Path<String>) -> Response {
    let Some(asset) = ASSETS.iter().find(|asset| asset.path == path) else {
        return (StatusCode::NOT_FOUND, "no such asset").into_response();
    };
    (
        [
            (header::CONTENT_TYPE, asset.content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // Unversioned names: the browser revalidates, which on a local link costs little.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        asset.body,
    )
        .into_response()
}

/// An HTML page under `csp`, never cached, framed or leaking its URL in a referrer.
fn html(body: &'static str, csp: &'static str) -> Response {
    let mut response = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_the_pages_name_is_served() {
        let pages = [
            include_str!("assets/console.html"),
            include_str!("assets/graphiql.html"),
            include_str!("assets/console.js"),
        ];
        for page in pages {
            for (at, _) in page.match_indices("\"assets/") {
                let rest = &page[at + "\"assets/".len()..];
                let end = rest.find(['"', '\'', '`']).unwrap_or(rest.len());
                let path = &rest[..end];
                assert!(
                    ASSETS.iter().any(|asset| asset.path == path),
                    "a page loads assets/{path}, which is not embedded"
                );
            }
        }
    }

    #[test]
    fn no_page_or_script_names_another_origin() {
        for asset in ASSETS.iter().filter(|a| !a.path.starts_with("vendor/")) {
            let text = String::from_utf8_lossy(asset.body);
            assert!(
                !text.contains("http://") && !text.contains("https://"),
                "{} names an absolute URL",
                asset.path
            );
        }
        for page in [
            include_str!("assets/console.html"),
            include_str!("assets/graphiql.html"),
        ] {
            assert!(!page.contains("http://") && !page.contains("https://"));
        }
    }
}
