//! A line's head held by a worker that went silent, on PostgreSQL with independent pools:
//! only the head was claimable, no instance sends anything of the line while its lease
//! runs, then another instance reclaims the head and the line proceeds in order; the dead
//! worker's late result is fenced out and hands nothing on.

use std::time::Duration;

use courier::worker::claim::claim_due;
use serde_json::json;

use super::submit_keyed;
use super::{all_settled, arrivals_by_key, id_of, obedient_receiver, patient_worker, states};
use crate::support::fixtures::{count, endpoint_on, events_for, record_result};
use crate::support::{Backend, TestApp, TestDb};

async fn a_silent_heads_line_waits_for_its_lease_and_its_late_result_changes_nothing(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let api = TestApp::spawn(&db).await;
    let admin = api.admin_token().await;
    let endpoint = endpoint_on(&api, &admin, &receiver, "lease").await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let submitted =
            submit_keyed(&api, &admin, &endpoint, json!({ "n": n }), Some("order-5")).await;
        ids.push(id_of(&submitted));
    }

    // A worker on a pool of its own claims everything due: only the head is.
    let silent = db.connect(2).await;
    let claims = claim_due(&silent, &events_for(&silent), 10, Duration::from_secs(2))
        .await
        .expect("claim");
    assert_eq!(claims.len(), 1, "only the head is due: {claims:?}");
    assert_eq!(claims[0].delivery_id.to_string(), ids[0]);
    assert_eq!(claims[0].ordering_key.as_deref(), Some("order-5"));
    let other = db.connect(2).await;
    let none = claim_due(&other, &events_for(&other), 10, Duration::from_secs(60))
        .await
        .expect("claim");
    assert!(none.is_empty(), "the rest of the line waits: {none:?}");

    // Two instances deliver; nothing of the line goes out while the lease runs.
    let workers = [
        TestApp::spawn_with(&db, patient_worker).await,
        TestApp::spawn_with(&db, patient_worker).await,
    ];
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(
        receiver.received().is_empty(),
        "nothing overtook the held head"
    );
    all_settled(&api, &admin, &ids, Duration::from_secs(20)).await;

    // The silent worker comes back with its result: fenced out, nothing handed on.
    let late = record_result(&silent, &claims[0], false).await;
    assert_eq!(late.new_state, None, "the late result was superseded");
    assert_eq!(
        states(&api, &admin, &ids).await,
        ["DELIVERED", "DELIVERED", "DELIVERED"]
    );
    assert_eq!(arrivals_by_key(&receiver, "lease")["order-5"], [0, 1, 2]);
    let superseded = count(
        &api.state.db,
        "SELECT COUNT(*) AS n FROM delivery_attempts WHERE superseded",
        vec![],
    )
    .await;
    assert_eq!(superseded, 1, "the late attempt is kept, marked superseded");
    let open = count(
        &api.state.db,
        "SELECT COALESCE(SUM(open), 0) AS n FROM ordering_lines",
        vec![],
    )
    .await;
    assert_eq!(open, 0);
    let waiting = count(
        &api.state.db,
        "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE waiting",
        vec![],
    )
    .await;
    assert_eq!(waiting, 0);
    drop(workers);
}

crate::on_postgres!(a_silent_heads_line_waits_for_its_lease_and_its_late_result_changes_nothing);
