//! An outage longer than a delivery's lease, with the webhook's answer in hand: the
//! process that sent it writes that answer once the database is back, before any process
//! (itself or another beside it) retakes the expired lease and sends the webhook again; and
//! a claim decided before the outage, left waiting through it, takes nothing once it ends.

use std::time::{Duration, Instant};

use courier::config::ServeArgs;
use serde_json::json;

use courier::db::{classify, Failure};
use courier::worker::claim::claim_due;
use uuid::Uuid;

use crate::support::fixtures::{
    delivery as stored_delivery, endpoint_on, events_for, eventually, quick_worker, submit,
    wait_for_state,
};
use crate::support::receiver::answering_after;
use crate::support::{Backend, PartitionProxy, Receiver, TestApp, TestDb};

/// A lease the outage outlasts, and requests well within it.
fn short_leases(config: &mut ServeArgs) {
    quick_worker(config);
    config.lease_secs = 2;
    config.request_timeout_ms = 1_500;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_held_through_an_outage_is_recorded_before_its_lease_is_retaken() {
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    // The answer comes while the database is cut off, so it can only be held.
    let receiver = Receiver::start(answering_after(Duration::from_millis(500))).await;
    let apps = [
        TestApp::spawn_through(&db, &proxy, short_leases).await,
        TestApp::spawn_through(&db, &proxy, short_leases).await,
    ];
    let admin = apps[0].admin_token().await;
    let endpoint = endpoint_on(&apps[0], &admin, &receiver, "held").await;

    let submitted = submit(&apps[0], &admin, &endpoint, json!({ "n": 1 }), None).await;
    let delivery = submitted["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{submitted}"))
        .to_owned();
    eventually(
        "the webhook reaches the receiver",
        Duration::from_secs(10),
        || async { receiver.in_flight("held") == 1 },
    )
    .await;
    proxy.partition();
    let cut = Instant::now();
    eventually("the receiver answers", Duration::from_secs(5), || async {
        receiver.in_flight("held") == 0
    })
    .await;
    // Both processes find the database out of reach (which takes their probes a few
    // seconds of silence), and the work they had sent before the cut reaches its 5 s
    // deadline: a long outage, in which the delivery's lease has long run out.
    eventually(
        "both processes see the outage",
        Duration::from_secs(30),
        || async { apps.iter().all(|app| app.state.db.out_of_reach()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(7).saturating_sub(cut.elapsed())).await;
    proxy.heal();

    let delivered = wait_for_state(
        &apps[0],
        &admin,
        &delivery,
        "DELIVERED",
        Duration::from_secs(30),
    )
    .await;
    // Anything that retook the lease would have sent it again by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let received = receiver.received();
    assert_eq!(received.len(), 1, "sent again: {received:?}");
    let attempts = delivered["attempts"].as_array().map_or(0, Vec::len);
    assert_eq!(attempts, 1, "{delivered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_held_up_through_an_outage_takes_nothing() {
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    let receiver = Receiver::start(answering_after(Duration::ZERO)).await;
    // No worker: the claim below (the claiming loop's, without its deadline and thread)
    // is the only one.
    let app = TestApp::spawn_through(&db, &proxy, |_| {}).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "held").await;
    let submitted = submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await;
    let delivery: Uuid = submitted["data"]["submit"]["delivery"]["id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{submitted}"));

    // Every pooled connection used a moment ago (and back in the pool, which pings it on
    // its way), so the claim takes one without a ping and its statement is what the
    // network holds back.
    let pings: Vec<_> = (0..5).map(|_| app.state.db.ping()).collect();
    for ping in futures_util::future::join_all(pings).await {
        ping.expect("ping");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.partition();
    let claiming = {
        let (pool, events) = (app.state.db.clone(), events_for(&app.state.db));
        tokio::spawn(async move { claim_due(&pool, &events, 10, Duration::from_secs(60)).await })
    };
    eventually(
        "the process sees the outage",
        Duration::from_secs(30),
        || async { app.state.db.out_of_reach() },
    )
    .await;
    assert!(
        !claiming.is_finished(),
        "the claim was to wait through the outage: {:?}",
        claiming.await
    );
    proxy.heal();

    let claimed = claiming.await.expect("the claim's task");
    match claimed {
        // Turned away, certainly not committed: not a connection broken mid-way.
        Err(err) => assert_eq!(classify(&err), Failure::Unavailable, "{err}"),
        Ok(claims) => panic!("a claim decided before the outage took {claims:?}"),
    }
    let direct = db.connect(1).await;
    let row = stored_delivery(&direct, delivery).await;
    assert!(row.claim_token.is_none(), "{row:?}");
}
