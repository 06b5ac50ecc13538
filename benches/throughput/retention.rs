//! Retention against a deep history: expired deliveries seeded in bulk, in the shape
//! Courier writes them (a submission, its delivered delivery, one attempt, the delivered
//! count), then one default `courier serve` prunes them from its start; timed until the
//! last expired delivery is gone.

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
}

/// `expired` deliveries settled 31 to 60 days ago, spread over one endpoint's history.
pub async fn prune_rate(server_url: &str, expired: i64, connections: usize) -> Pruning {
    let scratch = Scratch::create(server_url, "retention").await;
    let token = admin_token(&scratch.url);
    let (receiver_url, _arrivals) = receiver::start().await;
    // One endpoint, created through the API (with one fresh submission of its own).
    fill(&scratch.url, &token, &receiver_url, 1, connections, 1).await;
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
    let server = Server::start(&scratch.url, &[]);
    loop {
        if remaining(&db).await == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1_800),
            "pruning did not finish"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    server.stop();
    db.close().await.expect("close");
    scratch.drop_now().await;
    Pruning {
        expired,
        elapsed,
        per_second: expired as f64 / elapsed.as_secs_f64(),
    }
}

/// Deliveries settled more than 30 days ago still there.
async fn remaining(db: &Db) -> i64 {
    let row = db
        .conn()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE updated_at < now() - interval '30 days'",
        ))
        .await
        .expect("count")
        .expect("row");
    row.try_get("", "n").expect("n")
}
