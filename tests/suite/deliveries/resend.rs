//! Recovering from a receiver's outage, one delivery at a time: resending a delivered
//! delivery, and test events.

use std::time::Duration;

use courier::auth::Role;
use serde_json::json;
use uuid::Uuid;

use crate::on_both_backends;
use crate::support::fixtures::{
    assert_not_replayable, delivery_id, endpoint_on, quick_worker, rows, submit, wait_for_state,
};
use crate::support::{gql_error_code, Backend, Receiver, TestApp, TestDb};

const RESEND: &str =
    "mutation($id: ID!) { resendDelivery(id: $id) { id state cycleAttempts nextAttemptAt } }";
const TEST_EVENT: &str = "mutation($id: ID!) { sendTestEvent(endpointId: $id) { id state submission { eventType payload } endpoint { id } } }";

/// A partner key for an endpoint of its own, and nothing else.
async fn outsider(app: &TestApp, admin: &str) -> String {
    let (elsewhere, _) = app
        .create_endpoint(admin, "https://example.com/elsewhere")
        .await;
    app.token(Role::Partner, &[Uuid::parse_str(&elsewhere).expect("uuid")])
        .await
}

/// Resending a delivered delivery sends it again with the same `webhook-id`, its history
/// kept; nothing else can be resent.
async fn resend_sends_a_delivered_delivery_again(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "resend").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({ "again": true }), None).await);

    wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    receiver.wait_for(1, Duration::from_secs(10)).await;
    let other = outsider(&app, &admin).await;
    let forbidden = app.graphql(&other, RESEND, json!({ "id": id })).await;
    assert_eq!(gql_error_code(&forbidden), Some("FORBIDDEN"), "{forbidden}");

    let resent = app.graphql(&admin, RESEND, json!({ "id": id })).await;
    assert_eq!(
        resent["data"]["resendDelivery"]["state"], "PENDING",
        "{resent}"
    );
    assert_eq!(resent["data"]["resendDelivery"]["cycleAttempts"], 0);
    let twice = receiver.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(twice[0].webhook_id, id);
    assert_eq!(twice[1].webhook_id, id, "the same webhook-id again");
    assert_eq!(twice[0].raw_body, twice[1].raw_body);
    assert!(twice.iter().all(|r| r.verified));
    let delivery = wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    let numbers: Vec<i64> = delivery["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["number"].as_i64().unwrap_or(0))
        .collect();
    assert_eq!(numbers, [1, 2], "the first attempt is kept");

    rows(
        &app.state.db,
        "UPDATE webhook_deliveries SET state = 'failed'",
        vec![],
    )
    .await;
    let failed = app.graphql(&admin, RESEND, json!({ "id": id })).await;
    assert_not_replayable(
        &failed,
        "FAILED",
        Some("delivery is failed, only delivered deliveries can be resent"),
    );
    let unknown = app
        .graphql(&admin, RESEND, json!({ "id": Uuid::now_v7().to_string() }))
        .await;
    assert_eq!(gql_error_code(&unknown), Some("NOT_FOUND"), "{unknown}");
}

/// A resend that loses the race is told the state it lost to, even when the winner's cycle
/// has ended by the time it could read the row again: here one transaction holds the
/// delivery `pending` (uncommitted) as a winning resend would, while the resend waits for
/// it, and another, queued behind the resend, sets it `delivered` again (not waiting for
/// its flush) the moment the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_losing_resend_is_told_the_state_it_lost_to() {
    use sea_orm::{ConnectionTrait as _, TransactionTrait as _};
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "raced").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await);
    wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;

    let other = db.connect(2).await;
    let set =
        |state: &str| format!("UPDATE webhook_deliveries SET state = '{state}' WHERE id = '{id}'");
    let winner = other.conn().begin().await.expect("begin");
    winner
        .execute_unprepared(&set("pending"))
        .await
        .expect("hold it pending");
    let settler = other.conn().begin().await.expect("begin");
    settler
        .execute_unprepared("SET LOCAL synchronous_commit = off")
        .await
        .expect("no flush");
    let resend = {
        let (app, admin, id) = (&app, admin.clone(), id.clone());
        async move { app.graphql(&admin, RESEND, json!({ "id": id })).await }
    };
    let racing = async {
        // The resend waits on the row by now; the settler queues behind it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let settled = async {
            settler
                .execute_unprepared(&set("delivered"))
                .await
                .expect("delivered again");
            settler.commit().await.expect("commit");
        };
        let released = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            winner.commit().await.expect("commit");
        };
        tokio::join!(settled, released);
    };
    let (lost, ()) = tokio::join!(resend, racing);
    assert_not_replayable(
        &lost,
        "PENDING",
        Some("delivery is pending, only delivered deliveries can be resent"),
    );
}

/// A test event is a signed `courier.test` webhook, recorded like any delivery.
async fn a_test_event_is_signed_and_recorded(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "test").await;

    let sent = app
        .graphql(&admin, TEST_EVENT, json!({ "id": endpoint }))
        .await;
    let delivery = &sent["data"]["sendTestEvent"];
    assert_eq!(delivery["endpoint"]["id"], endpoint.as_str(), "{sent}");
    assert_eq!(delivery["submission"]["eventType"], "courier.test");
    assert_eq!(delivery["submission"]["payload"]["type"], "courier.test");
    assert_eq!(
        delivery["submission"]["payload"]["endpointId"],
        endpoint.as_str()
    );
    let id = delivery["id"].as_str().expect("id").to_owned();
    let arrived = receiver.wait_for(1, Duration::from_secs(10)).await;
    assert!(arrived[0].verified, "signed with the endpoint's secret");
    assert_eq!(arrived[0].webhook_id, id);
    assert_eq!(arrived[0].body["type"], "courier.test");
    let recorded = wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    assert_eq!(recorded["attempts"][0]["statusCode"], 200);

    let unknown = app
        .graphql(
            &admin,
            TEST_EVENT,
            json!({ "id": Uuid::now_v7().to_string() }),
        )
        .await;
    assert_eq!(gql_error_code(&unknown), Some("NOT_FOUND"), "{unknown}");
    let outsider = outsider(&app, &admin).await;
    let forbidden = app
        .graphql(&outsider, TEST_EVENT, json!({ "id": endpoint }))
        .await;
    assert_eq!(gql_error_code(&forbidden), Some("FORBIDDEN"), "{forbidden}");
    let partner = app
        .token(Role::Partner, &[Uuid::parse_str(&endpoint).expect("uuid")])
        .await;
    let own = app
        .graphql(&partner, TEST_EVENT, json!({ "id": endpoint }))
        .await;
    assert!(own["data"]["sendTestEvent"]["id"].is_string(), "{own}");
    receiver.wait_for(2, Duration::from_secs(10)).await;
}

/// The payload limit is for callers' payloads: a test event is sent under a limit smaller
/// than itself, which still refuses a submission as large.
async fn a_test_event_is_sent_under_any_payload_limit(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_payload_bytes = 64;
    })
    .await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "small").await;

    let sent = app
        .graphql(&admin, TEST_EVENT, json!({ "id": endpoint }))
        .await;
    let payload = &sent["data"]["sendTestEvent"]["submission"]["payload"];
    assert_eq!(payload["type"], "courier.test", "{sent}");
    assert!(
        payload.to_string().len() > 64,
        "larger than the limit: {payload}"
    );
    let arrived = receiver.wait_for(1, Duration::from_secs(10)).await;
    assert!(arrived[0].verified);

    let submitted = app
        .graphql(
            &admin,
            "mutation($e: ID!, $p: JSON!) { submit(input: {endpointId: $e, payload: $p}) { created } }",
            json!({ "e": endpoint, "p": payload }),
        )
        .await;
    assert_eq!(
        gql_error_code(&submitted),
        Some("BAD_USER_INPUT"),
        "{submitted}"
    );
}

on_both_backends!(
    resend_sends_a_delivered_delivery_again,
    a_test_event_is_signed_and_recorded,
    a_test_event_is_sent_under_any_payload_limit,
);
