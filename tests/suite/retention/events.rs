//! Retention takes events left without deliveries.

use serde_json::{json, Value};

use crate::on_both_backends;
use crate::support::{Backend, TestApp, TestDb};

use crate::support::endpoints::endpoint_with_types;
use crate::support::fixtures::publish;

/// Retention takes events with their deliveries: an event whose deliveries were all pruned,
/// or that reached nobody, goes once it is older than the retention; a recent one stays.
async fn events_left_without_deliveries_are_pruned(backend: Backend) {
    use sea_orm::Value as SqlValue;

    use crate::support::fixtures::{count, prune_expired, rows};

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

    prune_expired(&app.state.db).await;
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

/// The buffers a plan touched, from its top node.
fn buffers_touched(plan: &Value) -> i64 {
    let top = &plan[0]["Plan"];
    ["Shared Hit Blocks", "Shared Read Blocks"]
        .iter()
        .map(|key| top[*key].as_i64().unwrap_or(0))
        .sum()
}

/// Retention's sweep over events reads the expired ones, not the table: with 50,000 recent
/// events and nothing to prune, a step touches a handful of pages (a scan of the table
/// touches thousands, every run).
#[tokio::test]
async fn finding_expired_events_reads_no_history() {
    use courier::worker::retention::{EventSweep, SWEEP_STEP};

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
    let plan = EventSweep::default()
        .explain_step(&app.state.db, 30, SWEEP_STEP)
        .await
        .expect("a plan");
    let touched = buffers_touched(&plan);
    assert!(touched < 100, "{touched} buffers: {plan}");
}

/// Expired events that deliveries still hold (an endpoint's backlog parked for longer than
/// the retention) are read once, not on every run: after a run has swept past 20,000 of
/// them, the next step touches a handful of pages, where a sweep from the start touches
/// thousands. They stay until their deliveries go.
#[tokio::test]
async fn expired_events_still_held_are_read_once() {
    use courier::worker::retention::{prune, EventSweep, SWEEP_STEP};
    use tokio_util::sync::CancellationToken;

    use crate::support::fixtures::{count, rows};

    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/parked")
        .await;
    let endpoint: uuid::Uuid = endpoint.parse().expect("an endpoint id");
    rows(
        &app.state.db,
        "WITH e AS ( \
             INSERT INTO events (id, event_type, payload, payload_hash, published_by, created_at) \
             SELECT gen_random_uuid(), 'order.paid', jsonb_build_object('n', i), md5(i::text), \
                    gen_random_uuid(), now() - interval '40 days' + i * interval '1 millisecond' \
             FROM generate_series(1, 20000) AS i \
             RETURNING id, created_at) \
         INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at, event_id, event_type) \
         SELECT gen_random_uuid(), $1, 'null'::jsonb, 'h', e.created_at, e.id, 'order.paid' FROM e",
        vec![endpoint.into()],
    )
    .await;
    rows(&app.state.db, "ANALYZE events", vec![]).await;
    rows(&app.state.db, "ANALYZE submissions", vec![]).await;

    let from_the_start = buffers_touched(
        &EventSweep::default()
            .explain_step(&app.state.db, 30, SWEEP_STEP)
            .await
            .expect("a plan"),
    );
    assert!(
        from_the_start > 500,
        "a sweep from the start reads the held events: {from_the_start} buffers"
    );

    let sweep = EventSweep::default();
    prune(&app.state.db, 30, &sweep, &CancellationToken::new())
        .await
        .expect("pruned");
    let plan = sweep
        .explain_step(&app.state.db, 30, SWEEP_STEP)
        .await
        .expect("a plan");
    let touched = buffers_touched(&plan);
    assert!(touched < 100, "{touched} buffers: {plan}");
    assert_eq!(
        count(&app.state.db, "SELECT COUNT(*) AS n FROM events", vec![]).await,
        20_000,
        "events deliveries hold stay"
    );
}

/// Two processes pruning the last two deliveries of one event at once, each its own: the
/// event goes with whichever commits second, never with neither. Both batches reach the
/// event while a third session holds it, so each deletes its submission before either
/// commits.
#[tokio::test]
async fn an_event_goes_when_two_processes_prune_its_last_deliveries_at_once() {
    use courier::worker::retention::prune_batch;
    use sea_orm::{ConnectionTrait as _, Statement, TransactionTrait as _};

    use crate::support::fixtures::{count, eventually, lock_waiters, rows};

    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    for path in ["a", "b"] {
        endpoint_with_types(
            &app,
            &admin,
            &format!("https://example.com/{path}"),
            Some(vec!["order.paid"]),
        )
        .await;
    }
    let published = publish(&app, &admin, "order.paid", json!({}), None).await;
    let event = published["data"]["publish"]["event"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{published}"))
        .to_owned();
    let past = courier::db::now() - chrono::Duration::days(40);
    rows(
        &app.state.db,
        "UPDATE webhook_deliveries SET state = 'delivered', next_attempt_at = NULL, created_at = $1, updated_at = $1",
        vec![past.into()],
    )
    .await;
    rows(
        &app.state.db,
        "UPDATE events SET created_at = $1",
        vec![past.into()],
    )
    .await;

    let holder = db.connect(2).await;
    let hold = holder.conn().begin().await.expect("begin");
    hold.execute_raw(Statement::from_sql_and_values(
        sea_orm::DbBackend::Postgres,
        "SELECT id FROM events WHERE id = $1::uuid FOR UPDATE",
        [event.clone().into()],
    ))
    .await
    .expect("hold the event");
    let batches: Vec<_> = (0..2)
        .map(|_| {
            let url = db.url.clone();
            tokio::spawn(async move {
                let pool = courier::db::Db::connect(&url, 2).await.expect("a pool");
                prune_batch(&pool, 30, 1).await
            })
        })
        .collect();
    eventually(
        "both batches wait on the event, or are done",
        std::time::Duration::from_secs(10),
        || {
            let holder = holder.clone();
            let done = batches.iter().all(|batch| batch.is_finished());
            async move { done || lock_waiters(&holder).await == 2 }
        },
    )
    .await;
    hold.rollback().await.expect("released");
    for batch in batches {
        assert_eq!(batch.await.expect("joined").expect("pruned"), 1);
    }
    assert_eq!(
        count(
            &app.state.db,
            "SELECT COUNT(*) AS n FROM submissions",
            vec![]
        )
        .await,
        0
    );
    assert_eq!(
        count(&app.state.db, "SELECT COUNT(*) AS n FROM events", vec![]).await,
        0,
        "the event went with its last submission"
    );
}
