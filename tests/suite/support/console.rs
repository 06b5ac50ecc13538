//! Checks and helpers shared by the browser tests of the console and GraphiQL: opening the
//! console signed in, finding feed rows, choosing an endpoint, and what a page may request.

use crate::support::{TestApp, TestBrowser, TestPage};
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

/// The feed element of delivery `id`, as a JavaScript expression.
pub fn row(id: &str) -> String {
    format!("document.querySelector('[data-delivery-id=\"{id}\"]')")
}

/// The feed element of delivery `id` in `state`, as a JavaScript expression.
pub fn row_in_state(id: &str, state: &str) -> String {
    format!("document.querySelector('[data-delivery-id=\"{id}\"][data-state=\"{state}\"]')")
}

/// Opens the console signed in through the fragment and waits until its feed is live.
pub async fn open_console(
    browser: &TestBrowser,
    app: &TestApp,
    token: &str,
    script: &str,
) -> TestPage {
    let page = browser
        .open_with(&app.url(&format!("/#token={token}")), script)
        .await;
    wait_live(&page).await;
    page
}

/// Waits until the console's feed is live.
pub async fn wait_live(page: &TestPage) {
    page.wait_for(
        "document.getElementById('connection').dataset.status === 'live'",
        "the feed to go live",
        WAIT,
    )
    .await;
}

/// Chooses `endpoint` in the endpoints table (the feed filtered to it) and waits for its
/// actions to show.
pub async fn choose_endpoint(page: &TestPage, endpoint: &str) {
    page.click(&format!("[data-filter-endpoint=\"{endpoint}\"]"))
        .await;
    page.wait_for(
        "!document.getElementById('endpoint-actions').hidden",
        "the chosen endpoint's actions",
        WAIT,
    )
    .await;
}
