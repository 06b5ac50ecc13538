//! A page of a tenant of hundreds of endpoints, most of them quiet, in a busy installation's
//! history reads a few index pages per endpoint and a page, and is planned as two
//! statements, not one per endpoint.

use chrono::{Duration, Utc};
use courier::service::deliveries::DeliveryFilter;
use courier::service::pagination::PageRequest;
use entity::webhook_delivery::DeliveryState;

use crate::support::fixtures::{rows, V7};
use crate::support::history::{
    assert_pages_read_little, cursor_at, over_a_set, seed_history, tenant_key, PlanCase,
    MOST_BUFFERS,
};
use crate::support::sets::{endpoints, identity, new_tenant};
use crate::support::{Backend, TestApp, TestDb};

/// Endpoints of the tenant of many.
const MANY: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_of_many_endpoints_reads_a_descent_each_and_a_page() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    // The busy installation: 20 endpoints and a month of history (see `seed_history`).
    let busy = endpoints(&app, &admin, crate::support::history::ENDPOINTS, None).await;
    seed_history(&app, busy[19], busy[8]).await;
    // The tenant: many endpoints, one in five with one delivery (three weeks old, some of
    // them failed, of each event type), two of the busy ones, and the rest never sent to.
    let many = new_tenant(&app, "many").await;
    rows(
        &app.state.db,
        &format!(
            "INSERT INTO endpoints (id, name, url, signing_secret, created_at, updated_at, tenant_id)
             SELECT gen_random_uuid(), 'quiet', url, signing_secret, now(), now(), $1
             FROM (SELECT url, signing_secret FROM endpoints LIMIT 1) e,
                  generate_series(1, {MANY} - 2)"
        ),
        vec![many.into()],
    )
    .await;
    rows(
        &app.state.db,
        &format!(
            "UPDATE endpoints SET tenant_id = $1 WHERE id IN ('{}', '{}')",
            busy[3], busy[19]
        ),
        vec![many.into()],
    )
    .await;
    let id = |at: &str| V7.replace("{at}", at);
    let sql = format!(
        "WITH e AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM endpoints
                    WHERE tenant_id = $1 AND name = 'quiet'),
         s AS (
           INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at, event_type)
           SELECT {sid}, e.id, '{{}}', md5(e.n::text),
                  now() - interval '21 days' + e.n * interval '1 minute',
                  (ARRAY['order.paid', 'order.shipped', NULL])[1 + e.n % 3]
           FROM e WHERE e.n % 5 = 0
           RETURNING id, endpoint_id, created_at, event_type)
         INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts,
                                         created_at, updated_at, event_type)
         SELECT {did}, s.id, s.endpoint_id,
                CASE WHEN s.event_type = 'order.shipped' THEN 'failed' ELSE 'delivered' END,
                1, s.created_at, s.created_at, s.event_type
         FROM s",
        sid = id("(now() - interval '21 days' + e.n * interval '1 minute')"),
        did = id("s.created_at"),
    );
    rows(&app.state.db, &sql, vec![many.into()]).await;
    let key = identity(&app, tenant_key(&app, many).await).await;
    let admin_identity = identity(&app, admin.clone()).await;
    let deep = cursor_at(
        &app,
        &format!(
            "SELECT d.id FROM webhook_deliveries d JOIN endpoints e ON e.id = d.endpoint_id
             WHERE e.tenant_id = '{many}' ORDER BY d.id DESC OFFSET 20000 LIMIT 1"
        ),
    )
    .await;
    let now = Utc::now();
    let cases: Vec<PlanCase> = vec![
        ("everything", &key, DeliveryFilter::default(), None),
        (
            "everything, deep",
            &key,
            DeliveryFilter::default(),
            Some(deep),
        ),
        (
            "for an admin",
            &admin_identity,
            DeliveryFilter {
                tenant_id: Some(many),
                ..Default::default()
            },
            None,
        ),
        (
            "failed",
            &key,
            DeliveryFilter {
                state: Some(DeliveryState::Failed),
                ..Default::default()
            },
            None,
        ),
        (
            "pending",
            &key,
            DeliveryFilter {
                state: Some(DeliveryState::Pending),
                ..Default::default()
            },
            None,
        ),
        (
            "an event type",
            &key,
            DeliveryFilter {
                event_type: Some("order.paid".into()),
                ..Default::default()
            },
            None,
        ),
        (
            "an event type nobody has",
            &key,
            DeliveryFilter {
                event_type: Some("nobody.has".into()),
                ..Default::default()
            },
            None,
        ),
        (
            "three weeks ago",
            &key,
            DeliveryFilter {
                created_after: Some(now - Duration::days(22)),
                created_before: Some(now - Duration::days(20)),
                ..Default::default()
            },
            None,
        ),
        (
            "failed in a month",
            &key,
            DeliveryFilter {
                state: Some(DeliveryState::Failed),
                created_after: Some(now - Duration::days(31)),
                ..Default::default()
            },
            None,
        ),
    ];
    // A descent into one index for each endpoint (a few pages), and a page's worth of each
    // busy endpoint read (the two of the busy installation's).
    let most = |_: &PlanCase<'_>, first| MOST_BUFFERS + 5 * MANY as i64 + over_a_set(2, first);
    assert_pages_read_little(&app, &cases, most).await;
    // Three scans of deliveries planned, whatever the set and the page (the heads, each
    // endpoint's newest, the page's rows read whole): never one for each of the tenant's
    // endpoints (planning hundreds of branches took longer than reading them), nor one
    // for each endpoint a page can come from (0.2 ms of planning each).
    for (name, who, filter, after) in &cases {
        for first in [1, 50, courier::service::pagination::MAX_PAGE_SIZE] {
            let page = PageRequest {
                first,
                after: *after,
                after_at: None,
            };
            let plans = app
                .state
                .deliveries
                .explain_listing(who, filter.clone(), &page)
                .await
                .expect("explain");
            let scans = serde_json::Value::from(plans)
                .to_string()
                .matches(r#""Relation Name":"webhook_deliveries""#)
                .count();
            assert!(scans >= 1, "{name}: no scan of deliveries");
            assert!(
                scans <= 3,
                "{name}, first {first}: {scans} scans of deliveries planned"
            );
        }
    }
}
