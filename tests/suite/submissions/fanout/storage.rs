//! A published event's payload is stored once, however many endpoints it reaches, and each
//! webhook body is still exactly that payload.

use std::time::Duration;

use serde_json::{json, Value};

use super::scalar;
use crate::on_both_backends;
use crate::support::fixtures::{publish, quick_worker};
use crate::support::{Backend, Receiver, TestApp, TestDb};

/// A 20 KB event to 30 endpoints: the submissions hold no copy of it, every endpoint
/// receives it byte for byte (verified), and the API shows each submission's payload.
async fn a_published_payload_is_stored_once(backend: Backend) {
    const ENDPOINTS: usize = 30;
    let db = TestDb::new(backend).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    for n in 0..ENDPOINTS {
        let path = format!("e{n}");
        let (_, secret) = app.create_endpoint(&admin, &receiver.url(&path)).await;
        receiver.set_secret(&path, &secret);
    }
    let text = "x".repeat(20_000);
    let payload = json!({ "order": 42, "note": text, "amount": 12.50 });
    let body = publish(&app, &admin, "order.paid", payload.clone(), None).await;
    assert_eq!(body["data"]["publish"]["created"], true, "{body}");
    let event = &body["data"]["publish"]["event"];
    assert_eq!(event["payload"], payload);

    let copies = scalar(
        &app,
        "SELECT COUNT(*) FROM submissions WHERE event_id IS NOT NULL AND LENGTH(CAST(payload AS TEXT)) > 100",
    )
    .await;
    assert_eq!(copies, 0, "no submission keeps a copy of the payload");
    let stored = scalar(&app, "SELECT COUNT(*) FROM events").await;
    assert_eq!(stored, 1);

    let arrived = receiver.wait_for(ENDPOINTS, Duration::from_secs(20)).await;
    let sent: Value = serde_json::from_str(&arrived[0].raw_body).expect("json");
    assert_eq!(sent, payload);
    for webhook in &arrived {
        assert!(webhook.verified, "signed over the body as sent");
        assert_eq!(
            webhook.raw_body, arrived[0].raw_body,
            "the same bytes to every endpoint"
        );
    }
    let deliveries = &event["deliveries"]["edges"];
    let first = deliveries[0]["node"]["id"].as_str().expect("id");
    let read = app
        .graphql(
            &admin,
            "query($id: ID!) { delivery(id: $id) { submission { payload event { id } } } }",
            json!({ "id": first }),
        )
        .await;
    assert_eq!(
        read["data"]["delivery"]["submission"]["payload"], payload,
        "{read}"
    );
}

on_both_backends!(a_published_payload_is_stored_once);
