//! Claims at submit across a stop: a submission that reserved a slot of the worker before
//! the process began to stop, and claims its delivery as it is stored, has the delivery sent
//! within the grace period, rather than left claimed, with nobody to send it, until its
//! lease runs out.

use std::time::Duration;

use sea_orm::{ConnectionTrait as _, TransactionTrait as _};
use serde_json::json;

use crate::support::fixtures::{delivery_id, quick_worker, rows, submit};
use crate::support::{Backend, Receiver, TestApp, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_at_submit_made_as_the_process_stops_is_sent_before_it_stops() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        // No claiming round comes by meanwhile: only the claim at submit can send it.
        config.poll_interval_ms = 10_000;
    })
    .await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app.create_endpoint(&admin, &receiver.url("stop")).await;

    // Another session holds the endpoint's row, so the submission's store statement waits
    // with its slot reserved.
    let other = db.connect(1).await;
    let holding = other.conn().begin().await.expect("a transaction");
    holding
        .execute_unprepared(&format!(
            "SELECT 1 FROM endpoints WHERE id = '{endpoint}' FOR UPDATE"
        ))
        .await
        .expect("the endpoint's row");
    let (answer, ()) = tokio::join!(
        submit(&app, &admin, &endpoint, json!({ "stopping": true }), None),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            app.begin_stop();
            // The worker has begun to stop before the submission can be stored.
            tokio::time::sleep(Duration::from_millis(300)).await;
            holding.commit().await.expect("let it go");
        }
    );
    assert_eq!(answer["data"]["submit"]["created"], true, "{answer}");
    let delivery = delivery_id(&answer);
    assert_eq!(
        app.state.metrics.claims_at_submit.get(),
        1,
        "claimed as it was stored"
    );
    tokio::time::timeout(Duration::from_secs(20), app.stop())
        .await
        .expect("the process stops within its grace period");

    assert_eq!(
        receiver.received().len(),
        1,
        "sent before the process stopped"
    );
    let state: String = rows(
        &other,
        &format!("SELECT state FROM webhook_deliveries WHERE id = '{delivery}'"),
        vec![],
    )
    .await[0]
        .try_get("", "state")
        .expect("its state");
    assert_eq!(state, "delivered");
}
