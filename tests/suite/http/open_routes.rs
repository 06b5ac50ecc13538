//! The routes that answer without a key: GraphiQL, liveness, readiness and metrics, and
//! how readiness and requests answer once the database is gone.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::fixtures::{eventually, submit};
use crate::support::{Backend, TestApp, TestDb};

/// Whether `response` says it varies by `Accept`.
fn varies_by_accept(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get_all("vary")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|name| name.trim().eq_ignore_ascii_case("accept"))
}

#[tokio::test]
async fn graphiql_health_readiness_and_metrics_answer_without_a_key() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let graphiql = app
        .request(Method::GET, "/graphql")
        .header("accept", "text/html")
        .send()
        .await
        .expect("answered");
    assert_eq!(graphiql.status(), StatusCode::OK);
    // The same address answers the page or a query's result by `Accept`: caches are told.
    assert!(varies_by_accept(&graphiql), "{:?}", graphiql.headers());
    assert!(graphiql
        .text()
        .await
        .unwrap_or_default()
        .to_lowercase()
        .contains("graphiql"));
    // A bare GET (no Accept, or */*) gets the page too; a GraphQL client that asks for JSON
    // and sends no document gets a GraphQL error instead of HTML.
    let bare = app
        .request(Method::GET, "/graphql")
        .send()
        .await
        .expect("answered");
    assert_eq!(bare.status(), StatusCode::OK);
    for accept in ["application/graphql-response+json", "application/json"] {
        let no_query = app
            .request(Method::GET, "/graphql")
            .header("accept", accept)
            .send()
            .await
            .expect("answered");
        assert_eq!(no_query.status(), StatusCode::BAD_REQUEST, "{accept}");
        assert!(
            varies_by_accept(&no_query),
            "{accept}: {:?}",
            no_query.headers()
        );
        let body: serde_json::Value = no_query.json().await.unwrap_or_default();
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "BAD_USER_INPUT",
            "{accept}: {body}"
        );
    }
    // A POST's answer too, a refusal included.
    let without_key = app
        .request(Method::POST, "/graphql")
        .json(&json!({ "query": "{ __typename }" }))
        .send()
        .await
        .expect("answered");
    assert_eq!(without_key.status(), StatusCode::UNAUTHORIZED);
    assert!(
        varies_by_accept(&without_key),
        "{:?}",
        without_key.headers()
    );

    for path in ["/healthz", "/readyz"] {
        let response = app
            .request(Method::GET, path)
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }

    let admin = app.admin_token().await;
    app.graphql(&admin, "{ endpoints { edges { cursor } } }", json!({}))
        .await;
    let metrics = app
        .request(Method::GET, "/metrics")
        .send()
        .await
        .expect("answered");
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = metrics.text().await.unwrap_or_default();
    assert!(
        text.contains(
            "courier_http_requests_total{route=\"/graphql\",method=\"POST\",status=\"200\"}"
        ),
        "{text}"
    );
    assert!(text.contains("courier_graphql_operations_total{kind=\"query\",operation=\"endpoints\",outcome=\"ok\"} 1"), "{text}");
    assert!(
        text.contains("courier_http_request_duration_seconds_bucket"),
        "{text}"
    );
    // The Prometheus text format unless OpenMetrics is asked for, as Prometheus asks.
    assert!(
        text.contains("# TYPE courier_http_requests_total counter\n") && !text.contains("# EOF"),
        "{text}"
    );
    let openmetrics = app
        .request(Method::GET, "/metrics")
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .send()
        .await
        .expect("answered");
    let kind = openmetrics.headers()["content-type"].to_str().unwrap_or("");
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    let text = openmetrics.text().await.unwrap_or_default();
    assert!(
        text.contains("# TYPE courier_http_requests counter\n") && text.ends_with("# EOF\n"),
        "{text}"
    );

    let missing = app
        .request(Method::GET, "/no-such-page")
        .send()
        .await
        .expect("answered");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);

    // A client may send any token as a method: those HTTP does not define share one
    // series, so the metrics cannot be made to grow without bound.
    for n in 0..50 {
        let method = Method::from_bytes(format!("M{n}").as_bytes()).expect("a method token");
        app.request(method, "/healthz")
            .send()
            .await
            .expect("answered");
    }
    let text = app
        .request(Method::GET, "/metrics")
        .send()
        .await
        .expect("answered")
        .text()
        .await
        .unwrap_or_default();
    let series: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("courier_http_requests_total{route=\"/healthz\""))
        .collect();
    assert!(
        series.iter().any(|line| line.contains("method=\"other\"")),
        "{series:?}"
    );
    assert!(series.len() <= 3, "{series:?}");

    let url = app.url("/healthz");
    tokio::time::timeout(std::time::Duration::from_secs(10), app.stop())
        .await
        .expect("the server stops promptly when shut down");
    assert!(
        crate::support::http_client().get(url).send().await.is_err(),
        "nothing listens after shutdown"
    );
}

#[tokio::test]
async fn readiness_fails_when_the_database_is_gone() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    app.state
        .db
        .conn()
        .close_by_ref()
        .await
        .expect("close the pool");
    let response = app
        .request(Method::GET, "/readyz")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);

    // Requests are told to come back later: the cause is logged, never sent.
    let query = json!({ "query": "{ endpoints { edges { cursor } } }" });
    let refused = app.post_graphql(Some("courier_any"), &query).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key("retry-after"));
    let text = refused.text().await.unwrap_or_default();
    assert!(text.contains("SERVICE_UNAVAILABLE"), "{text}");
    for leak in ["pool", "sqlite", "SELECT", "closed"] {
        assert!(
            !text.contains(leak),
            "the cause leaked to the client: {text}"
        );
    }
    let health = app
        .request(Method::GET, "/healthz")
        .send()
        .await
        .expect("answered");
    assert_eq!(
        health.status(),
        StatusCode::OK,
        "liveness does not depend on the database"
    );
}

/// The `courier_deliveries_due` value in a `/metrics` answer.
async fn scraped_due(app: &TestApp) -> Option<i64> {
    app.scraped("courier_deliveries_due").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_at_once_read_the_due_queue_and_later_ones_see_it_move() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn_with(&db, |config| config.worker_concurrency = 0).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    for n in 0..3 {
        submit(&app, &admin, &endpoint, json!({ "n": n }), None).await;
    }
    // Forty anonymous scrapes at once: one count of the queue, every scrape answered with it.
    let scrapes = (0..40).map(|_| scraped_due(&app));
    let seen = futures_util::future::join_all(scrapes).await;
    assert!(seen.iter().all(|due| *due == Some(3)), "{seen:?}");

    for n in 3..5 {
        submit(&app, &admin, &endpoint, json!({ "n": n }), None).await;
    }
    eventually(
        "a scrape after the interval counts the queue again",
        Duration::from_secs(10),
        || async { scraped_due(&app).await == Some(5) },
    )
    .await;
}
