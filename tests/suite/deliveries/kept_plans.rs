//! A listing is planned for the values it is given, not from a plan kept on its connection
//! for any value (PostgreSQL): filtered by an event type nobody has, a page reads a few
//! index entries, not the whole history newest first.

use courier::auth::{self, Identity};
use courier::config::ServeArgs;
use courier::service::deliveries::DeliveryFilter;
use courier::service::pagination::PageRequest;

use crate::support::fixtures::{rows, table_stat, V7};
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
