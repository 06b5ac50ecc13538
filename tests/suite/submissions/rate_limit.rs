//! Race 5: a rate limit shared by every Courier process, counted by one upsert per request.

use std::sync::Arc;

use reqwest::StatusCode;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{json, Value};
use tokio::sync::Barrier;

use crate::on_every_backend;
use crate::support::fixtures::{row_counts, submit, SUBMIT};
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

/// Only ended windows are pruned. The window is long, and the ended one is the window
/// before the current one, so the test means the same whenever it runs (a short window
/// could end between the submission and the prune).
async fn ended_windows_are_pruned(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = limited_app(&db, 10).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    submit(&app, &admin, &endpoint, json!({}), None).await;
    let conn = app.state.db.conn();
    let current: chrono::DateTime<chrono::Utc> = conn
        .query_one_raw(Statement::from_string(
            app.state.db.backend(),
            "SELECT window_start FROM rate_limit_counters",
        ))
        .await
        .expect("query")
        .expect("the current window")
        .try_get("", "window_start")
        .expect("window_start");
    let previous = current - chrono::Duration::seconds(LONG_WINDOW_SECS as i64);
    conn.execute_raw(Statement::from_sql_and_values(
        app.state.db.backend(),
        "INSERT INTO rate_limit_counters (limiter, subject, window_start, attempts) VALUES ('submit', 'old', $1, 3)",
        [previous.into()],
    ))
    .await
    .expect("insert an ended window");
    let removed = app.state.submit_rate_limiter.prune().await.expect("prune");
    assert_eq!(removed, 1, "only the ended window goes");
    assert_eq!(counted(&app).await, 1, "the current window stays");
}

/// The counter's statement is retried a bounded number of times on a serialization
/// failure: a transient one costs nothing (the request is counted once), a persistent one
/// gives up after five tries and lets the request through, alerted and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counter_retries_serialization_failures_a_bounded_number_of_times() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = limited_app(&db, 1).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    // Every new counter row fails with a serialization failure while the sequence is below
    // the threshold: a sequence, because its increments survive the failed transactions.
    app.state
        .db
        .conn()
        .execute_unprepared(
            "CREATE SEQUENCE counter_tries;
             CREATE TABLE failing_until (tries BIGINT NOT NULL);
             INSERT INTO failing_until VALUES (2);
             CREATE FUNCTION fail_counter() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF nextval('counter_tries') <= (SELECT tries FROM failing_until) THEN
                     RAISE EXCEPTION 'injected' USING ERRCODE = 'serialization_failure';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER fail_counter BEFORE INSERT ON rate_limit_counters
                 FOR EACH ROW EXECUTE FUNCTION fail_counter();",
        )
        .await
        .expect("inject serialization failures");
    let tries = || async {
        app.state
            .db
            .conn()
            .query_one_raw(Statement::from_string(
                app.state.db.backend(),
                "SELECT last_value AS n FROM counter_tries",
            ))
            .await
            .expect("query")
            .expect("row")
            .try_get::<i64>("", "n")
            .expect("n")
    };

    // Two failures, then success: counted once, and within the limit.
    let body = submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await;
    assert_eq!(body["data"]["submit"]["created"], true, "{body}");
    assert_eq!(tries().await, 3, "two failed tries and one that counted");
    assert_eq!(counted(&app).await, 1);
    let over = submit(&app, &admin, &endpoint, json!({ "n": 2 }), None).await;
    assert_eq!(gql_error_code(&over), Some("RATE_LIMITED"), "{over}");
    assert_eq!(app.state.metrics.rate_limit_errors.get(), 0);

    // Failing for good (a new client, so a new row): five tries, then let through.
    app.state
        .db
        .conn()
        .execute_unprepared("UPDATE failing_until SET tries = 1000")
        .await
        .expect("fail for good");
    let other = app.admin_token().await;
    let before = tries().await;
    let body = submit(&app, &other, &endpoint, json!({ "n": 3 }), None).await;
    assert_eq!(body["data"]["submit"]["created"], true, "fail open: {body}");
    assert_eq!(tries().await - before, 5, "a bounded number of tries");
    assert_eq!(app.state.metrics.rate_limit_errors.get(), 1);
}

on_every_backend!(
    concurrent_submits_over_independent_apps_admit_exactly_the_limit,
    a_business_rollback_does_not_refund_quota,
    a_broken_counter_lets_requests_through_and_is_counted,
    ended_windows_are_pruned,
);
