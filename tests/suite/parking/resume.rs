//! Resuming without waiting for a poll: a re-enabled endpoint's parked deliveries become
//! due with no state change to announce them, so the process that re-enabled it wakes its
//! own worker, and on PostgreSQL every other process's.

use std::time::Duration;

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{endpoint_on, eventually, rarely_polling_worker};
use crate::support::ordering::{all_settled, id_of, obedient_receiver, read, states, submit_keyed};
use crate::support::{Backend, TestApp, TestDb};
use courier::config::ServeArgs;

/// [`rarely_polling_worker`], with retries ten minutes apart.
fn rarely_retrying_worker(config: &mut ServeArgs) {
    rarely_polling_worker(config);
    config.retry_base_ms = Some(600_000);
    config.retry_max_ms = 600_000;
}

/// Two deliveries that failed once wait ten minutes for their retry; the endpoint is
/// disabled (they are parked) and re-enabled (they are due at once): both are delivered
/// within seconds, though the worker polls every ten minutes.
async fn a_reenabled_endpoint_resumes_without_waiting_for_a_poll(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, rarely_retrying_worker).await;
    resumes_when_switched_through(&app, &app).await;
}

/// The same, switched through an API-only process: the worker of another process hears
/// of it.
async fn an_endpoint_reenabled_elsewhere_resumes_without_waiting_for_a_poll(backend: Backend) {
    let db = TestDb::new(backend).await;
    let worker = TestApp::spawn_with(&db, rarely_retrying_worker).await;
    let api = TestApp::spawn(&db).await;
    resumes_when_switched_through(&worker, &api).await;
}

/// Two deliveries through `app` fail once, then `switch` disables and re-enables their
/// endpoint: both are delivered within seconds.
async fn resumes_when_switched_through(app: &TestApp, switch: &TestApp) {
    let receiver = obedient_receiver().await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(app, &admin, &receiver, "resume").await;
    let mut ids = Vec::new();
    for n in 0..2 {
        let payload = json!({ "n": n, "failFirst": 1 });
        ids.push(id_of(
            &submit_keyed(app, &admin, &endpoint, payload, None).await,
        ));
    }
    // Received, then recorded: each is `PENDING` again, its retry ten minutes away (a
    // failure recorded after the switch below would schedule that retry after it).
    eventually("each failed once", Duration::from_secs(30), || async {
        if receiver.received().len() < 2 {
            return false;
        }
        for id in &ids {
            let delivery = read(app, &admin, id).await;
            if delivery["state"] != "PENDING" || delivery["nextAttemptAt"].is_null() {
                return false;
            }
        }
        true
    })
    .await;
    let toggle = "mutation($id: ID!, $off: Boolean!) { updateEndpoint(id: $id, input: {disabled: $off}) { endpoint { disabled } } }";
    for off in [true, false] {
        let body = switch
            .graphql(&admin, toggle, json!({ "id": endpoint, "off": off }))
            .await;
        assert_eq!(
            body["data"]["updateEndpoint"]["endpoint"]["disabled"], off,
            "{body}"
        );
    }
    all_settled(app, &admin, &ids, Duration::from_secs(30)).await;
    assert_eq!(
        states(app, &admin, &ids).await,
        vec!["DELIVERED", "DELIVERED"]
    );
    assert_eq!(
        receiver.received().len(),
        4,
        "one failure and one success each"
    );
}

on_both_backends!(a_reenabled_endpoint_resumes_without_waiting_for_a_poll);

crate::on_postgres!(an_endpoint_reenabled_elsewhere_resumes_without_waiting_for_a_poll);
