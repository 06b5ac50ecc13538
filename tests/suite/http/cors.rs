//! Cross-origin calls to `/graphql`, as a dashboard served from another origin makes them:
//! preflights answered, answers readable by the origins allowed (any by default), nothing
//! else of Courier shared, and a real browser's `fetch` from another origin.

use reqwest::Method;
use serde_json::json;

use crate::support::{Backend, TestApp, TestBrowser, TestDb};

const DASHBOARD: &str = "https://dash.example.com";

/// The `access-control-allow-origin` of `path`'s answer to a request from `origin`.
async fn allowed_origin(app: &TestApp, method: Method, path: &str, origin: &str) -> Option<String> {
    let response = app
        .request(method, path)
        .header("origin", origin)
        .send()
        .await
        .expect("answered");
    response
        .headers()
        .get("access-control-allow-origin")
        .map(|value| value.to_str().expect("text").to_owned())
}

/// By default any origin may call `/graphql`: its preflight is answered with the methods
/// and whatever headers a GraphQL client sends, and its answers (errors included) are readable, with
/// `Retry-After`; the console, its assets and `/metrics` are never shared.
#[tokio::test]
async fn any_origin_may_call_the_api_and_nothing_else() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let preflight = app
        .request(Method::OPTIONS, "/graphql")
        .header("origin", DASHBOARD)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type, traceparent, apollographql-client-name",
        )
        .send()
        .await
        .expect("answered");
    assert!(preflight.status().is_success(), "{}", preflight.status());
    let headers = preflight.headers();
    assert_eq!(headers["access-control-allow-origin"], DASHBOARD);
    let allowed = headers["access-control-allow-headers"]
        .to_str()
        .expect("text")
        .to_ascii_lowercase();
    for header in [
        "authorization",
        "content-type",
        "traceparent",
        "apollographql-client-name",
    ] {
        assert!(allowed.contains(header), "{allowed}");
    }
    assert!(headers["access-control-allow-methods"]
        .to_str()
        .expect("text")
        .contains("POST"));

    let answer = app
        .request(Method::POST, "/graphql")
        .header("origin", DASHBOARD)
        .json(&json!({ "query": "{ currentKey { role } }" }))
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.headers()["access-control-allow-origin"], DASHBOARD);
    let body: serde_json::Value = answer.json().await.expect("JSON");
    assert_eq!(body["errors"][0]["extensions"]["code"], "UNAUTHENTICATED");

    // A refusal made before the request reaches the API is readable too.
    let oversized = app
        .request(Method::POST, "/graphql")
        .header("origin", DASHBOARD)
        .header("content-type", "application/json")
        .body(vec![b' '; 2 * 1024 * 1024])
        .send()
        .await
        .expect("answered");
    assert_eq!(oversized.status(), 413);
    assert_eq!(
        oversized.headers()["access-control-allow-origin"],
        DASHBOARD
    );

    for path in [
        "/",
        "/metrics",
        "/healthz",
        "/assets/console.js",
        "/no-such-page",
    ] {
        assert_eq!(
            allowed_origin(&app, Method::GET, path, DASHBOARD).await,
            None,
            "{path} is shared"
        );
    }
}

/// `COURIER_CORS_ORIGINS` set to a list allows those origins only; set empty, none.
#[tokio::test]
async fn listed_origins_only_or_none() {
    let db = TestDb::new(Backend::Sqlite).await;
    let listed = TestApp::spawn_with(&db, |config| {
        config.cors_origins =
            courier::config::CorsOrigins::parse(&format!("{DASHBOARD}, http://localhost:3000"))
                .expect("origins");
    })
    .await;
    assert_eq!(
        allowed_origin(&listed, Method::POST, "/graphql", DASHBOARD)
            .await
            .as_deref(),
        Some(DASHBOARD)
    );
    assert_eq!(
        allowed_origin(&listed, Method::POST, "/graphql", "https://evil.example").await,
        None
    );
    let none = TestApp::spawn_with(&db, |config| {
        config.cors_origins = courier::config::CorsOrigins::parse("").expect("none");
    })
    .await;
    assert_eq!(
        allowed_origin(&none, Method::POST, "/graphql", DASHBOARD).await,
        None
    );
}

/// A page of another origin, in a real browser, calls `/graphql` with its token (the
/// preflight the `Authorization` header needs included) and reads the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_origin_reads_the_api_in_a_browser() {
    let db = TestDb::new(Backend::Sqlite).await;
    let api = TestApp::spawn(&db).await;
    let admin = api.admin_token().await;
    // Another origin (another port): a plain page of a second instance, which sets no
    // content policy of its own.
    let elsewhere = TestApp::spawn(&TestDb::new(Backend::Sqlite).await).await;
    let browser = TestBrowser::launch().await;
    let page = browser.open(&elsewhere.url("/healthz")).await;
    let role: String = page
        .eval(&format!(
            "fetch('{}', {{ method: 'POST', headers: {{ 'authorization': 'Bearer {admin}', \
             'content-type': 'application/json' }}, body: JSON.stringify({{ query: '{{ currentKey {{ role }} }}' }}) }})\
             .then((answer) => answer.json()).then((body) => body.data.currentKey.role)",
            api.url("/graphql")
        ))
        .await;
    assert_eq!(role, "ADMIN");
    browser.close().await;
}
