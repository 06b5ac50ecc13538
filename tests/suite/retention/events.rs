//! Retention takes events left without deliveries.

use serde_json::{json, Value};

use crate::on_both_backends;
use crate::support::{Backend, TestApp, TestDb};

use crate::support::endpoints::endpoint_with_types;
use crate::support::fixtures::publish;

/// Retention takes events with their deliveries: an event whose deliveries were all pruned,
/// or that reached nobody, goes once it is older than the retention; a recent one stays.
async fn events_left_without_deliveries_are_pruned(backend: Backend) {
    use courier::worker::retention::prune;
    use sea_orm::Value as SqlValue;
    use tokio_util::sync::CancellationToken;

    use crate::support::fixtures::{count, rows};

    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    endpoint_with_types(
        &app,
        &admin,
        "https://example.com/kept",
        Some(vec!["old.reached"]),
    )
    .await;
    let reached = publish(&app, &admin, "old.reached", json!({}), None).await;
    let nobody = publish(&app, &admin, "old.nobody", json!({}), None).await;
    let recent = publish(&app, &admin, "recent.nobody", json!({}), None).await;
    let id_of = |body: &Value| -> uuid::Uuid {
        body["data"]["publish"]["event"]["id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("{body}"))
    };
    let past = courier::db::now() - chrono::Duration::days(40);
    for event in [id_of(&reached), id_of(&nobody)] {
        rows(
            &app.state.db,
            "UPDATE events SET created_at = $1 WHERE id = $2",
            vec![past.into(), event.into()],
        )
        .await;
    }
    rows(
        &app.state.db,
        "UPDATE webhook_deliveries SET state = 'delivered', next_attempt_at = NULL, created_at = $1, updated_at = $1",
        vec![past.into()],
    )
    .await;

    prune(&app.state.db, 30, &CancellationToken::new())
        .await
        .expect("pruned");
    let left = |event: uuid::Uuid| {
        let db = app.state.db.clone();
        async move {
            count(
                &db,
                "SELECT COUNT(*) AS n FROM events WHERE id = $1",
                vec![SqlValue::from(event)],
            )
            .await
        }
    };
    assert_eq!(
        left(id_of(&reached)).await,
        0,
        "its deliveries were pruned, so is it"
    );
    assert_eq!(
        left(id_of(&nobody)).await,
        0,
        "it reached nobody and is old"
    );
    assert_eq!(left(id_of(&recent)).await, 1, "a recent event stays");
    assert_eq!(
        count(
            &app.state.db,
            "SELECT COUNT(*) AS n FROM submissions",
            Vec::new()
        )
        .await,
        0
    );
}

on_both_backends!(events_left_without_deliveries_are_pruned);

/// Retention's pass over events reads the expired ones, not the table: with 50,000 recent
/// events and nothing to prune, a run touches a handful of pages (a scan of the table
/// touches thousands, every run).
#[tokio::test]
async fn finding_expired_events_reads_no_history() {
    use crate::support::fixtures::rows;

    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    rows(
        &app.state.db,
        "INSERT INTO events (id, event_type, payload, payload_hash, published_by, created_at) \
         SELECT gen_random_uuid(), 'order.paid', jsonb_build_object('n', i, 'pad', repeat('x', 200)), \
                md5(i::text), gen_random_uuid(), now() - (i * interval '1 second') \
         FROM generate_series(1, 50000) AS i",
        vec![],
    )
    .await;
    rows(&app.state.db, "ANALYZE events", vec![]).await;
    let plan = courier::worker::retention::explain_prune_events(&app.state.db, 30, 500)
        .await
        .expect("a plan");
    let top = &plan[0]["Plan"];
    let touched: i64 = ["Shared Hit Blocks", "Shared Read Blocks"]
        .iter()
        .map(|key| top[*key].as_i64().unwrap_or(0))
        .sum();
    assert!(touched < 100, "{touched} buffers: {plan}");
}
