//! Race 5: a rate limit shared by every Courier process, counted by one upsert per request.

use std::sync::Arc;

use reqwest::StatusCode;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{json, Value};
use tokio::sync::Barrier;

use crate::on_every_backend;
use crate::submissions::{row_counts, submit, SUBMIT};
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

/// A window so long it cannot roll over during a test.
const LONG_WINDOW_SECS: u64 = 1_000_000_000;

async fn limited_app(db: &TestDb, limit: u32) -> TestApp {
    TestApp::spawn_with(db, |config| {
        config.rate_limit = Some(limit);
        config.rate_limit_window_secs = LONG_WINDOW_SECS;
    })
    .await
}

/// The sum of every counter row of the `submit` limiter.
async fn counted(app: &TestApp) -> i64 {
    let row = app
        .state
        .db
        .conn()
        .query_one_raw(Statement::from_string(
            app.state.db.backend(),
            "SELECT CAST(COALESCE(SUM(attempts), 0) AS BIGINT) AS total FROM rate_limit_counters WHERE limiter = 'submit'",
        ))
        .await
        .expect("query")
        .expect("row");
    row.try_get("", "total").expect("total")
}

async fn concurrent_submits_over_independent_apps_admit_exactly_the_limit(backend: Backend) {
    const LIMIT: u32 = 5;
    const REQUESTS: usize = 24;
    let db = TestDb::new(backend).await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(limited_app(&db, LIMIT).await);
    }
    let admin = apps[0].admin_token().await;
    let (endpoint, _) = apps[0]
        .create_endpoint(&admin, "https://example.com/hook")
        .await;

    let barrier = Arc::new(Barrier::new(REQUESTS));
    let requests = (0..REQUESTS).map(|i| {
        let (app, barrier, admin, endpoint) = (
            &apps[i % apps.len()],
            barrier.clone(),
            admin.clone(),
            endpoint.clone(),
        );
        async move {
            barrier.wait().await;
            submit(app, &admin, &endpoint, json!({ "n": i }), None).await
        }
    });
    let answers: Vec<Value> = futures_util::future::join_all(requests).await;
    let admitted = answers
        .iter()
        .filter(|a| a["data"]["submit"]["created"] == true)
        .count();
    let limited: Vec<&Value> = answers
        .iter()
        .filter(|a| gql_error_code(a) == Some("RATE_LIMITED"))
        .collect();
    assert_eq!(admitted, LIMIT as usize, "exactly the limit is admitted");
    assert_eq!(
        limited.len(),
        REQUESTS - LIMIT as usize,
        "the rest are refused: {answers:?}"
    );
    for refusal in limited {
        let retry_after = refusal["errors"][0]["extensions"]["retryAfter"]
            .as_u64()
            .expect("retryAfter");
        assert!(retry_after >= 1, "{refusal}");
    }
    assert_eq!(
        counted(&apps[0]).await,
        REQUESTS as i64,
        "no increment was lost"
    );
    assert_eq!(
        row_counts(&apps[0]).await,
        (u64::from(LIMIT), u64::from(LIMIT))
    );

    // A fresh application that never saw this client finds the budget already spent.
    let fresh = limited_app(&db, LIMIT).await;
    let response = fresh
        .post_graphql(Some(&admin), &json!({ "query": SUBMIT, "variables": { "input": { "endpointId": endpoint, "payload": {} } } }))
        .await;
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Value = response.json().await.expect("json");
    assert_eq!(gql_error_code(&body), Some("RATE_LIMITED"), "{body}");
    let header: u64 = retry_after
        .expect("a Retry-After header")
        .parse()
        .expect("seconds");
    assert_eq!(
        Some(header),
        body["errors"][0]["extensions"]["retryAfter"].as_u64()
    );
}

async fn a_business_rollback_does_not_refund_quota(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = limited_app(&db, 2).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;

    let first = submit(&app, &admin, &endpoint, json!({ "a": 1 }), Some("k")).await;
    assert_eq!(first["data"]["submit"]["created"], true, "{first}");
    // Counted, then refused by the business rules: the quota stays spent.
    let conflict = submit(&app, &admin, &endpoint, json!({ "a": 2 }), Some("k")).await;
    assert_eq!(
        gql_error_code(&conflict),
        Some("IDEMPOTENCY_CONFLICT"),
        "{conflict}"
    );
    let third = submit(&app, &admin, &endpoint, json!({ "a": 3 }), None).await;
    assert_eq!(gql_error_code(&third), Some("RATE_LIMITED"), "{third}");
    assert_eq!(counted(&app).await, 3);
    assert_eq!(row_counts(&app).await, (1, 1));

    // Each API key has its own budget.
    let other = app.admin_token().await;
    let body = submit(&app, &other, &endpoint, json!({ "a": 4 }), None).await;
    assert_eq!(body["data"]["submit"]["created"], true, "{body}");
}

async fn a_broken_counter_lets_requests_through_and_is_counted(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = limited_app(&db, 1).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    app.state
        .db
        .conn()
        .execute_unprepared("DROP TABLE rate_limit_counters")
        .await
        .expect("drop");
    for n in 0..2 {
        let body = submit(&app, &admin, &endpoint, json!({ "n": n }), None).await;
        assert_eq!(body["data"]["submit"]["created"], true, "fail open: {body}");
    }
    let metrics = app
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = metrics.text().await.expect("text");
    assert!(text.contains("courier_rate_limit_errors_total 2"), "{text}");
}

async fn ended_windows_are_pruned(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| {
        config.rate_limit = Some(10);
        config.rate_limit_window_secs = 60;
    })
    .await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    submit(&app, &admin, &endpoint, json!({}), None).await;
    let backend = app.state.db.backend();
    app.state
        .db
        .conn()
        .execute_raw(Statement::from_sql_and_values(
            backend,
            "INSERT INTO rate_limit_counters (limiter, subject, window_start, attempts) VALUES ('submit', 'old', $1, 3)",
            [(chrono::Utc::now() - chrono::Duration::hours(2)).into()],
        ))
        .await
        .expect("insert an old window");
    let removed = app.state.submit_rate_limiter.prune().await.expect("prune");
    assert_eq!(removed, 1, "only the ended window goes");
    assert_eq!(counted(&app).await, 1, "the current window stays");
}

on_every_backend!(
    concurrent_submits_over_independent_apps_admit_exactly_the_limit,
    a_business_rollback_does_not_refund_quota,
    a_broken_counter_lets_requests_through_and_is_counted,
    ended_windows_are_pruned,
);
