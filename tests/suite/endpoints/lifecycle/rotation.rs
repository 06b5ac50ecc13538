//! Secret rotation with overlap: during the grace period every webhook carries both
//! signatures and verifies with either secret; afterwards only the new one signs. The
//! rotation is made on one instance and honoured by the worker of another.

use std::time::Duration;

use serde_json::{json, Value};

use crate::on_both_backends;
use crate::support::fixtures::delivery_id;
use crate::support::fixtures::rows;
use crate::support::fixtures::submit;
use crate::support::fixtures::{quick_worker, wait_for_state};
use crate::support::{gql_error_code, Backend, Receiver, TestApp, TestDb};

const ROTATE: &str = "mutation($id: ID!, $grace: Int) { rotateEndpointSecret(id: $id, graceSeconds: $grace) { secret endpoint { id previousSecretExpiresAt } } }";

async fn rotate(app: &TestApp, admin: &str, id: &str, grace: Option<i64>) -> Value {
    app.graphql(admin, ROTATE, json!({ "id": id, "grace": grace }))
        .await
}

fn minted(body: &Value) -> String {
    body["data"]["rotateEndpointSecret"]["secret"]
        .as_str()
        .unwrap_or_else(|| panic!("no secret: {body}"))
        .to_owned()
}

/// Submits through `api`, waits for the worker instance to deliver it, and returns what
/// the receiver got for it.
async fn deliver_one(
    api: &TestApp,
    worker: &TestApp,
    admin: &str,
    receiver: &Receiver,
    endpoint: &str,
) -> crate::support::receiver::Received {
    let id = delivery_id(&submit(api, admin, endpoint, json!({ "n": 1 }), None).await);
    wait_for_state(worker, admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    receiver
        .received()
        .into_iter()
        .find(|received| received.webhook_id == id)
        .expect("the receiver got it")
}

async fn both_secrets_sign_until_the_grace_period_ends(backend: Backend) {
    let db = TestDb::new(backend).await;
    let api = TestApp::spawn(&db).await;
    let worker = TestApp::spawn_with(&db, quick_worker).await;
    let admin = api.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (endpoint, old) = api.create_endpoint(&admin, &receiver.url("r")).await;

    let rotated = rotate(&api, &admin, &endpoint, Some(3600)).await;
    let new = minted(&rotated);
    assert_ne!(new, old);
    assert!(
        rotated["data"]["rotateEndpointSecret"]["endpoint"]["previousSecretExpiresAt"].is_string(),
        "{rotated}"
    );

    // During the grace period: `v1,<new> v1,<old>`, each verifying on its own.
    let during = deliver_one(&api, &worker, &admin, &receiver, &endpoint).await;
    let signatures: Vec<&str> = during.signature.split(' ').collect();
    assert_eq!(signatures.len(), 2, "{}", during.signature);
    assert!(during.verifies_with(&new), "the new secret verifies");
    assert!(during.verifies_with(&old), "the old secret still verifies");

    // Once the stored expiry has passed (moved into the past rather than waited for),
    // every process signs with the new secret alone.
    let past = courier::db::now() - chrono::Duration::seconds(1);
    let endpoint_id: uuid::Uuid = endpoint.parse().unwrap();
    rows(
        &api.state.db,
        "UPDATE endpoints SET previous_secret_expires_at = $1 WHERE id = $2",
        vec![past.into(), endpoint_id.into()],
    )
    .await;
    let after = deliver_one(&api, &worker, &admin, &receiver, &endpoint).await;
    assert_eq!(after.signature.split(' ').count(), 1, "{}", after.signature);
    assert!(after.verifies_with(&new));
    assert!(
        !after.verifies_with(&old),
        "the old secret no longer verifies"
    );

    // No grace at all: the replaced secret stops at once.
    let newest = minted(&rotate(&api, &admin, &endpoint, Some(0)).await);
    let at_once = deliver_one(&api, &worker, &admin, &receiver, &endpoint).await;
    assert!(at_once.verifies_with(&newest));
    assert!(!at_once.verifies_with(&new));

    let refused = rotate(&api, &admin, &endpoint, Some(-1)).await;
    assert_eq!(
        gql_error_code(&refused),
        Some("BAD_USER_INPUT"),
        "{refused}"
    );
    let partner = api
        .token(courier::auth::Role::Partner, &[endpoint_id])
        .await;
    let refused = rotate(&api, &partner, &endpoint, None).await;
    assert_eq!(gql_error_code(&refused), Some("FORBIDDEN"), "{refused}");
    // The default grace is a day.
    let rotated = rotate(&api, &admin, &endpoint, None).await;
    let expires = rotated["data"]["rotateEndpointSecret"]["endpoint"]["previousSecretExpiresAt"]
        .as_str()
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .expect("an expiry");
    // The expiry is the database's clock plus a day; this process's reading of that clock
    // may trail it by its measurement error, so allow a second either side.
    let left = expires.with_timezone(&chrono::Utc) - courier::db::now();
    assert!(
        left > chrono::Duration::hours(23)
            && left <= chrono::Duration::hours(24) + chrono::Duration::seconds(1),
        "{left}"
    );
}

/// Once its grace period is over, a previous secret is forgotten (nothing signs with it any
/// more, and it is not kept for good); one still within its grace period is kept.
async fn a_previous_secret_is_forgotten_once_its_grace_period_ends(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (short, _) = app
        .create_endpoint(&admin, "https://example.com/short")
        .await;
    let (long, _) = app
        .create_endpoint(&admin, "https://example.com/long")
        .await;
    minted(&rotate(&app, &admin, &short, Some(1)).await);
    minted(&rotate(&app, &admin, &long, Some(600)).await);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    courier::worker::retired_secrets::forget(&app.state.db)
        .await
        .expect("forgets");
    let kept = rows(
        &app.state.db,
        "SELECT id FROM endpoints WHERE previous_signing_secret IS NOT NULL \
         OR previous_secret_expires_at IS NOT NULL",
        vec![],
    )
    .await;
    let kept: Vec<String> = kept
        .iter()
        .map(|row| {
            row.try_get::<uuid::Uuid>("", "id")
                .expect("an id")
                .to_string()
        })
        .collect();
    assert_eq!(kept, vec![long], "only the one within its grace period");
}

on_both_backends!(
    both_secrets_sign_until_the_grace_period_ends,
    a_previous_secret_is_forgotten_once_its_grace_period_ends,
);
