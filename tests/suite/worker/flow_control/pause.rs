//! A pause holds from the answer that asked for it: the deliveries waiting behind a `429`
//! with `Retry-After` are not sent in the moment before its outcome is recorded, on any
//! instance.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use courier::config::ServeArgs;
use courier::worker::hold;
use serde_json::json;

use super::{each_once, endpoint_with, submit_many};
use crate::on_both_backends;
use crate::support::endpoints::{endpoint, set_disabled};
use crate::support::fixtures::{loop_at_rest, quick_worker, worker_looks};
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// A quick worker with room for more than the endpoint's one request at a time.
fn roomy_worker(config: &mut ServeArgs) {
    quick_worker(config);
    config.worker_concurrency = 8;
}

/// Five deliveries wait behind an endpoint's one slot while its first request is answered
/// `429` with `Retry-After: 3`: nothing more reaches the receiver for three seconds from
/// that answer, with two instances claiming; then every one is delivered once.
async fn deliveries_waiting_behind_a_429_wait_for_its_pause(backend: Backend) {
    let db = TestDb::new(backend).await;
    let refused = Arc::new(AtomicBool::new(false));
    let refuse_once = refused.clone();
    let receiver = Receiver::start(move |_| {
        let first = !refuse_once.swap(true, Ordering::SeqCst);
        Reply {
            body: Default::default(),
            status: if first { 429 } else { 204 },
            headers: if first {
                vec![("retry-after", "3".to_owned())]
            } else {
                Vec::new()
            },
            // The others are submitted, and wait, while the first is answered.
            delay: Duration::from_millis(if first { 300 } else { 0 }),
        }
    })
    .await;
    let apps = [
        TestApp::spawn_with(&db, roomy_worker).await,
        TestApp::spawn_with(&db, roomy_worker).await,
    ];
    let admin = apps[0].admin_token().await;
    let settings = json!({ "maxInFlight": 1 });
    let endpoint = endpoint_with(&apps[0], &admin, &receiver, "held", settings).await;
    submit_many(&apps[0], &admin, &endpoint, 1).await;
    submit_many(&apps[1], &admin, &endpoint, 5).await;
    let received = receiver.wait_for(6, Duration::from_secs(20)).await;
    let told = received[0].at;
    for later in &received[1..] {
        assert!(
            later.at - told >= Duration::from_millis(2_900),
            "a request came {:?} into a three-second pause",
            later.at - told
        );
    }
    each_once(&receiver, "held", 6);
}

/// `429` with `Retry-After: 36000` (ten hours): the endpoint pauses for an hour, the cap, and
/// the delivery that was answered waits that hour too, not ten; deliveries submitted
/// meanwhile are held, not counted as due.
async fn a_retry_after_beyond_an_hour_holds_the_answered_delivery_an_hour(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(|_| Reply {
        headers: vec![("retry-after", "36000".to_owned())],
        ..Reply::status(429)
    })
    .await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_with(&app, &admin, &receiver, "long", json!({})).await;
    submit_many(&app, &admin, &endpoint, 1).await;
    receiver.wait_for(1, Duration::from_secs(20)).await;
    let query = "query($id: ID!) { endpoint(id: $id) { pausedUntil } \
                 deliveries(filter: {endpointId: $id}) { edges { node { state cycleAttempts nextAttemptAt } } } }";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let body = app.graphql(&admin, query, json!({ "id": endpoint })).await;
        // The pause and the attempt commit together, but the two root fields are read
        // concurrently (each its own read), so one may be read just before the commit.
        if body["data"]["deliveries"]["edges"][0]["node"]["cycleAttempts"] == 1
            && !body["data"]["endpoint"]["pausedUntil"].is_null()
        {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the 429 recorded: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let ahead = |at: &serde_json::Value| {
        let at: chrono::DateTime<chrono::Utc> = at
            .as_str()
            .unwrap_or_else(|| panic!("a time: {body}"))
            .parse()
            .expect("a time");
        at - chrono::Utc::now()
    };
    let an_hour = chrono::Duration::hours(1);
    let margin = chrono::Duration::minutes(1);
    let paused = ahead(&body["data"]["endpoint"]["pausedUntil"]);
    assert!(
        paused > an_hour - margin && paused <= an_hour,
        "paused for {paused}: {body}"
    );
    let node = &body["data"]["deliveries"]["edges"][0]["node"];
    assert_eq!(node["state"], "PENDING", "{body}");
    let waits = ahead(&node["nextAttemptAt"]);
    assert!(
        waits > an_hour - margin && waits <= an_hour,
        "the answered delivery waits {waits}, not ten hours: {body}"
    );

    // What is submitted meanwhile waits for the pause: held, not due, so the due-queue
    // gauge does not read the pause the receiver asked for as a backlog.
    submit_many(&app, &admin, &endpoint, 3).await;
    assert_eq!(app.state.deliveries.due_count().await.expect("due"), 0);
}

/// An operator ends a pause by disabling and re-enabling the endpoint: `pausedUntil` is
/// cleared and everything waiting, the delivery that was answered `429` included, goes out
/// at once rather than in an hour.
async fn re_enabling_an_endpoint_ends_its_pause(backend: Backend) {
    let db = TestDb::new(backend).await;
    let refused = Arc::new(AtomicBool::new(false));
    let refuse_once = refused.clone();
    let receiver = Receiver::start(move |_| {
        if refuse_once.swap(true, Ordering::SeqCst) {
            Reply::status(204)
        } else {
            Reply {
                headers: vec![("retry-after", "3600".to_owned())],
                ..Reply::status(429)
            }
        }
    })
    .await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let settings = json!({ "maxInFlight": 1 });
    let id = endpoint_with(&app, &admin, &receiver, "paused", settings).await;
    submit_many(&app, &admin, &id, 3).await;
    receiver.wait_for(1, Duration::from_secs(20)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while endpoint(&app, &admin, &id).await["pausedUntil"].is_null() {
        assert!(std::time::Instant::now() < deadline, "never paused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for off in [true, false] {
        let switched = set_disabled(&app, &admin, &id, off).await;
        assert_eq!(switched["disabled"], off, "{switched}");
    }
    let resumed = endpoint(&app, &admin, &id).await;
    assert!(resumed["pausedUntil"].is_null(), "{resumed}");
    // The refused one and the two behind it, each once more or for the first time.
    let received = receiver.wait_for(4, Duration::from_secs(20)).await;
    assert_eq!(received.len(), 4);
    wait_delivered(&app, &admin, &id, 3).await;
}

/// A claim made before its endpoint's answer asked to wait, and not yet sent when the answer
/// came back, is not sent: this process knows of the wait at once, hands the claim back with
/// no attempt, and claims nothing of the endpoint until the wait is over. (The claim at
/// submit stands for such a claim: the process is told of the wait as an answer would tell
/// it, and nothing in the database knows of it yet.)
async fn a_claim_made_before_an_answer_asked_to_wait_is_not_sent(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.poll_interval_ms = 1_000;
    })
    .await;
    let admin = app.admin_token().await;
    let id = endpoint_with(&app, &admin, &receiver, "held", json!({})).await;
    let endpoint_id = id.parse().expect("an endpoint id");
    let metrics = &app.state.metrics;
    let mut submitted = 0;
    // A claim at submit is opportunistic (one that meets the claiming loop's round leaves
    // the delivery to the loop): submit until one is made.
    while metrics.claims_held_back.get() == 0 {
        assert!(
            submitted < 5,
            "no claim at submit in {submitted} submissions"
        );
        loop_at_rest(&app).await;
        app.state.held.hold(endpoint_id, hold::LOCAL_HOLD);
        let body =
            crate::support::fixtures::submit(&app, &admin, &id, json!({ "n": submitted }), None)
                .await;
        assert!(body["errors"].is_null(), "{body}");
        submitted += 1;
    }
    assert_eq!(
        metrics.claims_held_back.get(),
        metrics.claims_at_submit.get()
    );
    let pool = app.state.db.clone();
    crate::support::fixtures::eventually("handed back", Duration::from_secs(10), || async {
        crate::support::fixtures::count(
            &pool,
            "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'pending'",
            vec![],
        )
        .await
            == submitted as i64
    })
    .await;
    worker_looks(&app, 1).await;
    assert!(receiver.received().is_empty(), "nothing sent while held");

    wait_delivered(&app, &admin, &id, submitted).await;
    each_once(&receiver, "held", submitted);
    let attempts = crate::support::fixtures::count(
        &pool,
        "SELECT COUNT(*) AS n FROM delivery_attempts",
        vec![],
    )
    .await;
    assert_eq!(attempts, submitted as i64, "the hand-back spent no attempt");
}

/// Waits until `count` deliveries of `endpoint` are `DELIVERED`.
async fn wait_delivered(app: &TestApp, admin: &str, endpoint: &str, count: usize) {
    let query = "query($id: ID!) { deliveries(filter: {endpointId: $id, state: DELIVERED}) \
                 { edges { node { id } } } }";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let body = app.graphql(admin, query, json!({ "id": endpoint })).await;
        let delivered = body["data"]["deliveries"]["edges"]
            .as_array()
            .map_or(0, Vec::len);
        if delivered == count {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{delivered} of {count} delivered: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

on_both_backends!(
    deliveries_waiting_behind_a_429_wait_for_its_pause,
    a_retry_after_beyond_an_hour_holds_the_answered_delivery_an_hour,
    re_enabling_an_endpoint_ends_its_pause,
    a_claim_made_before_an_answer_asked_to_wait_is_not_sent,
);
