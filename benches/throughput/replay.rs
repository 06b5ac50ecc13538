//! Bulk recovery as an operator meets it: an endpoint whose URL was wrong has a backlog that
//! ended `FAILED`; the URL is fixed and every failed delivery is replayed in one
//! `replayDeliveries` call, while other endpoints' backlog drains. Timed: the call, and
//! the other endpoints' drain rate during it beside the same rate without it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use courier::db::Db;
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::json;

use crate::drain::fill;
use crate::process::{admin_token, Scratch, Server};
use crate::receiver::{self, Arrivals};
use crate::workloads::graphql;

/// Other endpoints whose backlog drains during the replay.
const OTHER_ENDPOINTS: usize = 10;
/// How long a server runs before a rate is measured (start-up and the first claims).
const WARM_UP: Duration = Duration::from_secs(2);
/// The window of the drain rate without a replay.
const BASELINE_WINDOW: Duration = Duration::from_secs(5);

pub struct Replay {
    pub failed: usize,
    pub replayed: i64,
    pub elapsed: Duration,
    /// Other endpoints' deliveries per second without a replay, and during it.
    pub others_without: f64,
    pub others_during: f64,
}

/// `failed` deliveries to one endpoint made `FAILED` (its URL refuses connections, a
/// process with `COURIER_MAX_ATTEMPTS=1` attempts each once), then replayed in bulk by a
/// default `courier serve` that is also draining `others` deliveries to ten other
/// endpoints. Everything is built through the API.
pub async fn bulk_replay(
    server_url: &str,
    failed: usize,
    others: usize,
    connections: usize,
) -> Replay {
    let scratch = Scratch::create(server_url, "replay").await;
    let token = admin_token(&scratch.url);
    let (receiver_url, arrivals) = receiver::start().await;
    let db = Db::connect(&scratch.url, 1).await.expect("connect");

    // Nothing listens on port 9 of the loopback: every attempt is refused at once.
    fill(
        &scratch.url,
        &token,
        "http://127.0.0.1:9/hook",
        failed,
        connections,
        1,
    )
    .await;
    let broken = one_text(&db, "SELECT id::text AS v FROM endpoints").await;
    let failing = Server::start(
        &scratch.url,
        &[
            ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into()),
            ("COURIER_MAX_ATTEMPTS", "1".into()),
            ("COURIER_DISABLE_AFTER_FAILURES", "0".into()),
        ],
    );
    let started = Instant::now();
    while count(
        &db,
        "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'failed'",
    )
    .await
        < failed as i64
    {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the backlog did not fail"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    failing.stop();
    let broken_ids: HashSet<String> = texts(
        &db,
        "SELECT id::text AS v FROM webhook_deliveries WHERE state = 'failed'",
    )
    .await
    .into_iter()
    .collect();

    fill(
        &scratch.url,
        &token,
        &receiver_url,
        others,
        connections,
        OTHER_ENDPOINTS,
    )
    .await;
    let settings = [("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".to_owned())];

    // The other endpoints' drain rate with nothing else going on.
    let server = Server::start(&scratch.url, &settings);
    tokio::time::sleep(WARM_UP).await;
    let before = others_arrived(&arrivals, &broken_ids);
    tokio::time::sleep(BASELINE_WINDOW).await;
    let others_without =
        (others_arrived(&arrivals, &broken_ids) - before) as f64 / BASELINE_WINDOW.as_secs_f64();
    server.stop();

    // The URL fixed, then one call replays every failed delivery while the drain goes on.
    let server = Server::start(&scratch.url, &settings);
    let client = reqwest::Client::new();
    let fixed = graphql(
        &client,
        &server,
        &token,
        "mutation($id: ID!, $url: String!) { updateEndpoint(id: $id, input: {url: $url}) { endpoint { id } } }",
        json!({ "id": broken, "url": receiver_url }),
    )
    .await;
    assert!(fixed.get("errors").is_none(), "{fixed}");
    tokio::time::sleep(WARM_UP).await;
    let before = others_arrived(&arrivals, &broken_ids);
    let started = Instant::now();
    let answer = graphql(
        &client,
        &server,
        &token,
        "mutation($id: ID!) { replayDeliveries(filter: {endpointId: $id}) { replayed } }",
        json!({ "id": broken }),
    )
    .await;
    let elapsed = started.elapsed();
    let others_during =
        (others_arrived(&arrivals, &broken_ids) - before) as f64 / elapsed.as_secs_f64();
    let replayed = answer["data"]["replayDeliveries"]["replayed"]
        .as_i64()
        .unwrap_or_else(|| panic!("{answer}"));
    assert!(
        others_arrived(&arrivals, &broken_ids) < others,
        "the other endpoints' backlog lasted the whole replay"
    );
    server.stop();
    db.close().await.expect("close");
    scratch.drop_now().await;
    Replay {
        failed,
        replayed,
        elapsed,
        others_without,
        others_during,
    }
}

/// Arrivals so far of deliveries that are not the broken endpoint's.
fn others_arrived(arrivals: &Arrivals, broken: &HashSet<String>) -> usize {
    arrivals
        .ids()
        .into_iter()
        .filter(|id| !broken.contains(id))
        .count()
}

async fn count(db: &Db, sql: &str) -> i64 {
    let row = db
        .conn()
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .expect("count")
        .expect("row");
    row.try_get("", "n").expect("n")
}

async fn texts(db: &Db, sql: &str) -> Vec<String> {
    db.conn()
        .query_all_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .expect("query")
        .iter()
        .map(|row| row.try_get("", "v").expect("v"))
        .collect()
}

async fn one_text(db: &Db, sql: &str) -> String {
    texts(db, sql).await.pop().expect("a row")
}
