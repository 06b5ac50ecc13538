//! Who hears about what: endpoints that list a type explicitly (an empty list hears none of
//! them), about endpoints of their own tenant (one without a tenant hears about every
//! endpoint), never about themselves; and two failing operations endpoints do not feed
//! each other events.

use std::time::Duration;

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{
    count, endpoint_on, eventually, failing_at_once, quick_worker, submit,
};
use crate::support::operational::{ops_endpoint, update_endpoint, ALL_TYPES};
use crate::support::tenants::create_tenant;
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// Disabling endpoints of two tenants: each tenant's operations endpoint hears about its
/// own tenant's only, the operator's (no tenant) about both, an endpoint listing nothing
/// hears nothing, and an operations endpoint disabled is not told about itself.
async fn events_reach_their_tenant_and_never_their_subject(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let (acme, globex) = (
        create_tenant(&app, &admin, "Acme").await,
        create_tenant(&app, &admin, "Globex").await,
    );
    let receiver = Receiver::accepting().await;
    ops_endpoint(&app, &admin, &receiver, "operator", None, ALL_TYPES).await;
    let acme_ops = ops_endpoint(&app, &admin, &receiver, "acme-ops", Some(&acme), ALL_TYPES).await;
    ops_endpoint(
        &app,
        &admin,
        &receiver,
        "globex-ops",
        Some(&globex),
        ALL_TYPES,
    )
    .await;
    // Every type but the reserved ones.
    ops_endpoint(&app, &admin, &receiver, "everything", None, &[]).await;
    let acme_app = ops_endpoint(
        &app,
        &admin,
        &receiver,
        "acme-app",
        Some(&acme),
        &["order.paid"],
    )
    .await;

    // The application endpoint first (its tenant's operations endpoint and the operator's
    // are told), then, once they were, the tenant's operations endpoint itself.
    update_endpoint(&app, &admin, &acme_app, json!({ "disabled": true })).await;
    receiver.wait_for(2, Duration::from_secs(10)).await;
    update_endpoint(&app, &admin, &acme_ops, json!({ "disabled": true })).await;
    receiver.wait_for(3, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let heard = |path: &str| -> Vec<String> {
        receiver
            .received()
            .into_iter()
            .filter(|r| r.path == path)
            .map(|r| {
                assert!(r.verified);
                r.body["endpointId"].as_str().unwrap_or_default().to_owned()
            })
            .collect()
    };
    let mut operator_heard = heard("operator");
    operator_heard.sort();
    let mut both = vec![acme_app.clone(), acme_ops.clone()];
    both.sort();
    assert_eq!(
        operator_heard, both,
        "the operator hears about every tenant"
    );
    assert_eq!(heard("acme-ops"), vec![acme_app], "not about itself");
    assert!(heard("globex-ops").is_empty(), "nothing of another tenant");
    assert!(
        heard("everything").is_empty(),
        "an empty list hears no courier.* type"
    );
    assert!(heard("acme-app").is_empty());
}

/// Two operations endpoints that fail everything: a failed delivery elsewhere is told to
/// both, their failed deliveries of that event are told to nobody, and it stops there.
async fn failing_operations_endpoints_make_no_storm(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, failing_at_once).await;
    let admin = app.admin_token().await;
    let failing = Receiver::start(|_| Reply::status(500)).await;
    for path in ["ops-a", "ops-b"] {
        ops_endpoint(
            &app,
            &admin,
            &failing,
            path,
            None,
            &["courier.delivery.failed"],
        )
        .await;
    }
    let watched = endpoint_on(&app, &admin, &failing, "watched").await;
    submit(&app, &admin, &watched, json!({ "n": 1 }), None).await;
    let settled = "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'failed'";
    eventually(
        "the delivery and both its announcements fail",
        Duration::from_secs(15),
        || async { count(&app.state.db, settled, vec![]).await == 3 },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        count(&app.state.db, "SELECT COUNT(*) AS n FROM events", vec![]).await,
        1,
        "one failure, one event"
    );
    assert_eq!(
        count(
            &app.state.db,
            "SELECT COUNT(*) AS n FROM webhook_deliveries",
            vec![]
        )
        .await,
        3
    );
    assert_eq!(failing.received().len(), 3);
}

on_both_backends!(
    events_reach_their_tenant_and_never_their_subject,
    failing_operations_endpoints_make_no_storm,
);
