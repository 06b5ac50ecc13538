//! The worker's pipeline under load: requests in flight stay within the concurrency while
//! outcomes wait to be recorded, the in-flight gauge counts them, and recording finds
//! earlier attempts by index whatever the table's statistics.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use sea_orm::{ConnectionTrait as _, Statement, Value};
use serde_json::json;

use crate::support::fixtures::submit;
use crate::support::fixtures::{eventually, quick_worker, settle, table_stat, worker_looks};
use crate::support::{Backend, TestApp, TestDb};
use crate::{on_both_backends, on_postgres};

/// Requests being answered now, and the most seen at once.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    most: AtomicUsize,
    answered: AtomicUsize,
}

/// A receiver that holds each request for `hold`, counting how many it holds at once.
async fn holding_receiver(hold: Duration) -> (String, Arc<Gauge>) {
    let gauge = Arc::new(Gauge::default());
    let counted = gauge.clone();
    let router = Router::new().route(
        "/hook",
        post(move || {
            let gauge = counted.clone();
            async move {
                let now = gauge.now.fetch_add(1, Ordering::SeqCst) + 1;
                gauge.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                gauge.now.fetch_sub(1, Ordering::SeqCst);
                gauge.answered.fetch_add(1, Ordering::SeqCst);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (url, gauge)
}

/// A slot is freed when its request ends (the outcome is recorded later, under a permit of
/// its own), yet no more requests than the concurrency are ever in flight, and every
/// delivery is recorded once.
async fn requests_in_flight_never_exceed_the_concurrency(backend: Backend) {
    const CONCURRENCY: u32 = 3;
    const SUBMISSIONS: usize = 15;
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.worker_concurrency = CONCURRENCY;
    })
    .await;
    let admin = app.admin_token().await;
    let (url, gauge) = holding_receiver(Duration::from_millis(100)).await;
    let (endpoint, _) = app.create_endpoint(&admin, &url).await;
    for n in 0..SUBMISSIONS {
        let submitted = submit(&app, &admin, &endpoint, json!({ "n": n }), None).await;
        assert_eq!(submitted["data"]["submit"]["created"], true, "{submitted}");
    }
    let counter = app.state.db.clone();
    settle([app]).await;
    let delivered = counter
        .conn()
        .query_one_raw(Statement::from_string(
            counter.backend(),
            "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'delivered'",
        ))
        .await
        .expect("count")
        .expect("a row")
        .try_get::<i64>("", "n")
        .expect("n");
    assert_eq!(delivered, SUBMISSIONS as i64, "every delivery was recorded");
    assert_eq!(
        gauge.answered.load(Ordering::SeqCst),
        SUBMISSIONS,
        "each sent once"
    );
    let most = gauge.most.load(Ordering::SeqCst);
    assert!(
        most <= CONCURRENCY as usize,
        "{most} requests in flight at once, over the concurrency of {CONCURRENCY}"
    );
    assert!(
        most >= 2,
        "requests ran side by side (at most {most} at once)"
    );
}

on_both_backends!(
    requests_in_flight_never_exceed_the_concurrency,
    the_in_flight_gauge_counts_requests_under_way
);

/// `courier_deliveries_in_flight` is the number of requests under way: none while the
/// worker waits for work (its free slots held by the claiming loop), then each request
/// from its start to its end.
async fn the_in_flight_gauge_counts_requests_under_way(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.request_timeout_ms = 10_000;
    })
    .await;
    let admin = app.admin_token().await;
    // Held long enough for all three to be under way at once on a loaded machine.
    let (url, receiver) = holding_receiver(Duration::from_secs(3)).await;
    let (endpoint, _) = app.create_endpoint(&admin, &url).await;
    worker_looks(&app, 2).await;
    let gauge = || app.state.metrics.in_flight.get();
    assert_eq!(gauge(), 0, "nothing is in flight while the worker waits");

    for n in 0..3 {
        let submitted = submit(&app, &admin, &endpoint, json!({ "n": n }), None).await;
        assert_eq!(submitted["data"]["submit"]["created"], true, "{submitted}");
    }
    eventually(
        "three requests are held",
        Duration::from_secs(5),
        || async { receiver.now.load(Ordering::SeqCst) == 3 },
    )
    .await;
    assert_eq!(gauge(), 3, "the three requests held at the receiver");
    eventually("the gauge falls back", Duration::from_secs(10), || async {
        receiver.answered.load(Ordering::SeqCst) == 3 && gauge() == 0
    })
    .await;
    app.stop().await;
}

/// Recording's lookup of a batch's earlier attempts stays an index lookup per delivery
/// whatever the statistics: on a connection that first ran it right after the empty table
/// was analyzed (as autovacuum does on a new database, and then, if it is off, never again),
/// it still reads 20,000 attempts by index, not by a sequential scan per delivery.
async fn recording_finds_earlier_attempts_by_index_whatever_the_statistics(backend: Backend) {
    let db = TestDb::new(backend).await;
    // One connection: the lookup is prepared, and its plan kept, on it.
    let conn_db = db.connect(1).await;
    let conn = conn_db.conn();
    let lookup = |ids: Vec<uuid::Uuid>| {
        Statement::from_sql_and_values(
            conn_db.backend(),
            courier::worker::record::RECORDED_ATTEMPTS_POSTGRES,
            [Value::from(ids)],
        )
    };
    conn.execute_unprepared("VACUUM ANALYZE delivery_attempts")
        .await
        .expect("analyze the empty table");
    conn.query_all_raw(lookup(vec![uuid::Uuid::nil()]))
        .await
        .expect("the lookup, while the table is empty");
    for sql in [
        "INSERT INTO endpoints (id, name, url, signing_secret, created_at, updated_at) \
         VALUES ('00000000-0000-0000-0000-000000000001', 'plan', 'https://example.com/hook', 's', now(), now())",
        "INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at) \
         SELECT gen_random_uuid(), '00000000-0000-0000-0000-000000000001', '{}', 'h', now() \
         FROM generate_series(1, 20000)",
        "INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts, created_at, updated_at) \
         SELECT gen_random_uuid(), id, endpoint_id, 'delivered', 1, now(), now() FROM submissions",
        "INSERT INTO delivery_attempts (id, delivery_id, number, claim_token, started_at, finished_at, superseded) \
         SELECT gen_random_uuid(), id, 1, gen_random_uuid(), now(), now(), false FROM webhook_deliveries",
    ] {
        conn.execute_unprepared(sql).await.expect("seed");
    }
    let ids: Vec<uuid::Uuid> = conn
        .query_all_raw(Statement::from_string(
            conn_db.backend(),
            "SELECT id FROM webhook_deliveries LIMIT 120",
        ))
        .await
        .expect("ids")
        .iter()
        .map(|row| row.try_get("", "id").expect("id"))
        .collect();
    let scans = || table_stat(&conn_db, "delivery_attempts", "COALESCE(seq_scan, 0)");
    let before = scans().await;
    let found = conn.query_all_raw(lookup(ids)).await.expect("the lookup");
    assert_eq!(found.len(), 120, "one attempt of each delivery");
    let scans = scans().await - before;
    assert_eq!(
        scans, 0,
        "earlier attempts were read by {scans} sequential scans of the table"
    );
}

on_postgres!(recording_finds_earlier_attempts_by_index_whatever_the_statistics);
