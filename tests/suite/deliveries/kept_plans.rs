//! What a listing leaves on its connection (PostgreSQL): it is planned for the values it is
//! given, not from a plan kept for any value (filtered by an event type nobody has, a page
//! reads a few index entries, not the whole history newest first); and a listing over a set
//! of endpoints, whose statements' texts vary with the set, keeps none of them prepared.

use courier::auth::{self, Identity};
use courier::config::ServeArgs;
use courier::service::deliveries::DeliveryFilter;
use courier::service::pagination::PageRequest;

use crate::support::fixtures::{rows, table_stat, V7};
use crate::support::history::tenant_key;
use crate::support::sets::{endpoints, identity, new_tenant, quoted};
use crate::support::{Backend, TestApp, TestDb};

/// Deliveries of history, a third each `order.paid`, `order.shipped` and no event type.
const HISTORY: i64 = 30_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_by_an_event_type_nobody_has_reads_no_history() {
    let db = TestDb::new(Backend::Postgres).await;
    // One connection, so the listing's statements are prepared, and any plan kept, on it.
    let app = TestApp::spawn_on(db.connect(1).await, |config: &mut ServeArgs| {
        config.worker_concurrency = 0;
    })
    .await;
    let admin = app.admin_token().await;
    app.create_endpoint(&admin, "https://example.com/hook")
        .await;
    let id = |at: &str| V7.replace("{at}", at);
    let sql = format!(
        "WITH h AS (SELECT i, now() - interval '30 days' + (i * interval '30 days' / {HISTORY}) AS at
                    FROM generate_series(1, {HISTORY}) AS i),
         s AS (
           INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at, event_type)
           SELECT {sid}, (SELECT id FROM endpoints), '{{}}', md5(h.i::text), h.at,
                  (ARRAY['order.paid', 'order.shipped', NULL])[1 + h.i % 3]
           FROM h
           RETURNING id, endpoint_id, created_at, event_type)
         INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts,
                                         created_at, updated_at, event_type)
         SELECT {did}, s.id, s.endpoint_id, 'delivered', 1, s.created_at, s.created_at,
                s.event_type
         FROM s",
        sid = id("h.at"),
        did = id("s.created_at"),
    );
    rows(&app.state.db, &sql, vec![]).await;
    rows(&app.state.db, "VACUUM ANALYZE", vec![]).await;
    let caller: Identity = auth::authenticate(&app.state.db, Some(&format!("Bearer {admin}")))
        .await
        .expect("caller");
    let list = |event_type: &str| {
        let filter = DeliveryFilter {
            event_type: Some(event_type.to_owned()),
            ..Default::default()
        };
        let (deliveries, caller) = (&app.state.deliveries, &caller);
        async move {
            deliveries
                .list(
                    caller,
                    filter,
                    PageRequest {
                        first: 50,
                        after: None,
                        after_at: None,
                    },
                )
                .await
                .expect("a page")
        }
    };
    // A type most deliveries have, then one nobody has: each planned afresh.
    assert_eq!(list("order.paid").await.items.len(), 50, "a full page");
    // Rows of the table read, by index or by scan (ids follow creation, as Courier's do,
    // which is what makes the newest-first walk look cheap).
    let reads = "COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0)";
    let before = table_stat(&app.state.db, "webhook_deliveries", reads).await;
    assert!(list("nobody.has").await.items.is_empty(), "nobody has it");
    let read = table_stat(&app.state.db, "webhook_deliveries", reads).await - before;
    assert!(
        read < 100,
        "a page of an event type nobody has read {read} of {HISTORY} deliveries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_listing_keeps_no_statement_prepared() {
    let db = TestDb::new(Backend::Postgres).await;
    // One connection, so every statement of the listings runs, and would be kept, on it.
    let app = TestApp::spawn_on(db.connect(1).await, |config: &mut ServeArgs| {
        config.worker_concurrency = 0;
    })
    .await;
    let admin = app.admin_token().await;
    let tenant = new_tenant(&app, "many").await;
    let set = endpoints(&app, &admin, 40, Some(tenant)).await;
    // One delivery each, a minute apart.
    let id = |at: &str| V7.replace("{at}", at);
    let sql = format!(
        "WITH e AS (SELECT id, ordinality AS n FROM unnest(ARRAY[{ids}]::uuid[]) WITH ORDINALITY AS e(id)),
         s AS (
           INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at)
           SELECT {sid}, e.id, '{{}}', md5(e.n::text), now() - e.n * interval '1 minute'
           FROM e
           RETURNING id, endpoint_id, created_at)
         INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts,
                                         created_at, updated_at)
         SELECT {did}, s.id, s.endpoint_id, 'delivered', 1, s.created_at, s.created_at FROM s",
        ids = quoted(&set),
        sid = id("now() - e.n * interval '1 minute'"),
        did = id("s.created_at"),
    );
    rows(&app.state.db, &sql, vec![]).await;
    let caller = identity(&app, tenant_key(&app, tenant).await).await;
    let kept = || async {
        let kept = rows(
            &app.state.db,
            "SELECT statement FROM pg_prepared_statements WHERE from_sql IS FALSE",
            vec![],
        )
        .await;
        kept.iter()
            .map(|row| row.try_get::<String>("", "statement").expect("a statement"))
            .collect::<Vec<_>>()
    };
    let before = kept().await.len();
    // Pages of 1 to 40: the page's second statement reads from 2 to 40 endpoints, a
    // different text each time.
    for first in 1..=40 {
        let page = app
            .state
            .deliveries
            .list(
                &caller,
                DeliveryFilter::default(),
                PageRequest {
                    first,
                    after: None,
                    after_at: None,
                },
            )
            .await
            .expect("a page");
        assert_eq!(page.items.len(), first, "a full page of {first}");
    }
    let kept = kept().await;
    let of_sets: Vec<_> = kept
        .iter()
        .filter(|statement| statement.contains("head_id"))
        .collect();
    assert!(of_sets.is_empty(), "set listings kept {of_sets:#?}");
    // Without them, up to 40 of those texts would be kept (the driver keeps 100).
    assert!(
        kept.len() < before + 10,
        "statements kept by the listings: {kept:#?}"
    );
}
