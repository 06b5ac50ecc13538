//! What an operator asks, as history grows: the same queries through GraphQL (median of 11)
//! against a small history and a large one, seeded by the bench in the shape Courier writes
//! (a submission with its event type, its delivery in its final state, one attempt with a
//! response, the settled counts), over 50 endpoints and 30 days, then analyzed as
//! autovacuum would. Also the bytes each delivered webhook costs the database.

use std::time::{Duration, Instant};

use courier::db::Db;
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::{json, Value};

use crate::drain::{drain_in, fill};
use crate::process::{admin_token, Scratch, Server};
use crate::receiver;
use crate::workloads::{graphql, latency_in, submit_throughput_in, Latency};

/// Endpoints the history is spread over.
const ENDPOINTS: usize = 50;

/// A time-ordered id for `{at}` (a UUIDv7 as Courier mints them), in SQL; the seeding of
/// every history the benches build uses it.
pub const V7: &str = "(lpad(to_hex((extract(epoch FROM {at}) * 1000)::bigint), 12, '0') \
     || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid";

/// Timed runs of each query (after two that warm up); the median is reported.
const TIMED_RUNS: usize = 11;

/// The queries, by name.
const QUERIES: &[(&str, &str)] = &[
    ("console first screen", "query($first: Int) { endpoints(first: 100) { edges { node { id name url disabled deliveryCounts { pending processing delivered failed total } } } } deliveries(first: $first) { edges { node { id state createdAt endpoint { id } } } } }"),
    ("one endpoint's FAILED", "query($endpoint: ID!, $first: Int) { deliveries(filter: {endpointId: $endpoint, state: FAILED}, first: $first) { edges { node { id } } } }"),
    ("PENDING anywhere", "query($first: Int) { deliveries(filter: {state: PENDING}, first: $first) { edges { node { id } } } }"),
    ("FAILED anywhere", "query($first: Int) { deliveries(filter: {state: FAILED}, first: $first) { edges { node { id } } } }"),
    ("an event type nobody has", "query($first: Int) { deliveries(filter: {eventType: \"nobody.has\"}, first: $first) { edges { node { id } } } }"),
    ("an event type", "query($first: Int) { deliveries(filter: {eventType: \"order.paid\"}, first: $first) { edges { node { id } } } }"),
    ("one endpoint, one day", "query($endpoint: ID!, $first: Int, $after: DateTime, $before: DateTime) { deliveries(filter: {endpointId: $endpoint, createdAfter: $after, createdBefore: $before}, first: $first) { edges { node { id } } } }"),
    ("one day", "query($first: Int, $after: DateTime, $before: DateTime) { deliveries(filter: {createdAfter: $after, createdBefore: $before}, first: $first) { edges { node { id } } } }"),
];

pub struct History {
    pub deliveries: i64,
    pub seed_seconds: f64,
    /// Median milliseconds per query, in [`QUERIES`] order.
    pub medians_ms: Vec<(String, f64)>,
    /// Deliveries, submissions and attempts with their indexes and TOAST, per delivery.
    pub bytes_per_delivery: f64,
    /// The load on top of this history: `submit` per second, the drain of a backlog of
    /// [`LOAD_BACKLOG`] to one new endpoint, and submit-to-arrival latency.
    pub submit_per_second: f64,
    pub drain_per_second: f64,
    pub latency: Latency,
}

/// The backlog drained on top of each history.
pub const LOAD_BACKLOG: usize = 50_000;

/// Seeds `deliveries` of history, times every query, then measures submit, a drain and
/// latency on top of it (submit for `seconds`).
pub async fn measure(
    server_url: &str,
    deliveries: i64,
    connections: usize,
    seconds: u64,
    samples: usize,
) -> History {
    let scratch = Scratch::create(server_url, "history").await;
    let token = admin_token(&scratch.url);
    let (receiver_url, _arrivals) = receiver::start().await;
    fill(
        &scratch.url,
        &token,
        &receiver_url,
        ENDPOINTS,
        connections,
        ENDPOINTS,
    )
    .await;
    let db = Db::connect(&scratch.url, 1).await.expect("connect");
    let started = Instant::now();
    seed(&db, deliveries).await;
    let seed_seconds = started.elapsed().as_secs_f64();
    let bytes: i64 = scalar(
        &db,
        "SELECT (pg_total_relation_size('webhook_deliveries') + pg_total_relation_size('submissions') \
         + pg_total_relation_size('delivery_attempts'))::bigint AS n",
    )
    .await;
    let total = scalar(&db, "SELECT COUNT(*) AS n FROM webhook_deliveries").await;
    let endpoint: String = db
        .conn()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT id::text AS v FROM endpoints ORDER BY id LIMIT 1",
        ))
        .await
        .expect("endpoint")
        .expect("row")
        .try_get("", "v")
        .expect("v");

    let server = Server::start(&scratch.url, &[("COURIER_WORKER_CONCURRENCY", "0".into())]);
    let client = reqwest::Client::new();
    let now = chrono::Utc::now();
    let variables = json!({
        "first": 50,
        "endpoint": endpoint,
        "after": now - chrono::Duration::days(11),
        "before": now - chrono::Duration::days(10),
    });
    let mut medians_ms = Vec::new();
    for (name, query) in QUERIES {
        let mut times = Vec::new();
        // Two runs warm the process's caches, then the median of the next eleven.
        for run in 0..2 + TIMED_RUNS {
            let started = Instant::now();
            let answer: Value = graphql(&client, &server, &token, query, variables.clone()).await;
            if run >= 2 {
                times.push(started.elapsed());
            }
            assert!(answer.get("errors").is_none(), "{name}: {answer}");
        }
        times.sort();
        medians_ms.push((
            name.to_string(),
            times[TIMED_RUNS / 2].as_secs_f64() * 1000.0,
        ));
    }
    server.stop();
    db.close().await.expect("close");
    let submit = submit_throughput_in(
        &scratch.url,
        &token,
        connections,
        Duration::from_secs(seconds),
        &[],
    )
    .await;
    let drain = drain_in(&scratch.url, &token, LOAD_BACKLOG, connections, 1).await;
    let latency = latency_in(&scratch.url, &token, samples, &[]).await;
    scratch.drop_now().await;
    History {
        deliveries: total,
        seed_seconds,
        medians_ms,
        bytes_per_delivery: bytes as f64 / total.max(1) as f64,
        submit_per_second: submit.per_second,
        drain_per_second: drain.per_second,
        latency,
    }
}

/// History over 30 days: nearly all delivered, one in 300 failed, the hundred newest
/// pending; a third each of two event types and none.
async fn seed(db: &Db, deliveries: i64) {
    let id = |at: &str| V7.replace("{at}", at);
    // In slices, so no single statement holds everything in memory.
    let slice = 500_000i64;
    let mut from = 0;
    while from < deliveries {
        let to = (from + slice).min(deliveries);
        let sql = format!(
            "WITH e AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM endpoints),
             h AS (SELECT i, now() - interval '30 days' + (i * interval '30 days' / {deliveries}) AS at
                   FROM generate_series({start}, {to}) AS i),
             s AS (
               INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at, event_type)
               SELECT {sid}, e.id, jsonb_build_object('n', h.i, 'event', 'order.paid', 'amount', '12.50'),
                      md5(h.i::text), h.at, (ARRAY['order.paid', 'order.shipped', NULL])[1 + h.i % 3]
               FROM h JOIN e ON e.n = h.i % {ENDPOINTS}
               RETURNING id, endpoint_id, created_at, event_type),
             d AS (
               INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts,
                                               next_attempt_at, created_at, updated_at, event_type)
               SELECT {did}, s.id, s.endpoint_id,
                      CASE WHEN s.created_at > now() - interval '100 seconds' THEN 'pending'
                           WHEN random() < 1.0 / 300 THEN 'failed' ELSE 'delivered' END,
                      1, NULL, s.created_at, s.created_at + interval '5 milliseconds', s.event_type
               FROM s RETURNING id, updated_at, state)
             INSERT INTO delivery_attempts (id, delivery_id, number, claim_token, started_at,
                                            finished_at, status_code, duration_ms, superseded,
                                            response_body, response_headers)
             SELECT {aid}, d.id, 1, gen_random_uuid(), d.updated_at, d.updated_at,
                    CASE WHEN d.state = 'failed' THEN 503 ELSE 204 END, 2, false, '',
                    '{{\"date\":\"Tue, 01 Dec 2026 12:00:00 GMT\"}}'
             FROM d WHERE d.state <> 'pending'",
            start = from + 1,
            sid = id("h.at"),
            did = id("s.created_at"),
            aid = id("d.updated_at"),
        );
        db.conn().execute_unprepared(&sql).await.expect("seed");
        from = to;
    }
    for sql in [
        "UPDATE webhook_deliveries SET next_attempt_at = updated_at WHERE state = 'pending'",
        "INSERT INTO endpoint_settled_counts (endpoint_id, shard, delivered, failed) \
         SELECT endpoint_id, 0, SUM(CASE WHEN state = 'delivered' THEN 1 ELSE 0 END), \
                SUM(CASE WHEN state = 'failed' THEN 1 ELSE 0 END) \
         FROM webhook_deliveries WHERE state IN ('delivered', 'failed') GROUP BY endpoint_id \
         ON CONFLICT (endpoint_id, shard) DO UPDATE SET \
           delivered = endpoint_settled_counts.delivered + excluded.delivered, \
           failed = endpoint_settled_counts.failed + excluded.failed",
        "VACUUM ANALYZE",
    ] {
        db.conn()
            .execute_unprepared(sql)
            .await
            .expect("finish the history");
    }
}

async fn scalar(db: &Db, sql: &str) -> i64 {
    db.conn()
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .expect("query")
        .expect("row")
        .try_get("", "n")
        .expect("n")
}
