//! Lines across processes on PostgreSQL, with independent pools: a head held by a worker
//! that went silent (only the head was claimable, nothing of the line goes out while its
//! lease runs, then another instance reclaims the head and the line proceeds in order; the
//! silent worker's late result is fenced out and hands nothing on), and submitters racing
//! into one line through two instances while both deliver it.

use std::time::Duration;

use courier::worker::claim::claim_due;
use serde_json::json;

use crate::support::fixtures::{count, endpoint_on, events_for, record_result};
use crate::support::ordering::submit_keyed;
use crate::support::ordering::{
    all_settled, arrivals_by_key, id_of, obedient_receiver, patient_worker, states,
};
use crate::support::{Backend, TestApp, TestDb};

/// The silent worker's lease.
const LEASE: Duration = Duration::from_secs(4);

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
    let claims = claim_due(&silent, &events_for(&silent), 10, LEASE)
        .await
        .expect("claim");
    let claimed_at = std::time::Instant::now();
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
    tokio::time::sleep_until((claimed_at + LEASE - Duration::from_millis(800)).into()).await;
    // Both workers were looking all along, so the silence below is theirs to keep.
    for worker in &workers {
        assert!(
            worker.state.metrics.claim_rounds.get() > 0,
            "a worker ran no claim round while the lease held"
        );
    }
    assert!(
        receiver.received().is_empty(),
        "nothing overtook the held head"
    );
    all_settled(&api, &admin, &ids, Duration::from_secs(20)).await;
    let first = receiver.received()[0].at;
    assert!(
        first >= claimed_at + LEASE - Duration::from_millis(300),
        "the head went out again only once its lease ran out"
    );

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

/// Four submitters race into one line through two instances while both deliver it: every
/// delivery enters and leaves the line exactly once (none is stranded waiting, none goes
/// out beside another), and each submitter's own deliveries arrive in its order.
async fn racing_submitters_share_one_line_through_two_instances(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let apps = [
        TestApp::spawn_with(&db, patient_worker).await,
        TestApp::spawn_with(&db, patient_worker).await,
    ];
    let admin = apps[0].admin_token().await;
    let endpoint = endpoint_on(&apps[0], &admin, &receiver, "race").await;
    let per_submitter = 25;
    let ids: Vec<String> = {
        let submitters = (0..4).map(|submitter| {
            let (app, admin, endpoint) = (&apps[submitter % 2], &admin, &endpoint);
            async move {
                let mut ids = Vec::new();
                for n in 0..per_submitter {
                    let payload = json!({ "n": submitter * 100 + n, "flaky": true, "delayMs": 5 });
                    let submitted =
                        submit_keyed(app, admin, endpoint, payload, Some("shared")).await;
                    ids.push(id_of(&submitted));
                }
                ids
            }
        });
        futures_util::future::join_all(submitters)
            .await
            .into_iter()
            .flatten()
            .collect()
    };
    all_settled(&apps[0], &admin, &ids, Duration::from_secs(60)).await;
    assert!(states(&apps[0], &admin, &ids)
        .await
        .iter()
        .all(|state| state == "DELIVERED"));
    assert_eq!(receiver.most_in_flight_of_line("race", "shared"), 1);
    let arrivals = arrivals_by_key(&receiver, "race")["shared"].clone();
    for submitter in 0..4 {
        let mut own: Vec<i64> = arrivals
            .iter()
            .copied()
            .filter(|n| n / 100 == submitter)
            .collect();
        assert!(
            own.windows(2).all(|pair| pair[0] <= pair[1]),
            "submitter {submitter}'s deliveries arrived out of order: {own:?}"
        );
        own.dedup();
        assert_eq!(own.len(), per_submitter);
    }
    let numbers = count(
        &apps[0].state.db,
        "SELECT COUNT(DISTINCT line_seq) AS n FROM webhook_deliveries",
        vec![],
    )
    .await;
    assert_eq!(numbers, 100, "every delivery has a number of its own");
    let open = count(
        &apps[0].state.db,
        "SELECT COALESCE(SUM(open), 0) AS n FROM ordering_lines",
        vec![],
    )
    .await;
    assert_eq!(open, 0);
}

crate::on_postgres!(
    a_silent_heads_line_waits_for_its_lease_and_its_late_result_changes_nothing,
    racing_submitters_share_one_line_through_two_instances,
);
