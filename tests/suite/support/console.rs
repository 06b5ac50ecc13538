//! Checks shared by the browser tests of the console and GraphiQL.

use crate::support::{TestApp, TestPage};
use std::time::Duration;

pub const WAIT: Duration = Duration::from_secs(20);

/// Every request the page made went to `app` (or was a `data:`/`about:` URL), and none
/// carried the token.
pub fn assert_only_courier(page: &TestPage, app: &TestApp, token: &str) {
    let http = app.base_url.clone();
    let ws = http.replacen("http://", "ws://", 1);
    let requests = page.requests();
    assert!(!requests.is_empty(), "no request was recorded");
    for url in &requests {
        let ours = url.starts_with(&format!("{http}/")) || url.starts_with(&format!("{ws}/"));
        assert!(
            ours || url.starts_with("data:") || url == "about:blank",
            "the page requested another origin: {url}"
        );
        assert!(!url.contains(token), "a request URL carried the token");
    }
}

pub async fn assert_no_csp_violation(page: &TestPage) {
    let violations: Vec<String> = page.eval("window.__cspViolations").await;
    assert!(violations.is_empty(), "blocked by the CSP: {violations:?}");
}
