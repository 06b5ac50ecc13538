//! GraphiQL in a real browser: served by Courier alone, with `#token=` running queries
//! over HTTP and subscriptions over the WebSocket, and keeping the token to the tab.

use std::time::Duration;

use serde_json::json;

use crate::support::console::{assert_no_csp_violation, assert_only_courier, WAIT};
use crate::support::fixtures::delivery_id;
use crate::support::fixtures::submit;
use crate::support::{Backend, TestApp, TestBrowser, TestDb, TestPage};

/// GraphiQL's query editor, as a JavaScript expression.
const EDITOR: &str = "document.querySelector('.graphiql-query-editor .CodeMirror')";

/// GraphiQL's answer pane's text, as a JavaScript expression.
const RESPONSE: &str = "(document.querySelector('.graphiql-response')?.textContent ?? '')";

/// Types `query` into GraphiQL, waits until it has parsed it (its tab takes the
/// operation's `name`), and runs it.
async fn run(page: &TestPage, name: &str, query: &str) {
    let text = serde_json::to_string(query).unwrap();
    page.eval::<bool>(&format!("({EDITOR}.CodeMirror.setValue({text}), true)"))
        .await;
    page.wait_for(
        &format!("[...document.querySelectorAll('.graphiql-tab')].some((t) => t.textContent.includes('{name}'))"),
        "GraphiQL to parse the operation",
        WAIT,
    )
    .await;
    page.click(".graphiql-execute-button").await;
}

/// GraphiQL at `/graphql` renders from Courier alone and, with `#token=`, runs a query
/// over HTTP and a subscription over the WebSocket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graphiql_renders_offline_and_uses_the_token() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/graphiql")
        .await;

    let browser = TestBrowser::launch().await;
    let page = browser
        .open(&app.url(&format!("/graphql#token={admin}")))
        .await;
    page.wait_for(EDITOR, "GraphiQL's editor", WAIT).await;
    let href: String = page.eval("location.href").await;
    assert_eq!(href, app.url("/graphql"), "the token left the address bar");

    let response = RESPONSE;
    run(
        &page,
        "Endpoints",
        "query Endpoints { endpoints(first: 5) { edges { node { id url } } } }",
    )
    .await;
    page.wait_for(
        &format!("{response}.includes('{endpoint}')"),
        "the query's answer",
        WAIT,
    )
    .await;

    run(
        &page,
        "Watch",
        "subscription Watch { deliveryStateChanged { deliveryId state } }",
    )
    .await;
    // Submit until an event shows in GraphiQL's answer: the subscription starts
    // asynchronously, and only what happens after it starts is streamed.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let id =
            delivery_id(&submit(&app, &admin, &endpoint, json!({ "graphiql": true }), None).await);
        let shown: bool = page.eval(&format!("{response}.includes('{id}')")).await;
        if shown {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let shown: bool = page.eval(&format!("{response}.includes('{id}')")).await;
        if shown {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no subscription event reached GraphiQL"
        );
    }
    let ws = app.base_url.replacen("http://", "ws://", 1) + "/graphql/ws";
    assert!(page.requests().contains(&ws), "{:?}", page.requests());
    assert_only_courier(&page, &app, &admin);
    assert_no_csp_violation(&page).await;
    browser.close().await;
}

/// GraphiQL keeps the token to the tab: never shown in its headers editor, never in
/// `localStorage` (where earlier versions let GraphiQL keep it with its history: removed
/// on load), and what GraphiQL remembers of the tab goes with the console's sign-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graphiql_keeps_the_token_to_the_tab() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    // What an earlier version left: history with the token in its headers.
    let left_before = "if (!sessionStorage.getItem('seeded')) { \
        sessionStorage.setItem('seeded', '1'); \
        localStorage.setItem('graphiql:queries', JSON.stringify({ queries: [{ query: '{ a }', \
          headers: '{\"Authorization\": \"Bearer courier_left_before\"}' }] })); }";

    let browser = TestBrowser::launch().await;
    let page = browser
        .open_with(&app.url(&format!("/graphql#token={admin}")), left_before)
        .await;
    page.wait_for(EDITOR, "GraphiQL's editor", WAIT).await;
    run(&page, "Mine", "query Mine { currentKey { role } }").await;
    page.wait_for(
        &format!("{RESPONSE}.includes('ADMIN')"),
        "the query's answer",
        WAIT,
    )
    .await;

    let shown: String = page.eval("document.body.innerText").await;
    assert!(!shown.contains(&admin), "the page shows the token");
    let stored: Vec<String> = page
        .eval("Object.keys(localStorage).map((key) => key + '=' + localStorage.getItem(key))")
        .await;
    assert!(
        stored.iter().all(|entry| !entry.starts_with("graphiql:")
            && !entry.contains(&admin)
            && !entry.contains("left_before")),
        "{stored:?}"
    );
    let remembered: bool = page
        .eval("Object.keys(sessionStorage).some((key) => key.startsWith('graphiql:'))")
        .await;
    assert!(remembered, "GraphiQL keeps its tabs in the tab");

    // The console in the same tab, signed in with the tab's token; its sign-out takes
    // GraphiQL's memory of the tab too.
    page.navigate(&app.url("/")).await;
    crate::support::console::wait_live(&page).await;
    page.click("#sign-out").await;
    page.wait_for(
        "!document.getElementById('sign-in').hidden",
        "the sign-in form",
        WAIT,
    )
    .await;
    let left: Vec<String> = page.eval("Object.keys(sessionStorage)").await;
    assert!(
        left.iter()
            .all(|key| !key.starts_with("graphiql:") && key != "courier.token"),
        "{left:?}"
    );
    assert_only_courier(&page, &app, &admin);
    browser.close().await;
}
