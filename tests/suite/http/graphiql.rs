//! GraphiQL in a real browser: served by Courier alone, and with `#token=` running queries
//! over HTTP and subscriptions over the WebSocket.

use std::time::Duration;

use serde_json::json;

use crate::support::console::{assert_no_csp_violation, assert_only_courier, WAIT};
use crate::support::fixtures::delivery_id;
use crate::support::fixtures::submit;
use crate::support::{Backend, TestApp, TestBrowser, TestDb};

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
    let editor = "document.querySelector('.graphiql-query-editor .CodeMirror')";
    page.wait_for(editor, "GraphiQL's editor", WAIT).await;
    let href: String = page.eval("location.href").await;
    assert_eq!(href, app.url("/graphql"), "the token left the address bar");

    let response = "(document.querySelector('.graphiql-response')?.textContent ?? '')";
    // Type an operation, wait until GraphiQL has parsed it (its tab takes the operation's
    // name), and run it.
    let run = |name: &'static str, query: &'static str| {
        let page = &page;
        async move {
            let text = serde_json::to_string(query).unwrap();
            page.eval::<bool>(&format!("({editor}.CodeMirror.setValue({text}), true)"))
                .await;
            page.wait_for(
                &format!("[...document.querySelectorAll('.graphiql-tab')].some((t) => t.textContent.includes('{name}'))"),
                "GraphiQL to parse the operation",
                WAIT,
            )
            .await;
            page.click(".graphiql-execute-button").await;
        }
    };
    run(
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
