//! The endpoints table shows each endpoint's flow control: its cap on requests in flight,
//! its rate limit, and a `Retry-After` pause while it lasts.

use sea_orm::ConnectionTrait;
use serde_json::json;
use uuid::Uuid;

use crate::support::console::{open_console, WAIT};
use crate::support::{Backend, TestApp, TestBrowser, TestDb};

/// Each endpoint's row shows its flow control: the cap on requests in flight, the rate
/// limit, and a `Retry-After` pause while it lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_each_endpoints_flow_control() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let body = app
        .graphql(
            &admin,
            "mutation { createEndpoint(input: {name: \"limited\", url: \"https://example.com/a\", maxInFlight: 4, rateLimit: 5}) { endpoint { id } } }",
            json!({}),
        )
        .await;
    let limited = body["data"]["createEndpoint"]["endpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"))
        .to_owned();
    let (plain, _) = app.create_endpoint(&admin, "https://example.com/b").await;
    let until = chrono::Utc::now() + chrono::Duration::minutes(10);
    app.state
        .db
        .conn()
        .execute_raw(sea_orm::Statement::from_sql_and_values(
            app.state.db.backend(),
            "UPDATE endpoints SET paused_until = $1 WHERE id = $2",
            [until.into(), Uuid::parse_str(&limited).unwrap().into()],
        ))
        .await
        .expect("pause the endpoint");

    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    let cell = |id: &str| format!("document.querySelector('[data-flow=\"{id}\"]')");
    page.wait_for(&cell(&limited), "the flow cell", WAIT).await;
    let shown: String = page.eval(&format!("{}.textContent", cell(&limited))).await;
    assert!(shown.starts_with("4 · 5/s · paused to "), "{shown}");
    let paused: bool = page
        .eval(&format!(
            "!!{}.querySelector('[data-paused-until]')",
            cell(&limited)
        ))
        .await;
    assert!(paused, "the pause is marked");
    let plain_shown: String = page.eval(&format!("{}.textContent", cell(&plain))).await;
    assert_eq!(plain_shown, "32", "the default cap");
    browser.close().await;
}
