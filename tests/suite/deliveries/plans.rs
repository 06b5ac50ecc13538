//! Listings stay index-backed as history grows: every `deliveries` filter and combination,
//! and paging deep into them, for admins, partners and tenants (a busy one and a quiet
//! one), run against 300,000 deliveries of history written in the shape Courier writes
//! them, on tables never vacuumed, never analyzed, then analyzed. The measure is the work
//! each page actually did (`EXPLAIN (ANALYZE, BUFFERS)`): pages of the table or its
//! indexes touched, which a scan of history would multiply. Listings run with bitmap
//! scans (and, read in an index's order, sorts) off (`Db::begin_listing`), so even a
//! planner without statistics walks an index in the listing's order and stops.

use chrono::{Duration, Utc};
use courier::auth::{self, Identity, Role};
use courier::service::deliveries::DeliveryFilter;
use entity::webhook_delivery::DeliveryState;
use uuid::Uuid;

use crate::support::fixtures::rows;
use crate::support::history::{
    assert_pages_read_little, cursor_at, lists_a_set, over_a_set, seed_history, tenant_key,
    PlanCase, ENDPOINTS, MOST_BUFFERS,
};
use crate::support::sets::new_tenant;
use crate::support::{Backend, TestApp, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listing_reads_a_page_not_the_history() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let mut endpoints = Vec::new();
    for _ in 0..ENDPOINTS {
        let (id, _) = app
            .create_endpoint(&admin, "https://example.com/hook")
            .await;
        endpoints.push(Uuid::parse_str(&id).expect("uuid"));
    }
    // A receiver that was down for the whole month: every delivery of one endpoint failed.
    let down = endpoints[19];
    // An endpoint that never gets a type every other endpoint gets (it does not subscribe
    // to it): its listing of that type must find nothing without walking either.
    let without_paid = endpoints[8];
    seed_history(&app, down, without_paid).await;
    let caller: Identity = auth::authenticate(&app.state.db, Some(&format!("Bearer {admin}")))
        .await
        .expect("caller");
    let partner_token = app.token(Role::Partner, &endpoints[..3]).await;
    let identity = |token: String| {
        let db = app.state.db.clone();
        async move {
            auth::authenticate(&db, Some(&format!("Bearer {token}")))
                .await
                .expect("a caller")
        }
    };
    let partner = identity(partner_token).await;
    // A busy tenant (five of the endpoints, a quarter of history), and a quiet one whose
    // two endpoints have one delivery between them: its pages must not walk everyone's
    // history looking for its rows.
    let tenant = |name: &'static str| new_tenant(&app, name);
    let (busy, quiet) = (tenant("busy").await, tenant("quiet").await);
    rows(
        &app.state.db,
        &format!(
            "UPDATE endpoints SET tenant_id = '{busy}' WHERE id IN ({})",
            endpoints[10..15]
                .iter()
                .map(|id| format!("'{id}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        vec![],
    )
    .await;
    let mut quiet_endpoints = Vec::new();
    for _ in 0..2 {
        let (id, _) = app
            .create_endpoint(&admin, "https://example.com/quiet")
            .await;
        let id = Uuid::parse_str(&id).expect("uuid");
        rows(
            &app.state.db,
            &format!("UPDATE endpoints SET tenant_id = '{quiet}' WHERE id = '{id}'"),
            vec![],
        )
        .await;
        quiet_endpoints.push(id);
    }
    let submitted = crate::support::fixtures::submit(
        &app,
        &admin,
        &quiet_endpoints[0].to_string(),
        serde_json::json!({}),
        None,
    )
    .await;
    assert!(submitted["errors"].is_null(), "{submitted}");
    let busy_key = identity(tenant_key(&app, busy).await).await;
    let quiet_key = identity(tenant_key(&app, quiet).await).await;
    let quiet_pair = identity(app.token(Role::Partner, &quiet_endpoints).await).await;
    // Deep pages: after the delivery 290,000 from the newest, and one endpoint's oldest.
    let deep = cursor_at(
        &app,
        "SELECT id FROM webhook_deliveries ORDER BY id DESC OFFSET 290000 LIMIT 1",
    )
    .await;
    // A month's listing paged 25 days deep: where the cursor stands is where reading starts.
    let deep_in_the_month = cursor_at(
        &app,
        "SELECT id FROM webhook_deliveries ORDER BY created_at DESC, id DESC OFFSET 250000 LIMIT 1",
    )
    .await;
    let busy_deep_in_the_month = cursor_at(&app, &format!(
            "SELECT d.id FROM webhook_deliveries d JOIN endpoints e ON e.id = d.endpoint_id \
             WHERE e.tenant_id = '{busy}' ORDER BY d.created_at DESC, d.id DESC OFFSET 60000 LIMIT 1"
        )).await;
    let now = Utc::now();
    let in_the_day = cursor_at(
        &app,
        "SELECT id FROM webhook_deliveries WHERE created_at < now() - interval '10 days' \
         ORDER BY created_at DESC, id DESC OFFSET 5000 LIMIT 1",
    )
    .await;
    let endpoint = Some(endpoints[7]);
    let filter = |f: fn(&mut DeliveryFilter)| {
        let mut filter = DeliveryFilter::default();
        f(&mut filter);
        filter
    };
    let cases: Vec<PlanCase> = vec![
        ("everything", &caller, DeliveryFilter::default(), None),
        (
            "everything, deep",
            &caller,
            DeliveryFilter::default(),
            Some(deep),
        ),
        (
            "one endpoint",
            &caller,
            DeliveryFilter {
                endpoint_id: endpoint,
                ..Default::default()
            },
            None,
        ),
        (
            "one endpoint, deep",
            &caller,
            DeliveryFilter {
                endpoint_id: endpoint,
                ..Default::default()
            },
            Some(deep),
        ),
        (
            "failed",
            &caller,
            filter(|f| f.state = Some(DeliveryState::Failed)),
            None,
        ),
        (
            "failed, deep",
            &caller,
            filter(|f| f.state = Some(DeliveryState::Failed)),
            Some(deep),
        ),
        (
            "pending",
            &caller,
            filter(|f| f.state = Some(DeliveryState::Pending)),
            None,
        ),
        (
            "processing (none)",
            &caller,
            filter(|f| f.state = Some(DeliveryState::Processing)),
            None,
        ),
        (
            "delivered",
            &caller,
            filter(|f| f.state = Some(DeliveryState::Delivered)),
            None,
        ),
        (
            "one endpoint's pending",
            &caller,
            DeliveryFilter {
                endpoint_id: endpoint,
                state: Some(DeliveryState::Pending),
                ..Default::default()
            },
            None,
        ),
        (
            "one endpoint's failed",
            &caller,
            DeliveryFilter {
                endpoint_id: endpoint,
                state: Some(DeliveryState::Failed),
                ..Default::default()
            },
            None,
        ),
        (
            "one endpoint's failed, deep",
            &caller,
            DeliveryFilter {
                endpoint_id: endpoint,
                state: Some(DeliveryState::Failed),
                ..Default::default()
            },
            Some(deep),
        ),
        (
            "one endpoint's event type",
            &caller,
            DeliveryFilter {
                endpoint_id: endpoint,
                event_type: Some("order.paid".into()),
                ..Default::default()
            },
            None,
        ),
        (
            "failed of an event type",
            &caller,
            DeliveryFilter {
                state: Some(DeliveryState::Failed),
                event_type: Some("order.paid".into()),
                ..Default::default()
            },
            None,
        ),
        (
            "an event type, deep",
            &caller,
            filter(|f| f.event_type = Some("order.paid".into())),
            Some(deep),
        ),
        (
            "an event type",
            &caller,
            filter(|f| f.event_type = Some("order.paid".into())),
            None,
        ),
        (
            "an event type nobody has",
            &caller,
            filter(|f| f.event_type = Some("nobody.has".into())),
            None,
        ),
        (
            "one day, ten days ago",
            &caller,
            DeliveryFilter {
                created_after: Some(now - Duration::days(11)),
                created_before: Some(now - Duration::days(10)),
                ..Default::default()
            },
            None,
        ),
        (
            "one day, deep",
            &caller,
            DeliveryFilter {
                created_after: Some(now - Duration::days(11)),
                created_before: Some(now - Duration::days(10)),
                ..Default::default()
            },
            Some(in_the_day),
        ),
        (
            "delivered in a month",
            &caller,
            DeliveryFilter {
                state: Some(DeliveryState::Delivered),
                created_after: Some(now - Duration::days(31)),
                ..Default::default()
            },
            None,
        ),
        (
            "an event type in a month",
            &caller,
            DeliveryFilter {
                event_type: Some("order.paid".into()),
                created_after: Some(now - Duration::days(31)),
                ..Default::default()
            },
            None,
        ),
        (
            "a busy tenant's event type in a month",
            &busy_key,
            DeliveryFilter {
                event_type: Some("order.paid".into()),
                created_after: Some(now - Duration::days(31)),
                ..Default::default()
            },
            None,
        ),
        (
            "one endpoint's event type it never gets, in a month",
            &caller,
            DeliveryFilter {
                endpoint_id: Some(without_paid),
                event_type: Some("order.paid".into()),
                created_after: Some(now - Duration::days(31)),
                ..Default::default()
            },
            None,
        ),
        (
            "a busy tenant's event type nobody has in a month",
            &busy_key,
            DeliveryFilter {
                event_type: Some("nobody.has".into()),
                created_after: Some(now - Duration::days(31)),
                ..Default::default()
            },
            None,
        ),
        (
            "an event type nobody has in a month",
            &caller,
            DeliveryFilter {
                event_type: Some("nobody.has".into()),
                created_after: Some(now - Duration::days(31)),
                ..Default::default()
            },
            None,
        ),
        (
            "a down endpoint's delivered",
            &caller,
            DeliveryFilter {
                endpoint_id: Some(down),
                state: Some(DeliveryState::Delivered),
                ..Default::default()
            },
            None,
        ),
        (
            "a down endpoint's delivered in a month",
            &caller,
            DeliveryFilter {
                endpoint_id: Some(down),
                state: Some(DeliveryState::Delivered),
                created_after: Some(now - Duration::days(31)),
                ..Default::default()
            },
            None,
        ),
        (
            "a down endpoint's failures of one type in one day",
            &caller,
            DeliveryFilter {
                endpoint_id: Some(down),
                state: Some(DeliveryState::Failed),
                event_type: Some("order.paid".into()),
                created_after: Some(now - Duration::days(11)),
                created_before: Some(now - Duration::days(10)),
                ..Default::default()
            },
            None,
        ),
        (
            "failures in one day",
            &caller,
            DeliveryFilter {
                state: Some(DeliveryState::Failed),
                created_after: Some(now - Duration::days(11)),
                created_before: Some(now - Duration::days(10)),
                ..Default::default()
            },
            None,
        ),
        (
            "a month, 25 days deep",
            &caller,
            DeliveryFilter {
                created_after: Some(now - Duration::days(31)),
                created_before: Some(now),
                ..Default::default()
            },
            Some(deep_in_the_month),
        ),
        (
            "a busy tenant's month, 25 days deep",
            &busy_key,
            DeliveryFilter {
                created_after: Some(now - Duration::days(31)),
                ..Default::default()
            },
            Some(busy_deep_in_the_month),
        ),
        (
            "one endpoint's day",
            &caller,
            DeliveryFilter {
                endpoint_id: endpoint,
                created_after: Some(now - Duration::days(11)),
                created_before: Some(now - Duration::days(10)),
                ..Default::default()
            },
            None,
        ),
        (
            "a partner's three endpoints",
            &partner,
            DeliveryFilter::default(),
            None,
        ),
        (
            "a partner's failed",
            &partner,
            filter(|f| f.state = Some(DeliveryState::Failed)),
            None,
        ),
        (
            "a busy tenant's key",
            &busy_key,
            DeliveryFilter::default(),
            None,
        ),
        (
            "a busy tenant's key, deep",
            &busy_key,
            DeliveryFilter::default(),
            Some(deep),
        ),
        (
            "a busy tenant's failed of an event type",
            &busy_key,
            DeliveryFilter {
                state: Some(DeliveryState::Failed),
                event_type: Some("order.paid".into()),
                ..Default::default()
            },
            None,
        ),
        (
            "a quiet tenant's key",
            &quiet_key,
            DeliveryFilter::default(),
            None,
        ),
        (
            "a quiet tenant, for an admin",
            &caller,
            DeliveryFilter {
                tenant_id: Some(quiet),
                ..Default::default()
            },
            None,
        ),
        (
            "a quiet tenant's event type",
            &quiet_key,
            filter(|f| f.event_type = Some("order.paid".into())),
            None,
        ),
        (
            "a quiet tenant's day",
            &quiet_key,
            DeliveryFilter {
                created_after: Some(now - Duration::days(11)),
                created_before: Some(now - Duration::days(10)),
                ..Default::default()
            },
            None,
        ),
        (
            "a partner's two quiet endpoints",
            &quiet_pair,
            DeliveryFilter::default(),
            None,
        ),
    ];
    // A set of endpoints reads a page's worth of each of its busy ones (the busy tenant's
    // five at most).
    let most = |case: &PlanCase<'_>, first| match lists_a_set(case) {
        true => MOST_BUFFERS + over_a_set(5, first),
        false => MOST_BUFFERS,
    };
    assert_pages_read_little(&app, &cases, most).await;
}
