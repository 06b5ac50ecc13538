//! The claim a submission's own statement makes (PostgreSQL) counts what is in flight in the
//! statement's snapshot: a claim that commits after that snapshot, before the statement
//! takes the endpoint's turn, must stop it. A second connection holds such a claim open
//! while the submission's statement waits behind it, then commits.

use std::time::Duration;

use courier::config::ServeArgs;
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
use serde_json::json;

use super::endpoint_with;
use crate::support::fixtures::{
    count, delivery, delivery_id, eventually, quick_worker, submit, worker_looks,
};
use crate::support::{Backend, Receiver, TestApp, TestDb};

/// What a claim in another process writes, held open: the endpoint's row locked (as a
/// recording locks it), the delivery `processing` under a fresh lease (taken as it fell
/// due), and the endpoint's turn written (as every claim writes it).
const OTHER_CLAIM: [&str; 3] = [
    "SELECT id FROM endpoints WHERE id = $1 FOR NO KEY UPDATE",
    "UPDATE webhook_deliveries SET state = 'processing', claim_token = gen_random_uuid(), \
     claim_expires_at = now() + interval '60 seconds', \
     next_attempt_at = now() + interval '60 seconds' WHERE endpoint_id = $1",
    "UPDATE endpoint_flow SET served_at = now(), turn_at = now() + interval '60 seconds' \
     WHERE endpoint_id = $1",
];

/// An endpoint with `maxInFlight: 1` whose one slot another connection is claiming, for a
/// delivery that was not yet due when the submission's statement began: that statement,
/// which took the endpoint's turn after the claim committed, claims nothing at submit (its
/// snapshot saw nothing in flight), and the endpoint never has two requests in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_committed_while_a_submission_is_stored_stops_its_claim() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::accepting().await;
    let api = TestApp::spawn(&db).await;
    let admin = api.admin_token().await;
    let endpoint = endpoint_with(&api, &admin, &receiver, "one", json!({ "maxInFlight": 1 })).await;
    let endpoint_id: uuid::Uuid = endpoint.parse().expect("an endpoint id");
    let first = submit(&api, &admin, &endpoint, json!({ "n": 0 }), None).await;
    let first: uuid::Uuid = delivery_id(&first).parse().expect("a delivery id");

    // Due later, as a retry is: not due, and not in flight, in the submission's snapshot.
    let other = db.connect(1).await;
    other
        .conn()
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 hour' WHERE id = $1",
            [first.into()],
        ))
        .await
        .expect("schedule the first delivery later");
    let claim = other.conn().begin().await.expect("begin the other claim");
    for sql in OTHER_CLAIM {
        claim
            .execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                sql,
                [endpoint_id.into()],
            ))
            .await
            .expect("the other claim's write");
    }

    let app = std::sync::Arc::new(
        TestApp::spawn_with(&db, |config: &mut ServeArgs| {
            quick_worker(config);
            config.lease_secs = 60;
        })
        .await,
    );
    let submitting = {
        let (app, admin, endpoint) = (app.clone(), admin.clone(), endpoint.clone());
        tokio::spawn(async move { submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await })
    };
    // The submission's statement (the store statement) has its snapshot and waits for the
    // endpoint's row.
    let watcher = db.connect(1).await;
    eventually(
        "the submission waits for the other claim",
        Duration::from_secs(10),
        || async {
            count(
                &watcher,
                "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND query LIKE 'WITH input (submission_id%'",
                vec![],
            )
            .await
                > 0
        },
    )
    .await;
    claim.commit().await.expect("commit the other claim");

    let second = submitting.await.expect("the submitter");
    assert!(second["errors"].is_null(), "{second}");
    let second: uuid::Uuid = delivery_id(&second).parse().expect("a delivery id");
    assert_eq!(
        app.state.metrics.claims_at_submit.get(),
        0,
        "the endpoint's one slot was taken after the statement's snapshot"
    );
    // Whatever claims run meanwhile, the slot stays the other claim's until its lease ends
    // (60 s): the worker looks again, and still nothing goes out.
    worker_looks(&app, 2).await;
    assert_eq!(
        delivery(&app.state.db, first).await.state,
        DeliveryState::Processing
    );
    assert_eq!(
        delivery(&app.state.db, second).await.state,
        DeliveryState::Pending
    );
    assert_eq!(
        receiver.received().len(),
        0,
        "nothing was sent past the cap"
    );
}
