//! The console and GraphiQL behind a reverse proxy that serves Courier under a path prefix
//! (`/courier/`, where a portal link built from `COURIER_PUBLIC_URL` points): every file,
//! request and subscription goes through the prefix, in a real browser.

use serde_json::json;

use crate::support::console::{assert_no_csp_violation, row_in_state, wait_live, WAIT};
use crate::support::fixtures::{delivery_id, endpoint_on, quick_worker, submit};
use crate::support::prefix_proxy::PrefixProxy;
use crate::support::{Backend, Receiver, TestApp, TestBrowser, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_and_graphiql_work_under_a_path_prefix() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "prefixed").await;
    let proxy = PrefixProxy::start(app.addr, "/courier").await;

    let browser = TestBrowser::launch().await;
    let page = browser.open(&proxy.url(&format!("/#token={admin}"))).await;
    wait_live(&page).await;
    page.wait_for(
        &format!("document.querySelector('#endpoints tr[data-endpoint-id=\"{endpoint}\"]')"),
        "the endpoint's row",
        WAIT,
    )
    .await;
    let href: String = page.eval("location.href").await;
    assert_eq!(href, proxy.url("/"), "the token left the address bar");
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await);
    page.wait_for(&row_in_state(&id, "DELIVERED"), "a DELIVERED row", WAIT)
        .await;
    let outside: Vec<String> = page
        .eval("performance.getEntriesByType('resource').map((e) => new URL(e.name).pathname).filter((p) => !p.startsWith('/courier/'))")
        .await;
    assert!(
        outside.is_empty(),
        "requests outside the prefix: {outside:?}"
    );
    assert_no_csp_violation(&page).await;

    let graphiql = browser.open(&proxy.url("/graphql")).await;
    graphiql
        .wait_for(
            "document.querySelector('.graphiql-query-editor .CodeMirror') !== null",
            "GraphiQL's editor",
            WAIT,
        )
        .await;
    browser.close().await;
}
