//! Endpoint health: a 410 fails at once and disables (`GONE`); a run of failed deliveries
//! disables (`FAILING`); a manual disable is `MANUAL`. Disabling parks the backlog and loses
//! nothing; re-enabling clears the reason and resumes it.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use courier::worker::claim::claim_due;
use courier::worker::dispatch::{AttemptOutcome, OutcomeKind};
use courier::worker::health::HealthPolicy;
use courier::worker::record::{record, FinishedAttempt};
use courier::worker::schedule::NextStep;

use crate::on_both_backends;
use crate::support::endpoints::{endpoint, set_disabled};
use crate::support::fixtures::delivery_id;
use crate::support::fixtures::worker_looks;
use crate::support::fixtures::{count, eventually};
use crate::support::fixtures::{events_for, LONG_LEASE};
use crate::support::fixtures::{quick_worker, wait_for_state};
use crate::support::fixtures::{submit, SUBMIT};
use crate::support::{gql_error_code, Backend, Receiver, Reply, TestApp, TestDb};

/// A receiver answering whatever status the test sets.
async fn switchable(status: u16) -> (Receiver, Arc<AtomicU16>) {
    let current = Arc::new(AtomicU16::new(status));
    let answer = current.clone();
    let receiver = Receiver::start(move |_| Reply::status(answer.load(Ordering::SeqCst))).await;
    (receiver, current)
}

const DUE_ROWS: &str = "SELECT COUNT(*) AS n FROM webhook_deliveries \
     WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at IS NOT NULL";

async fn gone_fails_at_once_and_disables_until_re_enabled(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let (receiver, status) = switchable(410).await;
    let (id, _) = app.create_endpoint(&admin, &receiver.url("gone")).await;

    let delivery = delivery_id(&submit(&app, &admin, &id, json!({ "n": 1 }), None).await);
    let failed = wait_for_state(&app, &admin, &delivery, "FAILED", Duration::from_secs(10)).await;
    let attempts = failed["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "no retry after a 410: {failed}");
    assert_eq!(attempts[0]["statusCode"], 410);

    let gone = endpoint(&app, &admin, &id).await;
    assert_eq!(gone["disabled"], true, "{gone}");
    assert_eq!(gone["disabledReason"], "GONE");
    assert!(gone["disabledAt"].is_string(), "{gone}");
    let refused = submit(&app, &admin, &id, json!({ "n": 2 }), None).await;
    assert_eq!(
        gql_error_code(&refused),
        Some("BAD_USER_INPUT"),
        "{refused}"
    );

    status.store(200, Ordering::SeqCst);
    let enabled = set_disabled(&app, &admin, &id, false).await;
    assert_eq!(enabled["disabled"], false, "{enabled}");
    assert!(enabled["disabledReason"].is_null() && enabled["disabledAt"].is_null());
    let delivery = delivery_id(&submit(&app, &admin, &id, json!({ "n": 3 }), None).await);
    wait_for_state(
        &app,
        &admin,
        &delivery,
        "DELIVERED",
        Duration::from_secs(10),
    )
    .await;
}

/// Five deliveries wait behind an endpoint's one slot when its first request is answered
/// `410`: nothing more is sent (not even in the moment before the outcome is recorded),
/// the endpoint is disabled `GONE`, and the other four are parked, not failed.
async fn after_a_410_nothing_more_is_sent_and_the_rest_wait(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    // Slow enough that all five are submitted before the answer.
    let receiver = Receiver::start(|_| Reply {
        delay: Duration::from_millis(500),
        ..Reply::status(410)
    })
    .await;
    let settings = json!({ "maxInFlight": 1 });
    let id =
        crate::support::endpoints::endpoint_with(&app, &admin, &receiver, "gone", settings).await;
    for n in 0..5 {
        let body = submit(&app, &admin, &id, json!({ "n": n }), None).await;
        assert!(body["errors"].is_null(), "{body}");
    }
    eventually("disabled", Duration::from_secs(10), || async {
        endpoint(&app, &admin, &id).await["disabledReason"] == "GONE"
    })
    .await;
    // Time for a request that slipped through to arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received().len(), 1, "one request, then nothing");
    let states = |state: &'static str| {
        let (app, id) = (&app, id.clone());
        async move {
            count(
                &app.state.db,
                "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE endpoint_id = $1 AND state = $2",
                vec![Uuid::parse_str(&id).expect("uuid").into(), state.into()],
            )
            .await
        }
    };
    assert_eq!(states("failed").await, 1);
    assert_eq!(states("pending").await, 4, "the rest wait, parked");
}

async fn a_run_of_failed_deliveries_disables_the_endpoint(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
        config.disable_after_failures = 2;
    })
    .await;
    let admin = app.admin_token().await;
    let (receiver, status) = switchable(500).await;
    let (id, _) = app.create_endpoint(&admin, &receiver.url("flaky")).await;
    let settle = |state: &'static str| {
        let (app, admin, id) = (&app, &admin, &id);
        async move {
            let delivery = delivery_id(&submit(app, admin, id, json!({}), None).await);
            wait_for_state(app, admin, &delivery, state, Duration::from_secs(10)).await;
            endpoint(app, admin, id).await
        }
    };

    let after_one = settle("FAILED").await;
    assert_eq!(after_one["consecutiveFailures"], 1, "{after_one}");
    assert_eq!(after_one["disabled"], false);
    status.store(200, Ordering::SeqCst);
    let after_success = settle("DELIVERED").await;
    assert_eq!(
        after_success["consecutiveFailures"], 0,
        "a success ends the run"
    );
    status.store(500, Ordering::SeqCst);
    assert_eq!(settle("FAILED").await["disabled"], false);
    let disabled = settle("FAILED").await;
    assert_eq!(disabled["disabled"], true, "{disabled}");
    assert_eq!(disabled["disabledReason"], "FAILING");
    assert_eq!(disabled["consecutiveFailures"], 2);
    assert!(disabled["disabledAt"].is_string());

    let enabled = set_disabled(&app, &admin, &id, false).await;
    assert_eq!(
        enabled["consecutiveFailures"], 0,
        "re-enabling starts afresh"
    );
}

async fn disabling_parks_the_backlog_and_re_enabling_resumes_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let api = TestApp::spawn(&db).await;
    let admin = api.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (id, _) = api.create_endpoint(&admin, &receiver.url("parked")).await;
    let mut backlog = Vec::new();
    for n in 0..3 {
        backlog.push(delivery_id(
            &submit(&api, &admin, &id, json!({ "n": n }), None).await,
        ));
    }
    let disabled = set_disabled(&api, &admin, &id, true).await;
    assert_eq!(disabled["disabledReason"], "MANUAL", "{disabled}");
    assert!(disabled["disabledAt"].is_string());
    let endpoint_id: Uuid = id.parse().unwrap();
    let due = count(&api.state.db, DUE_ROWS, vec![endpoint_id.into()]).await;
    assert_eq!(due, 0, "the backlog is parked");

    // A worker finds nothing to do while the endpoint is disabled.
    let worker = TestApp::spawn_with(&db, quick_worker).await;
    worker_looks(&worker, 3).await;
    assert!(receiver.received().is_empty());

    let enabled = set_disabled(&api, &admin, &id, false).await;
    assert!(enabled["disabledReason"].is_null(), "{enabled}");
    for delivery in &backlog {
        wait_for_state(
            &worker,
            &admin,
            delivery,
            "DELIVERED",
            Duration::from_secs(10),
        )
        .await;
    }
    assert_eq!(receiver.received().len(), 3, "nothing lost, nothing twice");
}

/// A `410` recorded in one batch with successes of the same endpoint, one answered after
/// it (requests in flight at once answer in any order): the endpoint is disabled `GONE` all
/// the same, and what waits behind it is parked.
async fn a_410_recorded_with_later_successes_still_disables(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| config.worker_concurrency = 0).await;
    let admin = app.admin_token().await;
    let (id, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    for n in 0..3 {
        let body = submit(&app, &admin, &id, json!({ "n": n }), None).await;
        assert!(body["errors"].is_null(), "{body}");
    }
    let pool = &app.state.db;
    let events = events_for(pool);
    let claims = claim_due(pool, &events, 2, LONG_LEASE)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 2);
    let gone_at = courier::db::now();
    let answered =
        |claim: &courier::worker::claim::Claim, status: u16, step, later_ms| FinishedAttempt {
            claim: claim.clone(),
            outcome: AttemptOutcome {
                status: Some(status),
                error: (status != 200).then(|| format!("HTTP {status}")),
                retry_after: None,
                duration: Duration::from_millis(3),
                kind: if status == 200 {
                    OutcomeKind::Success
                } else {
                    OutcomeKind::HttpStatus
                },
                answer: None,
            },
            step,
            started_at: gone_at,
            finished_at: gone_at + chrono::Duration::milliseconds(later_ms),
        };
    record(
        pool,
        &events,
        HealthPolicy::default(),
        &[
            answered(&claims[0], 410, NextStep::Failed, 0),
            answered(&claims[1], 200, NextStep::Delivered, 5),
        ],
    )
    .await
    .expect("record");

    let gone = endpoint(&app, &admin, &id).await;
    assert_eq!(gone["disabled"], true, "{gone}");
    assert_eq!(gone["disabledReason"], "GONE", "{gone}");
    let parked = count(
        pool,
        "SELECT COUNT(*) AS n FROM webhook_deliveries \
         WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at IS NULL",
        vec![Uuid::parse_str(&id).expect("uuid").into()],
    )
    .await;
    assert_eq!(parked, 1, "the third waits, parked");
}

async fn a_run_of_failures_stops_counting_at_the_largest_int(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
        config.disable_after_failures = 0;
    })
    .await;
    let admin = app.admin_token().await;
    let receiver = Receiver::start(|_| Reply::status(500)).await;
    let (id, _) = app.create_endpoint(&admin, &receiver.url("down")).await;
    // Years of failures on an endpoint nothing disables: one short of the largest `Int`.
    crate::support::fixtures::rows(
        &app.state.db,
        "UPDATE endpoints SET consecutive_failures = 2147483646 WHERE id = $1",
        vec![Uuid::parse_str(&id).expect("uuid").into()],
    )
    .await;
    for _ in 0..2 {
        let delivery = delivery_id(&submit(&app, &admin, &id, json!({}), None).await);
        wait_for_state(&app, &admin, &delivery, "FAILED", Duration::from_secs(10)).await;
    }
    let endpoint = endpoint(&app, &admin, &id).await;
    assert_eq!(endpoint["consecutiveFailures"], 2147483647, "{endpoint}");
    assert_eq!(endpoint["disabled"], false);
}

on_both_backends!(
    gone_fails_at_once_and_disables_until_re_enabled,
    after_a_410_nothing_more_is_sent_and_the_rest_wait,
    a_410_recorded_with_later_successes_still_disables,
    a_run_of_failed_deliveries_disables_the_endpoint,
    disabling_parks_the_backlog_and_re_enabling_resumes_it,
    a_run_of_failures_stops_counting_at_the_largest_int,
);

/// Keeps submitting through `app` until the endpoint refuses; returns the accepted deliveries.
async fn submit_until_refused(app: &TestApp, token: &str, endpoint: &str) -> Vec<String> {
    let mut accepted = Vec::new();
    for n in 0..400 {
        let input = json!({ "endpointId": endpoint, "payload": { "n": n } });
        let body: Value = app.graphql(token, SUBMIT, json!({ "input": input })).await;
        match gql_error_code(&body) {
            None => accepted.push(delivery_id(&body)),
            Some("BAD_USER_INPUT") => return accepted,
            Some(other) => panic!("unexpected {other}: {body}"),
        }
    }
    panic!("the endpoint was never disabled");
}

/// Several instances submit while a worker on another disables the endpoint for failing:
/// every accepted submission keeps its delivery, none of them is left due, and all of them
/// are delivered once the endpoint is re-enabled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auto_disable_racing_submissions_loses_nothing_and_leaves_no_due_row() {
    let db = TestDb::new(Backend::Postgres).await;
    let worker = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
        config.disable_after_failures = 1;
    })
    .await;
    let submitters = [TestApp::spawn(&db).await, TestApp::spawn(&db).await];
    let admin = worker.admin_token().await;
    let (receiver, status) = switchable(500).await;
    let (id, _) = worker.create_endpoint(&admin, &receiver.url("race")).await;

    let mut tasks = Vec::new();
    for app in &submitters {
        for _ in 0..4 {
            tasks.push(submit_until_refused(app, &admin, &id));
        }
    }
    let accepted: Vec<String> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(!accepted.is_empty());
    assert_eq!(
        endpoint(&worker, &admin, &id).await["disabledReason"],
        "FAILING"
    );

    let db_handle = &worker.state.db;
    let endpoint_id: Uuid = id.parse().unwrap();
    let in_flight = "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE endpoint_id = $1 AND state = 'processing'";
    eventually(
        "in-flight attempts recorded",
        Duration::from_secs(10),
        || async { count(db_handle, in_flight, vec![endpoint_id.into()]).await == 0 },
    )
    .await;
    let due = count(db_handle, DUE_ROWS, vec![endpoint_id.into()]).await;
    assert_eq!(due, 0, "no delivery of the disabled endpoint is left due");
    let stored = count(
        db_handle,
        "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE endpoint_id = $1",
        vec![endpoint_id.into()],
    )
    .await;
    assert_eq!(
        stored as usize,
        accepted.len(),
        "every accepted submission kept its delivery"
    );

    status.store(200, Ordering::SeqCst);
    set_disabled(&worker, &admin, &id, false).await;
    let unsettled = "SELECT COUNT(*) AS n FROM webhook_deliveries \
         WHERE endpoint_id = $1 AND state IN ('pending', 'processing')";
    eventually(
        "the parked backlog delivered",
        Duration::from_secs(30),
        || async { count(db_handle, unsettled, vec![endpoint_id.into()]).await == 0 },
    )
    .await;
    let settled = count(
        db_handle,
        "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE endpoint_id = $1 AND state IN ('delivered', 'failed')",
        vec![endpoint_id.into()],
    )
    .await;
    assert_eq!(settled as usize, accepted.len());
}
