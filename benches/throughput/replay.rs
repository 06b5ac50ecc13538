//! Bulk recovery as an operator meets it: an endpoint whose URL was wrong has a backlog that
//! ended `FAILED`; the URL is fixed and every failed delivery is replayed in one
//! `replayDeliveries` call, while other endpoints' backlog drains. Timed: the call, and
//! the other endpoints' drain rate during it beside the same rate without it. The same is
//! measured once with the replayed endpoint disabled (its replayed deliveries park), which
//! isolates what the replay itself costs the claims of other endpoints from what the
//! replayed deliveries' own share of the worker takes.

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
    /// Other endpoints' deliveries per second without a replay.
    pub others_without: f64,
    /// Replaying into a disabled endpoint (its deliveries park).
    pub parked: Measured,
    /// Replaying after the URL is fixed (its deliveries flow beside the others).
    pub flowing: Measured,
}

/// One `replayDeliveries` call.
pub struct Measured {
    pub replayed: i64,
    pub elapsed: Duration,
    /// Other endpoints' deliveries per second during the call.
    pub others_during: f64,
}

/// `failed` deliveries to each of two endpoints made `FAILED` (their URL refuses
/// connections, a process with `COURIER_MAX_ATTEMPTS=1` attempts each once), then each
/// endpoint's replayed in bulk by a default `courier serve` that is also draining `others`
/// deliveries to ten other endpoints: the first disabled, the second with its URL fixed.
/// Everything is built through the API.
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
        2 * failed,
        connections,
        2,
    )
    .await;
    let broken = texts(&db, "SELECT id::text AS v FROM endpoints ORDER BY id").await;
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
        < 2 * failed as i64
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

    let server = Server::start(&scratch.url, &settings);
    let client = reqwest::Client::new();
    // Disabled, then replayed: the replayed deliveries park.
    let disable = graphql(
        &client,
        &server,
        &token,
        "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: true}) { endpoint { id } } }",
        json!({ "id": broken[0] }),
    )
    .await;
    assert!(disable.get("errors").is_none(), "{disable}");
    tokio::time::sleep(WARM_UP).await;
    let parked =
        replay_measured(&client, &server, &token, &broken[0], &arrivals, &broken_ids).await;
    // The URL fixed, then replayed: the replayed deliveries flow beside the others.
    let fixed = graphql(
        &client,
        &server,
        &token,
        "mutation($id: ID!, $url: String!) { updateEndpoint(id: $id, input: {url: $url}) { endpoint { id } } }",
        json!({ "id": broken[1], "url": receiver_url }),
    )
    .await;
    assert!(fixed.get("errors").is_none(), "{fixed}");
    let flowing =
        replay_measured(&client, &server, &token, &broken[1], &arrivals, &broken_ids).await;
    assert!(
        others_arrived(&arrivals, &broken_ids) < others,
        "the other endpoints' backlog lasted both replays"
    );
    server.stop();
    db.close().await.expect("close");
    scratch.drop_now().await;
    Replay {
        failed,
        others_without,
        parked,
        flowing,
    }
}

/// Replays every failed delivery of `endpoint` in one call, and counts the other
/// endpoints' arrivals meanwhile.
async fn replay_measured(
    client: &reqwest::Client,
    server: &Server,
    token: &str,
    endpoint: &str,
    arrivals: &Arrivals,
    broken: &HashSet<String>,
) -> Measured {
    let before = others_arrived(arrivals, broken);
    let started = Instant::now();
    let answer = graphql(
        client,
        server,
        token,
        "mutation($id: ID!) { replayDeliveries(filter: {endpointId: $id}) { replayed } }",
        json!({ "id": endpoint }),
    )
    .await;
    let elapsed = started.elapsed();
    let others_during = (others_arrived(arrivals, broken) - before) as f64 / elapsed.as_secs_f64();
    Measured {
        replayed: answer["data"]["replayDeliveries"]["replayed"]
            .as_i64()
            .unwrap_or_else(|| panic!("{answer}")),
        elapsed,
        others_during,
    }
}

/// Arrivals so far of deliveries that are not the broken endpoints'.
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
