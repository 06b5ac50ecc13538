//! Changing an endpoint's limits is felt at once, and changes nothing else about its flow,
//! on every backend: a new cap leaves the rate limiter's schedule and a hold where they
//! were (a `Retry-After` answered but not yet recorded still holds every process off); a
//! higher rate limit brings the next start in; and a shorter `Retry-After` recorded first
//! keeps the longer hold another answer asked for.

use std::time::Duration;

use chrono::Utc;
use courier::db::Db;
use courier::service::flow;
use courier::worker::dispatch::{AttemptOutcome, OutcomeKind};
use courier::worker::health::HealthPolicy;
use courier::worker::record::{record, FinishedAttempt};
use courier::worker::schedule::NextStep;
use sea_orm::ConnectionTrait;
use serde_json::json;
use uuid::Uuid;

use super::{claim, endpoint_with_backlog, two_seconds_pass};
use crate::on_every_backend;
use crate::support::fixtures::{events_for, rows};
use crate::support::{Backend, TestApp, TestDb};

async fn update(app: &TestApp, admin: &str, endpoint: Uuid, input: serde_json::Value) {
    let body = app
        .graphql(
            admin,
            "mutation($id: ID!, $input: UpdateEndpointInput!) { updateEndpoint(id: $id, input: $input) { endpoint { id } } }",
            json!({ "id": endpoint.to_string(), "input": input }),
        )
        .await;
    assert!(body["errors"].is_null(), "{body}");
}

/// Holds `endpoint`'s turn back for `wait`, as the worker does the moment a `Retry-After`
/// comes back, before its outcome is recorded.
async fn hold(pool: &Db, endpoint: Uuid, wait: Duration) {
    let clock = pool.clock();
    let hold = clock.statement(flow::HOLD_TURN, [endpoint.into(), clock.after(wait)]);
    pool.conn().execute_raw(hold).await.expect("hold the turn");
}

/// The moment `column` of the (one) flow row holds, if any.
async fn flow_moment(pool: &Db, column: &str) -> Option<chrono::DateTime<Utc>> {
    rows(pool, &format!("SELECT {column} FROM endpoint_flow"), vec![]).await[0]
        .try_get::<Option<chrono::DateTime<Utc>>>("", column)
        .expect("a moment or none")
}

async fn a_new_cap_keeps_the_limiters_schedule_and_a_hold(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let pool = &app.state.db;
    let limited = endpoint_with_backlog(&app, &admin, json!({ "rateLimit": 1 }), 3).await;
    assert_eq!(claim(pool, 10).await.len(), 1);
    assert!(claim(pool, 10).await.is_empty(), "the next start waits");
    update(&app, &admin, limited, json!({ "maxInFlight": 5 })).await;
    assert!(
        claim(pool, 10).await.is_empty(),
        "a new cap does not restart the rate limiter"
    );
    // The limiter's wait passes (its schedule and the turn), and the next start comes.
    two_seconds_pass(pool, backend, &["rate_tat", "turn_at", "blocked_until"]).await;
    assert_eq!(claim(pool, 10).await.len(), 1);

    // Another endpoint answered `Retry-After: 600`, not yet recorded: a new cap keeps it held.
    let held = endpoint_with_backlog(&app, &admin, json!({}), 2).await;
    hold(pool, held, Duration::from_secs(600)).await;
    update(&app, &admin, held, json!({ "maxInFlight": 7 })).await;
    two_seconds_pass(pool, backend, &["turn_at"]).await;
    assert!(
        claim(pool, 10).await.iter().all(|c| c.endpoint_id != held),
        "a hold outlives a new cap"
    );
}

async fn a_higher_rate_limit_brings_the_next_start_in(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let pool = &app.state.db;
    let limited = endpoint_with_backlog(&app, &admin, json!({ "rateLimit": 1 }), 3).await;
    assert_eq!(claim(pool, 10).await.len(), 1);
    let schedule = || async { flow_moment(pool, "rate_tat").await };
    let before = schedule().await.expect("a schedule");
    assert!(
        before > Utc::now() + chrono::Duration::milliseconds(500),
        "{before}"
    );
    update(&app, &admin, limited, json!({ "rateLimit": 100 })).await;
    let after = schedule().await.expect("a schedule");
    assert!(
        after < Utc::now() + chrono::Duration::milliseconds(100),
        "the next start comes within one new interval: {after}"
    );
    update(&app, &admin, limited, json!({ "rateLimit": null })).await;
    assert_eq!(schedule().await, None, "no limit, no schedule");
}

async fn a_shorter_retry_after_recorded_first_keeps_a_longer_hold(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let pool = &app.state.db;
    let endpoint = endpoint_with_backlog(&app, &admin, json!({}), 2).await;
    let claimed = claim(pool, 2).await;
    assert_eq!(claimed.len(), 2);
    // The first request's answer asked for an hour; the second's, for five seconds, is
    // recorded before the first's.
    hold(pool, endpoint, Duration::from_secs(3600)).await;
    let now = courier::db::now();
    let answered = FinishedAttempt {
        claim: claimed[1].clone(),
        outcome: AttemptOutcome {
            status: Some(429),
            error: Some("HTTP 429 Too Many Requests".into()),
            retry_after: Some(Duration::from_secs(5)),
            duration: Duration::from_millis(2),
            kind: OutcomeKind::HttpStatus,
            answer: None,
        },
        step: NextStep::RetryAfter(Duration::from_secs(5)),
        started_at: now,
        finished_at: now,
    };
    record(
        pool,
        &events_for(pool),
        HealthPolicy::default(),
        &[answered],
    )
    .await
    .expect("record");
    let held_until = flow_moment(pool, "blocked_until").await.expect("held");
    assert!(
        held_until > Utc::now() + chrono::Duration::minutes(30),
        "the hour's hold stands: {held_until}"
    );
}

on_every_backend!(
    a_new_cap_keeps_the_limiters_schedule_and_a_hold,
    a_higher_rate_limit_brings_the_next_start_in,
    a_shorter_retry_after_recorded_first_keeps_a_longer_hold,
);
