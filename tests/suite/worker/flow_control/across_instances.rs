//! Flow control held across processes: two app instances, each with its own pool and
//! worker, deliver to one real receiver on PostgreSQL. The receiver's own view decides:
//! how many requests it held at once, how many started in any second, when nothing came.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use courier::config::ServeArgs;
use serde_json::json;

use super::{each_once, endpoint_with, most_in_any_window, submit_many, RATE_WINDOW};
use crate::support::fixtures::{count, eventually, quick_worker, settle};
use crate::support::receiver::answering_after;
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// A worker with room for more requests than any endpoint here may take.
fn roomy_worker(config: &mut ServeArgs) {
    quick_worker(config);
    config.worker_concurrency = 16;
    config.request_timeout_ms = 5_000;
    config.lease_secs = 30;
}

/// Three instances, each able to send two requests at once, never hold more than the
/// endpoint's `maxInFlight` of 4 at once together (six would fit their slots), and the
/// receiver sees at least three at once: the cap is shared, not per process.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cap_holds_across_instances() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(answering_after(Duration::from_millis(150))).await;
    let two_slots = |config: &mut ServeArgs| {
        roomy_worker(config);
        config.worker_concurrency = 2;
    };
    let apps = [
        TestApp::spawn_with(&db, two_slots).await,
        TestApp::spawn_with(&db, two_slots).await,
        TestApp::spawn_with(&db, two_slots).await,
    ];
    let admin = apps[0].admin_token().await;
    let endpoint = endpoint_with(
        &apps[0],
        &admin,
        &receiver,
        "capped",
        json!({ "maxInFlight": 4 }),
    )
    .await;
    submit_many(&apps[0], &admin, &endpoint, 48).await;
    receiver.wait_for(48, Duration::from_secs(30)).await;
    let most = receiver.most_in_flight("capped");
    assert!(most <= 4, "the receiver held {most} requests at once");
    assert!(
        most >= 3,
        "several instances sent at once, up to the cap: {most}"
    );
    let claims = apps.each_ref().map(|app| app.state.metrics.claims.get());
    assert!(
        claims.iter().filter(|n| **n > 0).count() >= 2,
        "instances shared the work: {claims:?}"
    );
    settle(apps).await;
    each_once(&receiver, "capped", 48);
}

/// Instances together never start more than `rateLimit` requests in any second at the
/// receiver: not while several run, nor when some stop and another carries on from the
/// limiter's state in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rate_limit_holds_across_two_instances() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::accepting().await;
    let first = TestApp::spawn_with(&db, roomy_worker).await;
    let second = TestApp::spawn_with(&db, roomy_worker).await;
    let admin = first.admin_token().await;
    let endpoint = endpoint_with(
        &first,
        &admin,
        &receiver,
        "limited",
        json!({ "rateLimit": 5 }),
    )
    .await;
    submit_many(&second, &admin, &endpoint, 16).await;
    // Both deliver while they run; then one stops halfway and the other carries on from
    // the limiter's state in the database, with no burst at the handover.
    let third = TestApp::spawn_with(&db, roomy_worker).await;
    receiver.wait_for(8, Duration::from_secs(30)).await;
    let before = [&first, &second, &third].map(|app| app.state.metrics.claims.get());
    first.stop().await;
    second.stop().await;
    let received = receiver.wait_for(16, Duration::from_secs(30)).await;
    let arrivals: Vec<_> = received.iter().map(|r| r.at).collect();
    let most = most_in_any_window(&arrivals, RATE_WINDOW);
    assert!(most <= 5, "{most} requests started within {RATE_WINDOW:?}");
    let span =
        *arrivals.iter().max().expect("arrivals") - *arrivals.iter().min().expect("arrivals");
    assert!(
        span >= Duration::from_millis(2_800),
        "16 starts at 5 a second take 3 s: {span:?}"
    );
    assert!(
        before.iter().filter(|n| **n > 0).count() >= 1 && third.state.metrics.claims.get() > 0,
        "the remaining instance took over: {before:?} then {}",
        third.state.metrics.claims.get()
    );
    settle([third]).await;
    each_once(&receiver, "limited", 16);
}

/// A `429` with `Retry-After` pauses the endpoint on every instance: until it ends, neither
/// sends it anything; then everything waiting is delivered, with no attempt lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_is_felt_by_every_instance() {
    let db = TestDb::new(Backend::Postgres).await;
    let refused = Arc::new(AtomicBool::new(false));
    let refuse_once = refused.clone();
    let receiver = Receiver::start(move |_| {
        if refuse_once.swap(true, Ordering::SeqCst) {
            Reply {
                body: Default::default(),
                status: 200,
                headers: Vec::new(),
                delay: Duration::from_millis(100),
            }
        } else {
            Reply {
                body: Default::default(),
                status: 429,
                headers: vec![("retry-after", "2".to_owned())],
                delay: Duration::ZERO,
            }
        }
    })
    .await;
    // One slot each: once the pause ends, both instances are needed to deliver.
    let one_slot = |config: &mut ServeArgs| {
        roomy_worker(config);
        config.worker_concurrency = 1;
    };
    let first = TestApp::spawn_with(&db, one_slot).await;
    let second = TestApp::spawn_with(&db, one_slot).await;
    let admin = first.admin_token().await;
    let endpoint = endpoint_with(&first, &admin, &receiver, "busy", json!({})).await;
    submit_many(&first, &admin, &endpoint, 1).await;
    let told = receiver.wait_for(1, Duration::from_secs(10)).await[0].at;
    let paused = "query($id: ID!) { endpoint(id: $id) { pausedUntil } }";
    eventually("the endpoint is paused", Duration::from_secs(5), || async {
        let body = second
            .graphql(&admin, paused, json!({ "id": endpoint }))
            .await;
        body["data"]["endpoint"]["pausedUntil"].is_string()
    })
    .await;
    submit_many(&second, &admin, &endpoint, 10).await;
    let received = receiver.wait_for(12, Duration::from_secs(20)).await;
    for later in &received[1..] {
        assert!(
            later.at - told >= Duration::from_millis(1_900),
            "a request came {:?} into a two-second pause",
            later.at - told
        );
    }
    // The workers were watching: what waited went out as soon as the pause ended.
    let resumed = received[1..]
        .iter()
        .map(|r| r.at - told)
        .min()
        .expect("arrivals");
    assert!(
        resumed < Duration::from_millis(3_500),
        "nothing went out until {resumed:?} after a two-second pause"
    );
    let claims = [&first, &second].map(|app| app.state.metrics.claims.get());
    assert!(
        claims.iter().all(|n| *n > 0),
        "both instances delivered: {claims:?}"
    );
    settle([first, second]).await;
    assert_eq!(received.len(), 12, "one refused, then each once");
    let mut ids: Vec<_> = received.iter().map(|r| r.webhook_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 11);
    let attempts = count(
        &db.connect(1).await,
        "SELECT COUNT(*) AS n FROM delivery_attempts",
        Vec::new(),
    )
    .await;
    assert_eq!(
        attempts, 12,
        "the waiting deliveries spent no attempt in the pause"
    );
}

/// `updateEndpoint` through one instance changes what another instance's worker does
/// within a second: a cap of 1 raised to 4 is used at once, and lowered again is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_settings_change_is_felt_by_another_instance() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(answering_after(Duration::from_millis(300))).await;
    let api = TestApp::spawn(&db).await;
    let worker = TestApp::spawn_with(&db, roomy_worker).await;
    let admin = api.admin_token().await;
    let endpoint = endpoint_with(
        &api,
        &admin,
        &receiver,
        "tuned",
        json!({ "maxInFlight": 1 }),
    )
    .await;
    submit_many(&api, &admin, &endpoint, 40).await;
    receiver.wait_for(3, Duration::from_secs(10)).await;
    assert_eq!(receiver.most_in_flight("tuned"), 1);

    let update = "mutation($id: ID!, $n: Int) { updateEndpoint(id: $id, input: {maxInFlight: $n}) { endpoint { maxInFlight } } }";
    let body = api
        .graphql(&admin, update, json!({ "id": endpoint, "n": 4 }))
        .await;
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"]["maxInFlight"], 4,
        "{body}"
    );
    eventually("the raised cap is used", Duration::from_secs(1), || async {
        receiver.in_flight("tuned") >= 3
    })
    .await;
    let body = api
        .graphql(&admin, update, json!({ "id": endpoint, "n": 2 }))
        .await;
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"]["maxInFlight"], 2,
        "{body}"
    );
    // What was in flight finishes within a request's time; after that, two at most.
    tokio::time::sleep(Duration::from_millis(400)).await;
    for _ in 0..20 {
        assert!(receiver.in_flight("tuned") <= 2, "the lowered cap is held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    receiver.wait_for(40, Duration::from_secs(30)).await;
    settle([api, worker]).await;
    each_once(&receiver, "tuned", 40);
}
