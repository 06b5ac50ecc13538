//! Listings over a set of endpoints (a tenant's, a partner key's list) page exactly as the
//! same listing read from the whole table and sorted: sets of one endpoint to a hundred and
//! thirty, sets larger and smaller than a page, activity skewed so a few endpoints hold
//! most of it, creation times tied across endpoints and ids out of creation order, every
//! filter, paged to the end at several page sizes; and rows changing between a page's two
//! reads never end the listing early.

use chrono::{Duration, Utc};
use courier::auth::{Identity, Role};
use courier::service::deliveries::DeliveryFilter;
use entity::webhook_delivery::DeliveryState;
use sea_orm::Value as SqlValue;
use uuid::Uuid;

use crate::support::fixtures::{rows, V7};
use crate::support::history::tenant_key;
use crate::support::sets::{endpoints, identity, new_tenant, quoted, walk};
use crate::support::{Backend, TestApp, TestDb};

/// Deliveries seeded over the endpoints.
const HISTORY: i64 = 1_500;

/// [`HISTORY`] deliveries over `endpoints`, the first few of which get most of them: a
/// third of creation times shared by three deliveries (of different endpoints, mostly),
/// ids minted up to a minute off their creation time (so the two orders differ), states
/// mostly delivered, one in ten failed, one in twenty pending (not due for a day, so no
/// worker takes them), and event types `a`, `b` or none.
async fn seed(app: &TestApp, endpoints: &[Uuid]) {
    let id = |at: &str| V7.replace("{at}", at);
    let sql = format!(
        "WITH e AS (SELECT id, ordinality - 1 AS n FROM unnest(ARRAY[{ids}]::uuid[]) WITH ORDINALITY AS e(id)),
         h AS (SELECT i, now() - interval '1 hour' + (i / 3) * interval '1 second' AS at,
                      floor({count} * power(random(), 3))::int AS n
               FROM generate_series(1, {HISTORY}) AS i),
         s AS (
           INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at, event_type)
           SELECT {sid}, e.id, jsonb_build_object('i', h.i), md5(h.i::text), h.at,
                  (ARRAY['a', 'b', NULL])[1 + h.i % 3]
           FROM h JOIN e ON e.n = h.n
           RETURNING id, endpoint_id, created_at, event_type, (payload->>'i')::int AS i),
         st AS (SELECT s.*, CASE WHEN s.i % 20 < 2 THEN 'failed' WHEN s.i % 20 = 2 THEN 'pending'
                                 ELSE 'delivered' END AS state FROM s)
         INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts,
                                         next_attempt_at, created_at, updated_at, event_type)
         SELECT {did}, st.id, st.endpoint_id, st.state, 1,
                CASE WHEN st.state = 'pending' THEN now() + interval '1 day' END,
                st.created_at, st.created_at, st.event_type
         FROM st",
        count = endpoints.len(),
        sid = id("h.at"),
        did = id("(st.created_at + (random() - 0.5) * interval '2 minutes')"),
        ids = quoted(endpoints),
    );
    rows(&app.state.db, &sql, vec![]).await;
}

/// The listing of `filter` over the endpoints `scope` (SQL on `e`, the endpoints
/// table) read from the whole table and sorted, as the set listing must page it.
async fn expected(app: &TestApp, scope: &str, filter: &DeliveryFilter) -> Vec<Uuid> {
    let mut conditions = vec![scope.to_owned()];
    let mut values: Vec<SqlValue> = Vec::new();
    if let Some(state) = filter.state {
        values.push(sea_orm::ActiveEnum::to_value(&state).into());
        conditions.push(format!("d.state = ${}", values.len()));
    }
    if let Some(event_type) = &filter.event_type {
        values.push(event_type.clone().into());
        conditions.push(format!("d.event_type = ${}", values.len()));
    }
    if let Some(after) = filter.created_after {
        values.push(after.into());
        conditions.push(format!("d.created_at >= ${}", values.len()));
    }
    if let Some(before) = filter.created_before {
        values.push(before.into());
        conditions.push(format!("d.created_at < ${}", values.len()));
    }
    let by_time = filter.created_after.is_some() || filter.created_before.is_some();
    let sql = format!(
        "SELECT d.id FROM webhook_deliveries d JOIN endpoints e ON e.id = d.endpoint_id \
         WHERE {} ORDER BY {}d.id DESC",
        conditions.join(" AND "),
        if by_time { "d.created_at DESC, " } else { "" },
    );
    rows(&app.state.db, &sql, values)
        .await
        .iter()
        .map(|row| row.try_get::<Uuid>("", "id").expect("an id"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_listings_page_exactly_as_the_whole_table_sorted() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let tenant = |name: &'static str| new_tenant(&app, name);
    let (large, small, single, empty) = (
        tenant("larger than a page").await,
        tenant("smaller than a page").await,
        tenant("one endpoint").await,
        tenant("no endpoints").await,
    );
    // The large tenant's busiest endpoints come first: the skew falls on them.
    let mut all = endpoints(&app, &admin, 130, Some(large)).await;
    all.extend(endpoints(&app, &admin, 7, Some(small)).await);
    all.extend(endpoints(&app, &admin, 1, Some(single)).await);
    all.extend(endpoints(&app, &admin, 12, None).await);
    seed(&app, &all).await;
    rows(&app.state.db, "ANALYZE", vec![]).await;
    // A partner's list across tenants: some busy endpoints, some quiet, some without one.
    let listed: Vec<Uuid> = all.iter().step_by(2).copied().collect();
    let listed_sql = quoted(&listed);
    let admin_identity = identity(&app, admin.clone()).await;
    let callers: Vec<(String, Identity, Option<Uuid>, String)> = vec![
        (
            "the large tenant's key".into(),
            identity(&app, tenant_key(&app, large).await).await,
            None,
            format!("e.tenant_id = '{large}'"),
        ),
        (
            "the small tenant's key".into(),
            identity(&app, tenant_key(&app, small).await).await,
            None,
            format!("e.tenant_id = '{small}'"),
        ),
        (
            "the one-endpoint tenant's key".into(),
            identity(&app, tenant_key(&app, single).await).await,
            None,
            format!("e.tenant_id = '{single}'"),
        ),
        (
            "the empty tenant's key".into(),
            identity(&app, tenant_key(&app, empty).await).await,
            None,
            format!("e.tenant_id = '{empty}'"),
        ),
        (
            "a partner's list".into(),
            identity(&app, app.token(Role::Partner, &listed).await).await,
            None,
            format!("e.id IN ({listed_sql})"),
        ),
        (
            "an admin's tenant filter".into(),
            admin_identity.clone(),
            Some(large),
            format!("e.tenant_id = '{large}'"),
        ),
    ];
    let now = Utc::now();
    let filters: Vec<(&str, DeliveryFilter)> = vec![
        ("everything", DeliveryFilter::default()),
        (
            "failed",
            DeliveryFilter {
                state: Some(DeliveryState::Failed),
                ..Default::default()
            },
        ),
        (
            "pending",
            DeliveryFilter {
                state: Some(DeliveryState::Pending),
                ..Default::default()
            },
        ),
        (
            "an event type",
            DeliveryFilter {
                event_type: Some("a".into()),
                ..Default::default()
            },
        ),
        (
            "four minutes",
            DeliveryFilter {
                created_after: Some(now - Duration::minutes(58)),
                created_before: Some(now - Duration::minutes(54)),
                ..Default::default()
            },
        ),
        (
            "failed in four minutes",
            DeliveryFilter {
                state: Some(DeliveryState::Failed),
                created_after: Some(now - Duration::minutes(58)),
                created_before: Some(now - Duration::minutes(54)),
                ..Default::default()
            },
        ),
        (
            "an event type since",
            DeliveryFilter {
                event_type: Some("b".into()),
                created_after: Some(now - Duration::minutes(56)),
                ..Default::default()
            },
        ),
    ];
    let mut checked = 0;
    for (who, caller, tenant_filter, scope) in &callers {
        for (what, filter) in &filters {
            let filter = DeliveryFilter {
                tenant_id: *tenant_filter,
                ..filter.clone()
            };
            let want = expected(&app, scope, &filter).await;
            // The history falls in every window asked about, for the large tenant.
            if scope.contains(&large.to_string()) {
                assert!(!want.is_empty(), "{who}, {what}: nothing to page");
            }
            for first in [13, 50, courier::service::pagination::MAX_PAGE_SIZE] {
                let got = walk(&app, caller, &filter, first).await;
                assert_eq!(
                    got.len(),
                    want.len(),
                    "{who}, {what}, {first} a page: how many"
                );
                assert!(
                    got == want,
                    "{who}, {what}, {first} a page: the order differs"
                );
                checked += want.len();
            }
        }
    }
    // The set listings had rows to page, not only empty sets.
    assert!(checked > 10 * HISTORY as usize, "{checked} rows checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_changing_between_a_set_listings_reads_never_cut_it_short() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let tenant = new_tenant(&app, "three").await;
    let three = endpoints(&app, &admin, 3, Some(tenant)).await;
    for endpoint in &three {
        crate::support::fixtures::submit(
            &app,
            &admin,
            &endpoint.to_string(),
            serde_json::json!({}),
            None,
        )
        .await;
    }
    rows(
        &app.state.db,
        "UPDATE webhook_deliveries SET state = 'failed', next_attempt_at = NULL",
        vec![],
    )
    .await;
    let ids: Vec<Uuid> = rows(
        &app.state.db,
        "SELECT id FROM webhook_deliveries ORDER BY id DESC",
        vec![],
    )
    .await
    .iter()
    .map(|row| row.try_get::<Uuid>("", "id").expect("an id"))
    .collect();
    let (newest, others) = (ids[0], &ids[1..]);
    // The newest failure flips between failed and pending, on a connection of its own, as
    // replays and failures would: a page of one, read in two statements, must never take
    // the newest as a head and then miss it, ending the listing before the others.
    let flipper = db.connect(1).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipping = tokio::spawn({
        let stop = stop.clone();
        async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                rows(
                    &flipper,
                    "UPDATE webhook_deliveries SET state = CASE WHEN state = 'failed' \
                     THEN 'pending' ELSE 'failed' END, \
                     next_attempt_at = CASE WHEN state = 'failed' THEN now() + interval '1 day' END \
                     WHERE id = $1",
                    vec![newest.into()],
                )
                .await;
            }
        }
    });
    let key = identity(&app, tenant_key(&app, tenant).await).await;
    let failed = DeliveryFilter {
        state: Some(DeliveryState::Failed),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let mut walks = 0;
    while started.elapsed() < std::time::Duration::from_secs(4) {
        let seen = walk(&app, &key, &failed, 1).await;
        for other in others {
            assert!(
                seen.contains(other),
                "walk {walks}: {other} missing from {seen:?}"
            );
        }
        walks += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flipping.await.expect("the flipper");
    assert!(walks > 50, "{walks} walks");
}
