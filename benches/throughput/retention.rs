//! Retention against a deep history: expired deliveries seeded in bulk, in the shape
//! Courier writes them (a submission, its delivered delivery, one attempt, the delivered
//! count), beside a backlog built through the API; then one default `courier serve` prunes
//! the history while it drains the backlog, timed from its start until the last expired
//! delivery is gone. The same drain without expired history, in the same run, shows what
//! pruning costs claiming and recording.

use std::time::{Duration, Instant};

use courier::db::Db;
use sea_orm::{ConnectionTrait, DbBackend, Statement};

use crate::drain::fill;
use crate::history::V7;
use crate::process::{admin_token, Scratch, Server};
use crate::receiver;

pub struct Pruning {
    pub expired: i64,
    pub elapsed: Duration,
    pub per_second: f64,
    /// The backlog drained meanwhile, and its drain rate with and without the pruning.
    pub backlog: usize,
    pub drain_during: f64,
    pub drain_without: f64,
}

/// `expired` deliveries settled 31 to 60 days ago, spread over one endpoint's history,
/// pruned while a `backlog` to the same endpoint drains; then the same drain alone.
pub async fn prune_rate(
    server_url: &str,
    expired: i64,
    backlog: usize,
    connections: usize,
) -> Pruning {
    let (elapsed, drain_during) = prune_and_drain(server_url, expired, backlog, connections).await;
    let (_, drain_without) = prune_and_drain(server_url, 0, backlog, connections).await;
    Pruning {
        expired,
        elapsed,
        per_second: expired as f64 / elapsed.as_secs_f64(),
        backlog,
        drain_during,
        drain_without,
    }
}

/// Seeds `expired` deliveries of history and a `backlog` through the API, starts one
/// default `courier serve`: the time until nothing expired is left, and the backlog's
/// drain rate from the start.
async fn prune_and_drain(
    server_url: &str,
    expired: i64,
    backlog: usize,
    connections: usize,
) -> (Duration, f64) {
    let scratch = Scratch::create(server_url, "retention").await;
    let token = admin_token(&scratch.url);
    let (receiver_url, arrivals) = receiver::start().await;
    // One endpoint and its backlog, created through the API.
    fill(&scratch.url, &token, &receiver_url, backlog, connections, 1).await;
    let db = Db::connect(&scratch.url, 1).await.expect("connect");
    let id = |at: &str| V7.replace("{at}", at);
    let seed = format!(
        "WITH h AS (SELECT i, now() - interval '60 days' + (i * interval '29 days' / {expired}) AS at
                    FROM generate_series(1, {expired}) AS i),
         s AS (
           INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at)
           SELECT {sid}, (SELECT id FROM endpoints), jsonb_build_object('n', h.i, 'event', 'order.paid', 'amount', '12.50'),
                  md5(h.i::text), h.at
           FROM h RETURNING id, endpoint_id, created_at),
         d AS (
           INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts,
                                           next_attempt_at, created_at, updated_at)
           SELECT {did}, s.id, s.endpoint_id, 'delivered', 1, NULL, s.created_at,
                  s.created_at + interval '5 milliseconds'
           FROM s RETURNING id, updated_at)
         INSERT INTO delivery_attempts (id, delivery_id, number, claim_token, started_at, finished_at,
                                        status_code, duration_ms, superseded, response_body, response_headers)
         SELECT {aid}, d.id, 1, gen_random_uuid(), d.updated_at, d.updated_at, 204, 2, false, '',
                '{{\"date\":\"Tue, 01 Dec 2026 12:00:00 GMT\"}}'
         FROM d",
        sid = id("h.at"),
        did = id("s.created_at"),
        aid = id("d.updated_at"),
    );
    db.conn()
        .execute_unprepared(&seed)
        .await
        .expect("seed history");
    db.conn()
        .execute_unprepared(&format!(
            "INSERT INTO endpoint_settled_counts (endpoint_id, shard, delivered, failed) \
             SELECT id, 1, {expired}, 0 FROM endpoints"
        ))
        .await
        .expect("seed the count");
    db.conn()
        .execute_unprepared("VACUUM ANALYZE")
        .await
        .expect("vacuum");

    let started = Instant::now();
    let server = Server::start(
        &scratch.url,
        &[("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into())],
    );
    let (mut pruned, mut drained) = (None, None);
    let mut last_probe = started;
    while pruned.is_none() || drained.is_none() {
        if drained.is_none() && arrivals.count() >= backlog {
            drained = Some(started.elapsed());
        }
        // The probe is one index lookup, a few times a second, so it costs the drain nothing.
        if pruned.is_none() && last_probe.elapsed() >= Duration::from_millis(200) {
            last_probe = Instant::now();
            if !any_expired(&db).await {
                pruned = Some(started.elapsed());
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(1_800),
            "pruning or the drain did not finish"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.stop();
    db.close().await.expect("close");
    scratch.drop_now().await;
    let drained = drained.unwrap_or_default();
    (
        pruned.unwrap_or_default(),
        backlog as f64 / drained.as_secs_f64().max(1e-9),
    )
}

/// Whether any delivery settled more than 30 days ago is still there.
async fn any_expired(db: &Db) -> bool {
    let row = db
        .conn()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT EXISTS (SELECT 1 FROM webhook_deliveries \
             WHERE updated_at < now() - interval '30 days') AS any",
        ))
        .await
        .expect("probe")
        .expect("row");
    row.try_get("", "any").expect("any")
}
