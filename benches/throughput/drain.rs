//! The drain as users meet it: a backlog built through the GraphQL API (32 connections to an
//! API-only process), then one `courier serve` with default settings started against it,
//! timed from its spawn (start-up included) until every delivery is recorded `delivered`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::db::Db;
use sea_orm::{ConnectionTrait, DbBackend, Statement};

use crate::process::{admin_token, backend_cpu_seconds, cpu_seconds, HostTicks, Scratch, Server};
use crate::receiver;
use crate::workloads::{create_endpoint, SUBMIT};

/// Rows per slice of the per-slice drain rates.
pub const SLICE: usize = 10_000;

/// How a backlog was built through the API.
pub struct Fill {
    pub submissions: usize,
    pub elapsed: Duration,
    pub per_second: f64,
    pub retried: u64,
}

pub struct Drain {
    pub backlog: usize,
    /// The endpoints the backlog is spread over (round robin).
    pub endpoints: usize,
    /// The ordering keys it is spread over (round robin; 0: none).
    pub keys: usize,
    pub fill: Fill,
    pub elapsed: Duration,
    pub per_second: f64,
    /// Deliveries per second for each consecutive slice of [`SLICE`] arrivals.
    pub slices: Vec<f64>,
    pub peak_rss_mb: f64,
    /// `webhook_deliveries` updates during the drain, and how many of them were HOT.
    pub updates: i64,
    pub hot_updates: i64,
    /// CPU seconds during the drain: the `courier serve` process, its PostgreSQL backends
    /// (at the end of the drain), and this process (the receiver).
    pub cpu_courier: f64,
    pub cpu_postgres: f64,
    pub cpu_receiver: f64,
    /// Percent of the machine's CPU time its host took during the drain (steal).
    pub host_steal_percent: f64,
    /// pgbench's TPS measured once the backlog was built, right before the drain (when asked for).
    pub pgbench_beside_tps: Option<f64>,
}

/// Builds a backlog of `backlog` pending deliveries spread over `endpoints` endpoints
/// (and, unless `keys` is 0, over that many ordering keys) through the API, then drains it
/// with one default `courier serve` (only `COURIER_ALLOW_PRIVATE_DESTINATIONS=true`, which
/// any user of a local receiver sets too).
pub async fn drain(
    server_url: &str,
    backlog: usize,
    connections: usize,
    endpoints: usize,
    keys: usize,
    budget: &dyn Fn() -> f64,
) -> Drain {
    let scratch = Scratch::create(server_url, "drain").await;
    let token = admin_token(&scratch.url);
    let shape = Shape {
        backlog,
        connections,
        endpoints,
        keys,
    };
    let drain = drain_with_keys_in(&scratch.url, &token, shape, Some(budget)).await;
    scratch.drop_now().await;
    drain
}

/// [`drain`] without ordering keys in the database at `database_url`, whatever it already
/// holds: the backlog goes to new endpoints, and only deliveries created from now on are
/// waited for.
pub async fn drain_in(
    database_url: &str,
    token: &str,
    backlog: usize,
    connections: usize,
    endpoints: usize,
) -> Drain {
    let shape = Shape {
        backlog,
        connections,
        endpoints,
        keys: 0,
    };
    drain_with_keys_in(database_url, token, shape, None).await
}

/// What a drain drains: `backlog` deliveries submitted over `connections`, round robin over
/// `endpoints` endpoints and `keys` ordering keys (0: none).
struct Shape {
    backlog: usize,
    connections: usize,
    endpoints: usize,
    keys: usize,
}

/// [`drain_in`] of `shape`, with `budget` (pgbench's TPS) measured once the backlog is
/// built, right before the drain, when given.
async fn drain_with_keys_in(
    database_url: &str,
    token: &str,
    shape: Shape,
    budget: Option<&dyn Fn() -> f64>,
) -> Drain {
    let Shape {
        backlog,
        connections,
        endpoints,
        keys,
    } = shape;
    let (receiver_url, arrivals) = receiver::start().await;
    let db = Db::connect(database_url, 1).await.expect("connect");
    let since = database_now(&db).await;
    let fill = fill_with_keys(
        database_url,
        token,
        &receiver_url,
        backlog,
        connections,
        endpoints,
        keys,
    )
    .await;
    assert_eq!(
        arrivals.count(),
        0,
        "nothing drains while the backlog is built"
    );

    let pgbench_beside_tps = budget.map(|measure| measure());
    let (updates_before, hot_before) = update_counts(&db).await;
    let receiver_cpu_before = cpu_seconds(std::process::id());
    let host = HostTicks::now();
    let started = Instant::now();
    let server = Server::start(
        database_url,
        &[("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into())],
    );
    // Arrivals are watched in process; the database is asked only once they are all in,
    // so the watching costs the drain nothing.
    loop {
        if arrivals.count() >= backlog && delivered_since(&db, &since).await >= backlog as i64 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "the drain did not finish"
        );
        let pause = if arrivals.count() >= backlog { 20 } else { 5 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    let elapsed = started.elapsed();
    let peak_rss_mb = server.peak_rss_mb();
    let cpu_courier = server.cpu_seconds();
    let cpu_postgres = backend_cpu_seconds(database_name(database_url));
    let cpu_receiver = cpu_seconds(std::process::id()) - receiver_cpu_before;
    let host_steal_percent = host.stolen_percent();
    server.stop();
    // The statistics collector reports with a short delay.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (updates_after, hot_after) = update_counts(&db).await;
    db.close().await.expect("close");

    let mut times = arrivals.times();
    times.sort();
    let slices = times
        .chunks(SLICE)
        .scan(started, |from, chunk| {
            let to = *chunk.last().expect("a chunk is never empty");
            let seconds = to.saturating_duration_since(*from).as_secs_f64();
            *from = to;
            Some(chunk.len() as f64 / seconds.max(1e-9))
        })
        .collect();
    Drain {
        backlog,
        endpoints,
        keys,
        fill,
        elapsed,
        per_second: backlog as f64 / elapsed.as_secs_f64(),
        slices,
        peak_rss_mb,
        updates: updates_after - updates_before,
        hot_updates: hot_after - hot_before,
        cpu_courier,
        cpu_postgres,
        cpu_receiver,
        host_steal_percent,
        pgbench_beside_tps,
    }
}

/// `count` submissions, round robin over `endpoints` endpoints at `receiver_url`, over
/// `connections` concurrent HTTP connections to an API-only `courier serve`. Every one must
/// be created.
pub async fn fill(
    database_url: &str,
    token: &str,
    receiver_url: &str,
    count: usize,
    connections: usize,
    endpoints: usize,
) -> Fill {
    fill_with_keys(
        database_url,
        token,
        receiver_url,
        count,
        connections,
        endpoints,
        0,
    )
    .await
}

/// [`fill`], the `n`th submission with ordering key `key-<n % keys>` (none when `keys` is
/// 0): with as many keys as endpoints or a multiple of them, each key stays on one endpoint.
async fn fill_with_keys(
    database_url: &str,
    token: &str,
    receiver_url: &str,
    count: usize,
    connections: usize,
    endpoints: usize,
    keys: usize,
) -> Fill {
    let server = Server::start(
        database_url,
        &[
            ("COURIER_WORKER_CONCURRENCY", "0".into()),
            ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into()),
        ],
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()
        .expect("client");
    let mut targets = Vec::with_capacity(endpoints);
    for _ in 0..endpoints.max(1) {
        targets.push(create_endpoint(&client, &server, token, receiver_url).await);
    }
    let targets = Arc::new(targets);
    let next = Arc::new(AtomicUsize::new(0));
    let retried = Arc::new(AtomicU64::new(0));
    let url = format!("{}/graphql", server.base_url);
    let query = serde_json::to_string(SUBMIT).expect("query");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (client, next, retried) = (client.clone(), next.clone(), retried.clone());
        let (url, query, targets) = (url.clone(), query.clone(), targets.clone());
        let authorization = format!("Bearer {token}");
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    break;
                }
                let endpoint = &targets[n % targets.len()];
                let key = if keys == 0 {
                    String::new()
                } else {
                    format!(r#","orderingKey":"key-{}""#, n % keys)
                };
                let body = format!(
                    r#"{{"query":{query},"variables":{{"input":{{"endpointId":"{endpoint}","payload":{{"n":{n},"event":"order.paid","amount":"12.50"}}{key}}}}}}}"#
                );
                let mut tries = 0;
                loop {
                    tries += 1;
                    let answer = client
                        .post(&url)
                        .header("authorization", &authorization)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    let created = match answer {
                        Ok(response) => response.bytes().await.is_ok_and(|body| {
                            let text = String::from_utf8_lossy(&body);
                            !text.contains("\"errors\"") && text.contains("\"created\":true")
                        }),
                        Err(_) => false,
                    };
                    if created {
                        break;
                    }
                    assert!(tries < 5, "submission {n} was refused five times");
                    retried.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("fill task");
    }
    let elapsed = started.elapsed();
    server.stop();
    Fill {
        submissions: count,
        elapsed,
        per_second: count as f64 / elapsed.as_secs_f64(),
        retried: retried.load(Ordering::Relaxed),
    }
}

/// The database's clock, as text it parses back.
async fn database_now(db: &Db) -> String {
    db.conn()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT now()::text AS now",
        ))
        .await
        .expect("now")
        .expect("row")
        .try_get("", "now")
        .expect("now")
}

/// The database name at the end of `database_url`.
fn database_name(database_url: &str) -> &str {
    let path = database_url.split('?').next().unwrap_or(database_url);
    path.rsplit('/').next().unwrap_or(path)
}

/// Deliveries created since `since` and delivered (read through the time index, so a
/// history already there costs nothing).
async fn delivered_since(db: &Db, since: &str) -> i64 {
    let row = db
        .conn()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT COUNT(*) AS n FROM webhook_deliveries \
                 WHERE created_at >= '{since}'::timestamptz AND state = 'delivered'"
            ),
        ))
        .await
        .expect("count")
        .expect("row");
    row.try_get("", "n").expect("n")
}

/// Updates of `webhook_deliveries` so far, and how many were HOT (no index touched).
async fn update_counts(db: &Db) -> (i64, i64) {
    let row = db
        .conn()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT n_tup_upd AS upd, n_tup_hot_upd AS hot FROM pg_stat_user_tables \
             WHERE relname = 'webhook_deliveries'",
        ))
        .await
        .expect("statistics")
        .expect("row");
    (
        row.try_get("", "upd").expect("upd"),
        row.try_get("", "hot").expect("hot"),
    )
}
