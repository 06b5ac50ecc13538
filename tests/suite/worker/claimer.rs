//! The claiming loop's claims on a thread and connections of their own (PostgreSQL): a
//! claim through them still claims under every rule and comes back with what to send,
//! whatever the main pool is doing; on SQLite there are none.

use std::time::Duration;

use courier::worker::claim::{ClaimError, ClaimRequest};
use courier::worker::claimer::Claimer;
use sea_orm::TransactionTrait;
use serde_json::json;

use crate::support::endpoints::endpoint_with;
use crate::support::fixtures::{delivery_id, events_for, submit};
use crate::support::{Backend, Receiver, TestApp, TestDb};

/// Every connection of the main pool held in an open transaction, a due delivery is still
/// claimed through the claimer's own connections, with its target; the cap still counts it
/// (a second claim finds the endpoint full).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_run_on_connections_of_their_own() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::accepting().await;
    let api = TestApp::spawn(&db).await;
    let admin = api.admin_token().await;
    let endpoint = endpoint_with(&api, &admin, &receiver, "own", json!({ "maxInFlight": 1 })).await;
    let first = submit(&api, &admin, &endpoint, json!({ "n": 1 }), None).await;
    let first = delivery_id(&first);
    submit(&api, &admin, &endpoint, json!({ "n": 2 }), None).await;

    let main = db.connect(2).await;
    let claimer = Claimer::start(&main)
        .await
        .expect("a claimer on PostgreSQL");
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(main.conn().begin().await.expect("hold a main connection"));
    }

    let bus = events_for(&main);
    let request = || ClaimRequest {
        limit: 10,
        lease: Duration::from_secs(60),
        default_max_in_flight: 32,
        ..ClaimRequest::default()
    };
    let claim = |request| claimer.claim(&bus, api.state.config.secret_keys(), request);
    let (claimed, targets) = match claim(request()).await {
        Ok(done) => done,
        Err(ClaimError::Claim(err)) => panic!("the claim failed: {err}"),
        Err(ClaimError::Load(_, err)) => panic!("the targets were not read: {err}"),
    };
    assert_eq!(claimed.claims.len(), 1, "one slot: one claim");
    let claim_of = &claimed.claims[0];
    assert_eq!(claim_of.delivery_id.to_string(), first, "the older first");
    let target = targets.get(&claim_of.delivery_id).expect("what to send");
    assert!(target.url.contains("/own"), "{}", target.url);

    let (again, _) = match claim(request()).await {
        Ok(done) => done,
        Err(_) => panic!("the second claim failed"),
    };
    assert!(again.claims.is_empty(), "the endpoint is full");
    drop(held);
}

/// On SQLite, whose writers share one lock, claims stay on the caller's runtime and pool.
#[tokio::test]
async fn sqlite_has_no_claimer() {
    let db = TestDb::new(Backend::Sqlite).await;
    assert!(Claimer::start(&db.connect(1).await).await.is_none());
}
