//! A month of delivery history written in the shape Courier writes it, for the listing
//! plan tests, and the work one page of a listing does on it.

use courier::auth::Identity;
use courier::service::deliveries::DeliveryFilter;
use courier::service::pagination::PageRequest;
use uuid::Uuid;

use super::fixtures::{rows, V7};
use super::TestApp;

/// Deliveries of history.
pub const HISTORY: i64 = 300_000;
/// Endpoints they are spread over.
pub const ENDPOINTS: usize = 20;
/// Most buffers (8 KiB pages) one page of a listing may touch: a scan of this history
/// touches thousands.
pub const MOST_BUFFERS: i64 = 600;

/// Most buffers a page of `first` over a set of endpoints may touch beyond
/// [`MOST_BUFFERS`], reading from `busy` endpoints that each hold a page or more of what
/// it lists: a page's worth of each one's rows (`first` and one more), read from an index,
/// each checked against the table until the table is vacuumed.
pub fn over_a_set(busy: usize, first: usize) -> i64 {
    (busy * (first + 1)) as i64
}

/// Whether `case` lists a set of endpoints: its caller's (a partner's or a tenant's
/// key) or a tenant's, not one endpoint.
pub fn lists_a_set(case: &PlanCase<'_>) -> bool {
    let (_, who, filter, _) = case;
    filter.endpoint_id.is_none()
        && (filter.tenant_id.is_some() || who.role != courier::auth::Role::Admin)
}

/// History over 30 days, newest last: submissions (a third each `order.paid`,
/// `order.shipped` and none) and their deliveries, nearly all delivered, one in 300
/// failed and the hundred newest pending; every delivery to `down` (a receiver down for
/// the month) failed, and `without_paid` never got an `order.paid` (its third are
/// `order.shipped` instead).
pub async fn seed_history(app: &TestApp, down: Uuid, without_paid: Uuid) {
    let db = &app.state.db;
    for table in ["webhook_deliveries", "submissions", "delivery_attempts"] {
        rows(
            db,
            &format!("ALTER TABLE {table} SET (autovacuum_enabled = false)"),
            vec![],
        )
        .await;
    }
    let id = |at: &str| V7.replace("{at}", at);
    let sql = format!(
        "WITH e AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM endpoints),
         h AS (SELECT i, now() - interval '30 days' + (i * interval '30 days' / {HISTORY}) AS at
               FROM generate_series(1, {HISTORY}) AS i),
         s AS (
           INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at, event_type)
           SELECT {sid}, e.id, jsonb_build_object('n', h.i), md5(h.i::text), h.at,
                  CASE WHEN h.i % 3 = 0 AND e.id = '{without_paid}' THEN 'order.shipped'
                       ELSE (ARRAY['order.paid', 'order.shipped', NULL])[1 + h.i % 3] END
           FROM h JOIN e ON e.n = h.i % {ENDPOINTS}
           RETURNING id, endpoint_id, created_at, event_type)
         INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts,
                                         next_attempt_at, created_at, updated_at, event_type)
         SELECT {did}, s.id, s.endpoint_id,
                CASE WHEN s.created_at > now() - interval '100 seconds' THEN 'pending'
                     WHEN s.endpoint_id = '{down}' OR random() < 1.0 / 300 THEN 'failed'
                     ELSE 'delivered' END,
                1, NULL, s.created_at, s.created_at + interval '1 second', s.event_type
         FROM s",
        sid = id("h.at"),
        did = id("s.created_at"),
    );
    rows(db, &sql, vec![]).await;
    rows(
        db,
        "UPDATE webhook_deliveries SET next_attempt_at = updated_at WHERE state = 'pending'",
        vec![],
    )
    .await;
}

/// The id `sql` (one row, one `id` column) finds: where a deep page's cursor stands.
pub async fn cursor_at(app: &TestApp, sql: &str) -> Uuid {
    rows(&app.state.db, sql, vec![]).await[0]
        .try_get::<Uuid>("", "id")
        .expect("id")
}

/// The token of a new partner key of `tenant`.
pub async fn tenant_key(app: &TestApp, tenant: Uuid) -> String {
    let limits = courier::auth::KeyLimits {
        tenant: Some(tenant),
        ..Default::default()
    };
    courier::auth::create_api_key(
        &app.state.db,
        "tenant",
        courier::auth::Role::Partner,
        limits,
    )
    .await
    .expect("a tenant key")
    .token
}

/// Buffers touched by one page of the listing, run as `deliveries` runs it: by every
/// statement it runs, in planning and in execution.
pub async fn buffers(
    app: &TestApp,
    who: &Identity,
    filter: &DeliveryFilter,
    page: &PageRequest,
) -> (i64, String) {
    let plans = app
        .state
        .deliveries
        .explain_listing(who, filter.clone(), page)
        .await
        .expect("explain");
    // Every statement the page ran, planning included (one plan per statement).
    let touched = plans
        .iter()
        .flat_map(|plan| [&plan[0]["Plan"], &plan[0]["Planning"]])
        .flat_map(|node| ["Shared Hit Blocks", "Shared Read Blocks"].map(|key| &node[key]))
        .map(|count| count.as_i64().unwrap_or(0))
        .sum();
    (touched, serde_json::Value::from(plans).to_string())
}

/// One listing to measure: its name, who asks, the filter, and the cursor it pages from.
pub type PlanCase<'a> = (&'a str, &'a Identity, DeliveryFilter, Option<Uuid>);

/// Runs every case at two page sizes on the tables as a new deployment's first hour leaves
/// them (never vacuumed), vacuumed but never analyzed, then analyzed, and fails naming
/// every page that touched more buffers than `most` allows it (given the case and the page
/// size), with its plans.
pub async fn assert_pages_read_little(
    app: &TestApp,
    cases: &[PlanCase<'_>],
    most: impl Fn(&PlanCase<'_>, usize) -> i64,
) {
    let mut failures = Vec::new();
    // Tables as a new deployment's first hour leaves them (never vacuumed: the planner
    // cannot count a partial index's rows), vacuumed but never analyzed, and analyzed.
    for statistics in ["never vacuumed", "never analyzed", "analyzed"] {
        match statistics {
            "never analyzed" => rows(&app.state.db, "VACUUM webhook_deliveries", vec![]).await,
            "analyzed" => rows(&app.state.db, "ANALYZE", vec![]).await,
            _ => Vec::new(),
        };
        // A dashboard's page, and the largest a page may be (a planner with no statistics
        // weighs a larger limit differently).
        for first in [50, courier::service::pagination::MAX_PAGE_SIZE] {
            for case in cases {
                let (name, who, filter, after) = case;
                let page = PageRequest {
                    first,
                    after: *after,
                    after_at: None,
                };
                let (touched, plan) = buffers(app, who, filter, &page).await;
                if touched > most(case, first) {
                    failures.push(format!(
                        "{name}, first {first} ({statistics}): {touched} buffers\n{plan}"
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "listings that read history:\n{}",
        failures.join("\n\n")
    );
}
