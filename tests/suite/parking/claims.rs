//! Parking at the claim's edges: a disabled endpoint's deliveries are parked when released,
//! when their lease runs out, when claimed, and when the endpoint is disabled.

use courier::worker::claim::claim_due;
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, Statement};

use crate::on_every_backend;
use crate::support::{Backend, TestDb};

use crate::support::fixtures::delivery;
use crate::support::fixtures::events_for;
use crate::support::fixtures::record_result;
use crate::support::fixtures::LONG_LEASE;
use crate::support::seeding::seed;

/// Parking holds at the edges: a claim given back after its endpoint was disabled is
/// parked, not due; an expired lease of a disabled endpoint is parked by the next claim
/// instead of staying due for every claim to scan past.
async fn released_and_expired_claims_of_a_disabled_endpoint_are_parked(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (app, ids) = seed(&db, 2).await;
    let pool = &app.state.db;
    let events = events_for(pool);
    let claims = claim_due(pool, &events, 10, LONG_LEASE)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 2);
    let admin = app.admin_token().await;
    let endpoint = delivery(pool, ids[0]).await.endpoint_id.to_string();
    let body = app
        .graphql(
            &admin,
            "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: true}) { endpoint { disabled } } }",
            serde_json::json!({ "id": endpoint }),
        )
        .await;
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"]["disabled"], true,
        "{body}"
    );

    courier::worker::claim::release(pool, &events, &claims[..1])
        .await
        .expect("release");
    let released = delivery(pool, claims[0].delivery_id).await;
    assert_eq!(
        (
            released.state,
            released.next_attempt_at,
            released.claim_token
        ),
        (DeliveryState::Pending, None, None),
        "a released claim of a disabled endpoint is parked"
    );

    // The other worker died: its lease ran out an hour ago.
    let past = courier::db::now() - chrono::Duration::hours(1);
    pool.conn()
        .execute_raw(Statement::from_sql_and_values(
            pool.backend(),
            "UPDATE webhook_deliveries SET next_attempt_at = $1, claim_expires_at = $1 WHERE id = $2",
            [past.into(), claims[1].delivery_id.into()],
        ))
        .await
        .expect("expire the lease");
    assert!(claim_due(pool, &events, 10, LONG_LEASE)
        .await
        .expect("claim")
        .is_empty());
    let expired = delivery(pool, claims[1].delivery_id).await;
    assert_eq!(
        (expired.state, expired.next_attempt_at, expired.claim_token),
        (DeliveryState::Pending, None, None),
        "an expired lease of a disabled endpoint is parked"
    );
    assert_eq!(app.state.deliveries.due_count().await.expect("due"), 0);
}

/// Deliveries of a disabled endpoint are never claimed, even when only the flag changed:
/// the claim parks them instead (out of the due index, so no claim scans past them again),
/// and re-enabling the endpoint through the API makes them due.
async fn deliveries_of_disabled_endpoints_are_not_claimed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (app, ids) = seed(&db, 3).await;
    let events = events_for(&app.state.db);
    let conn = app.state.db.conn();
    conn.execute_unprepared("UPDATE endpoints SET disabled = true")
        .await
        .expect("disable");
    assert!(claim_due(&app.state.db, &events, 10, LONG_LEASE)
        .await
        .expect("claim")
        .is_empty());
    for id in &ids {
        let parked = delivery(&app.state.db, *id).await;
        assert_eq!(
            (parked.state, parked.next_attempt_at),
            (DeliveryState::Pending, None)
        );
    }
    let endpoint = delivery(&app.state.db, ids[0]).await.endpoint_id;
    let admin = app.admin_token().await;
    let body = app
        .graphql(
            &admin,
            "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: false}) { endpoint { disabled } } }",
            serde_json::json!({ "id": endpoint.to_string() }),
        )
        .await;
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"]["disabled"], false,
        "{body}"
    );
    assert_eq!(
        claim_due(&app.state.db, &events, 10, LONG_LEASE)
            .await
            .expect("claim")
            .len(),
        3
    );
}

/// Disabling an endpoint through the API parks its pending deliveries (no due time, out
/// of the claim index); re-enabling makes them due again.
async fn disabling_an_endpoint_parks_its_deliveries(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (app, ids) = seed(&db, 3).await;
    let admin = app.admin_token().await;
    let endpoint = delivery(&app.state.db, ids[0])
        .await
        .endpoint_id
        .to_string();
    let toggle = "mutation($id: ID!, $off: Boolean!) { updateEndpoint(id: $id, input: {disabled: $off}) { endpoint { disabled } } }";
    let read = "query($id: ID!) { delivery(id: $id) { state nextAttemptAt } }";

    app.graphql(
        &admin,
        toggle,
        serde_json::json!({ "id": endpoint, "off": true }),
    )
    .await;
    for id in &ids {
        let parked = delivery(&app.state.db, *id).await;
        assert_eq!(
            (parked.state, parked.next_attempt_at),
            (DeliveryState::Pending, None)
        );
    }
    let body = app
        .graphql(
            &admin,
            read,
            serde_json::json!({ "id": ids[0].to_string() }),
        )
        .await;
    assert!(
        body["data"]["delivery"]["nextAttemptAt"].is_null(),
        "{body}"
    );
    assert_eq!(
        app.state.deliveries.due_count().await.expect("due"),
        0,
        "parked rows are not due"
    );
    let events = events_for(&app.state.db);
    assert!(claim_due(&app.state.db, &events, 10, LONG_LEASE)
        .await
        .expect("claim")
        .is_empty());

    app.graphql(
        &admin,
        toggle,
        serde_json::json!({ "id": endpoint, "off": false }),
    )
    .await;
    let body = app
        .graphql(
            &admin,
            read,
            serde_json::json!({ "id": ids[0].to_string() }),
        )
        .await;
    assert!(
        body["data"]["delivery"]["nextAttemptAt"].is_string(),
        "{body}"
    );
    let claims = claim_due(&app.state.db, &events, 10, LONG_LEASE)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 3);

    // A retry scheduled while the endpoint is disabled is parked too.
    app.graphql(
        &admin,
        toggle,
        serde_json::json!({ "id": endpoint, "off": true }),
    )
    .await;
    let retried = record_result(&app.state.db, &claims[0], false).await;
    assert_eq!(retried.new_state, Some(DeliveryState::Pending));
    assert_eq!(
        delivery(&app.state.db, claims[0].delivery_id)
            .await
            .next_attempt_at,
        None
    );
}

on_every_backend!(
    released_and_expired_claims_of_a_disabled_endpoint_are_parked,
    disabling_an_endpoint_parks_its_deliveries,
);

crate::on_postgres!(deliveries_of_disabled_endpoints_are_not_claimed,);
