//! Backlogs for the claim tests: an API-only app with pending deliveries, submitted
//! through the service layer as a caller would.

use courier::auth::{self, Identity};
use uuid::Uuid;

use super::{TestApp, TestDb};

/// An API-only app with `count` pending deliveries to one endpoint; returns their ids.
pub async fn seed(db: &TestDb, count: usize) -> (TestApp, Vec<Uuid>) {
    seed_spread(db, 1, count).await
}

/// An API-only app with `per_endpoint` pending deliveries to each of `endpoints` endpoints,
/// submitted round robin; returns their ids in submission order.
pub async fn seed_spread(
    db: &TestDb,
    endpoints: usize,
    per_endpoint: usize,
) -> (TestApp, Vec<Uuid>) {
    let app = TestApp::spawn(db).await;
    let token = app.admin_token().await;
    let caller: Identity = auth::authenticate(&app.state.db, Some(&format!("Bearer {token}")))
        .await
        .expect("caller");
    let mut targets = Vec::with_capacity(endpoints);
    for _ in 0..endpoints {
        let (endpoint, _) = app
            .create_endpoint(&token, "https://example.com/hook")
            .await;
        targets.push(Uuid::parse_str(&endpoint).expect("uuid"));
    }
    let mut ids = Vec::new();
    for n in 0..endpoints * per_endpoint {
        let input = courier::service::submissions::NewSubmission {
            endpoint_id: targets[n % endpoints],
            payload: serde_json::json!({ "n": n }),
            idempotency_key: None,
            event_type: None,
            ordering_key: None,
        };
        ids.push(
            app.state
                .submissions
                .submit(&caller, input)
                .await
                .expect("submit")
                .delivery
                .id,
        );
    }
    (app, ids)
}
