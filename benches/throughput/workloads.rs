//! The measured workloads: submit throughput, submit-to-arrival latency, and `publish` fan-out
//! (the drain is in [`crate::drain`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::db::Db;
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::json;

use crate::process::{admin_token, Scratch, Server};
use crate::receiver;

pub const SUBMIT: &str =
    "mutation($input: SubmitInput!) { submit(input: $input) { created delivery { id } } }";

pub struct Throughput {
    pub per_second: f64,
    pub errors: u64,
    /// CPU time of the `courier serve` process per submission answered, over the measured
    /// window, in microseconds.
    pub cpu_us_per_submit: f64,
}

pub struct Latency {
    /// From sending the `submit` request to the webhook's arrival.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The same, from the `submit` answer to the webhook's arrival.
    pub answered_p50_ms: f64,
    pub answered_p99_ms: f64,
    /// The first five, in order (the ones a start-up stall would hit).
    pub first_ms: Vec<f64>,
    /// How many were claimed at submit, by the server's own count.
    pub claimed_at_submit: u64,
    /// An authenticated `{ __typename }` asked after each sample on the same client: the
    /// way in and out (HTTP, GraphQL, the key), without the database's work.
    pub trivial_p50_ms: f64,
}

/// Submits `{"n": n}` to `endpoint` and returns its delivery's id.
pub async fn submit_one(
    client: &reqwest::Client,
    server: &Server,
    token: &str,
    endpoint: &str,
    n: usize,
) -> String {
    let body = graphql(
        client,
        server,
        token,
        SUBMIT,
        json!({ "input": { "endpointId": endpoint, "payload": { "n": n } } }),
    )
    .await;
    body["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no delivery id in {body}"))
        .to_owned()
}

pub async fn graphql(
    client: &reqwest::Client,
    server: &Server,
    token: &str,
    query: &str,
    variables: serde_json::Value,
) -> serde_json::Value {
    client
        .post(format!("{}/graphql", server.base_url))
        .bearer_auth(token)
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("json")
}

pub async fn create_endpoint(
    client: &reqwest::Client,
    server: &Server,
    token: &str,
    url: &str,
) -> String {
    let body = graphql(
        client,
        server,
        token,
        "mutation($url: String!) { createEndpoint(input: {name: \"bench\", url: $url}) { endpoint { id } } }",
        json!({ "url": url }),
    )
    .await;
    body["data"]["createEndpoint"]["endpoint"]["id"]
        .as_str()
        .expect("endpoint")
        .to_owned()
}

/// `submit` mutations per second through HTTP/GraphQL, API only, counting error-free answers.
pub async fn submit_throughput(
    server_url: &str,
    connections: usize,
    duration: Duration,
) -> Throughput {
    let scratch = Scratch::create(server_url, "submit").await;
    let token = admin_token(&scratch.url);
    let throughput = submit_throughput_in(&scratch.url, &token, connections, duration, &[]).await;
    scratch.drop_now().await;
    throughput
}

/// [`submit_throughput`] in the database at `database_url`, whatever it already holds,
/// with `settings` added to the server's.
pub async fn submit_throughput_in(
    database_url: &str,
    token: &str,
    connections: usize,
    duration: Duration,
    settings: &[(&str, String)],
) -> Throughput {
    let token = token.to_owned();
    let mut all = vec![
        ("COURIER_WORKER_CONCURRENCY", "0".into()),
        ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into()),
    ];
    all.extend_from_slice(settings);
    let server = Server::start(database_url, &all);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()
        .expect("client");
    let endpoint = create_endpoint(&client, &server, &token, "http://127.0.0.1:9/hook").await;

    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let warmup = Instant::now() + Duration::from_secs(1);
    let deadline = warmup + duration;
    let mut tasks = Vec::new();
    for worker in 0..connections {
        let (client, token, endpoint, ok, errors) = (
            client.clone(),
            token.clone(),
            endpoint.clone(),
            ok.clone(),
            errors.clone(),
        );
        let url = format!("{}/graphql", server.base_url);
        tasks.push(tokio::spawn(async move {
            // A light load generator: it shares the machine with what it measures.
            let query = serde_json::to_string(SUBMIT).unwrap();
            let authorization = format!("Bearer {token}");
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let body = format!(
                    r#"{{"query":{query},"variables":{{"input":{{"endpointId":"{endpoint}","payload":{{"worker":{worker},"n":{n},"event":"order.paid"}}}}}}}}"#
                );
                let answer = client
                    .post(&url)
                    .header("authorization", &authorization)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                let good = match answer {
                    Ok(response) => response.bytes().await.is_ok_and(|body| {
                        let text = String::from_utf8_lossy(&body);
                        !text.contains("\"errors\"") && text.contains("\"created\":true")
                    }),
                    Err(_) => false,
                };
                if Instant::now() >= warmup {
                    if good { ok.fetch_add(1, Ordering::Relaxed) } else { errors.fetch_add(1, Ordering::Relaxed) };
                }
            }
        }));
    }
    // The server's CPU time over the measured window alone (warm-up and start-up left out).
    let pid = server.pid();
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(warmup.into()).await;
        let start = crate::process::cpu_seconds(pid);
        tokio::time::sleep_until(deadline.into()).await;
        crate::process::cpu_seconds(pid) - start
    });
    for task in tasks {
        let _ = task.await;
    }
    let cpu_seconds = cpu.await.unwrap_or(0.0);
    // What was stored waits (its endpoint disabled) rather than competing with whatever is
    // measured next in the same database; its destination accepts nothing anyway.
    let disabled = graphql(
        &client,
        &server,
        &token,
        "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: true}) { endpoint { disabled } } }",
        json!({ "id": endpoint }),
    )
    .await;
    assert_eq!(
        disabled["data"]["updateEndpoint"]["endpoint"]["disabled"], true,
        "{disabled}"
    );
    server.stop();
    let answered = (ok.load(Ordering::Relaxed) + errors.load(Ordering::Relaxed)).max(1);
    Throughput {
        per_second: ok.load(Ordering::Relaxed) as f64 / duration.as_secs_f64(),
        errors: errors.load(Ordering::Relaxed),
        cpu_us_per_submit: cpu_seconds * 1e6 / answered as f64,
    }
}

/// Submit-to-arrival latency at light load (one submission every 20 ms over one kept-alive
/// HTTP client), API and worker in one `courier serve` with default settings, from its very
/// first request: the endpoint is created beforehand by another process, so the first
/// measured submission is the first request the measured process serves after reporting ready.
pub async fn latency(server_url: &str, samples: usize) -> Latency {
    let scratch = Scratch::create(server_url, "latency").await;
    let token = admin_token(&scratch.url);
    let latency = latency_in(&scratch.url, &token, samples, &[]).await;
    scratch.drop_now().await;
    latency
}

/// [`latency`] in the database at `database_url`, whatever it already holds, to a new
/// endpoint, with `settings` added to the measured server's.
pub async fn latency_in(
    database_url: &str,
    token: &str,
    samples: usize,
    settings: &[(&str, String)],
) -> Latency {
    let (receiver_url, arrivals) = receiver::start().await;
    let client = reqwest::Client::new();
    let setup = Server::start(
        database_url,
        &[
            ("COURIER_WORKER_CONCURRENCY", "0".into()),
            ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into()),
        ],
    );
    let endpoint = create_endpoint(&client, &setup, token, &receiver_url).await;
    setup.stop();

    let mut all = vec![("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into())];
    all.extend_from_slice(settings);
    let server = Server::start(database_url, &all);
    let mut from_sent = Vec::with_capacity(samples);
    let mut from_answered = Vec::with_capacity(samples);
    let mut trivial = Vec::with_capacity(samples);
    for n in 0..samples {
        let sent = Instant::now();
        let id = submit_one(&client, &server, token, &endpoint, n).await;
        let answered = Instant::now();
        let arrived = arrivals
            .wait_for(&id, answered, Duration::from_secs(30))
            .await;
        from_sent.push(arrived.saturating_duration_since(sent).as_secs_f64() * 1000.0);
        from_answered.push(arrived.saturating_duration_since(answered).as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let asked = Instant::now();
        let typename = graphql(&client, &server, token, "{ __typename }", json!({})).await;
        trivial.push(asked.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(typename["data"]["__typename"], "Query", "{typename}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    trivial.sort_by(f64::total_cmp);
    let claimed_at_submit =
        counter(&client, &server, "courier_delivery_claims_at_submit_total").await;
    server.stop();
    let first_ms = from_sent.iter().take(5).copied().collect();
    from_sent.sort_by(f64::total_cmp);
    from_answered.sort_by(f64::total_cmp);
    Latency {
        p50_ms: percentile(&from_sent, 0.50),
        p99_ms: percentile(&from_sent, 0.99),
        max_ms: percentile(&from_sent, 1.0),
        answered_p50_ms: percentile(&from_answered, 0.50),
        answered_p99_ms: percentile(&from_answered, 0.99),
        first_ms,
        claimed_at_submit,
        trivial_p50_ms: percentile(&trivial, 0.50),
    }
}

/// The value of the counter `name` on `server`'s `/metrics` (0 if it is not there).
async fn counter(client: &reqwest::Client, server: &Server, name: &str) -> u64 {
    let text = match client
        .get(format!("{}/metrics", server.base_url))
        .send()
        .await
    {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    text.lines()
        .filter_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
        .next()
        .map_or(0, |value| value as u64)
}

/// The `q` quantile of sorted `values` (nearest rank).
pub fn percentile(values: &[f64], q: f64) -> f64 {
    values[((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1]
}

pub struct Publish {
    pub endpoints: usize,
    pub p50_ms: f64,
    pub max_ms: f64,
    /// One publish of a [`LARGE_PAYLOAD`]-byte payload: the WAL it wrote, and what it
    /// added to the tables and their indexes (TOAST included).
    pub large_wal_bytes: i64,
    pub large_stored_bytes: i64,
}

/// The size of the large payload published once, in bytes of JSON.
pub const LARGE_PAYLOAD: usize = 20_000;

/// `publish` to `endpoints` subscribed endpoints, all created through the API, on one
/// `courier serve` with default settings (API only, so nothing drains meanwhile): the time
/// each publish takes to answer, every delivery row checked as written when it answers.
pub async fn publish_fanout(server_url: &str, endpoints: usize, samples: usize) -> Publish {
    let scratch = Scratch::create(server_url, "publish").await;
    let token = admin_token(&scratch.url);
    let server = Server::start(
        &scratch.url,
        &[
            ("COURIER_WORKER_CONCURRENCY", "0".into()),
            ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into()),
        ],
    );
    let client = reqwest::Client::new();
    for n in 0..endpoints {
        let body = graphql(
            &client,
            &server,
            &token,
            "mutation($url: String!) { createEndpoint(input: {name: \"bench\", url: $url, eventTypes: [\"order.paid\"]}) { endpoint { id } } }",
            json!({ "url": format!("http://127.0.0.1:9/hook/{n}") }),
        )
        .await;
        assert!(body["errors"].is_null(), "{body}");
    }
    let db = Db::connect(&scratch.url, 1).await.expect("connect");
    let mut took = Vec::with_capacity(samples);
    for n in 0..samples + 2 {
        let started = Instant::now();
        let body = graphql(
            &client,
            &server,
            &token,
            "mutation($input: PublishInput!) { publish(input: $input) { created event { id } } }",
            json!({ "input": { "eventType": "order.paid", "payload": { "order": n, "status": "paid" } } }),
        )
        .await;
        let elapsed = started.elapsed();
        let event = body["data"]["publish"]["event"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{body}"))
            .to_owned();
        let written = db
            .conn()
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT COUNT(*) AS n FROM webhook_deliveries d JOIN submissions s \
                 ON s.id = d.submission_id WHERE s.event_id = $1::uuid",
                [event.into()],
            ))
            .await
            .expect("count")
            .expect("row")
            .try_get::<i64>("", "n")
            .expect("n");
        assert_eq!(written as usize, endpoints, "every delivery row written");
        // The first two warm the process up, as a long-running service would be.
        if n >= 2 {
            took.push(elapsed.as_secs_f64() * 1000.0);
        }
    }
    let (large_wal_bytes, large_stored_bytes) = publish_large(&client, &server, &token, &db).await;
    server.stop();
    let _ = db.close().await;
    scratch.drop_now().await;
    took.sort_by(f64::total_cmp);
    Publish {
        endpoints,
        p50_ms: took[took.len() / 2],
        max_ms: took[took.len() - 1],
        large_wal_bytes,
        large_stored_bytes,
    }
}

/// Publishes one payload of [`LARGE_PAYLOAD`] bytes (order lines with hex digests, which
/// compress about as well as real JSON does) to every subscribed endpoint: the WAL bytes
/// the database wrote meanwhile, and the bytes the tables and indexes grew by. Nothing else
/// writes to the database then (the process is API only); the WAL counts the whole server.
async fn publish_large(
    client: &reqwest::Client,
    server: &Server,
    token: &str,
    db: &Db,
) -> (i64, i64) {
    let mut lines = Vec::new();
    let mut size = 0;
    let mut n = 0u64;
    while size < LARGE_PAYLOAD {
        let line = json!({
            "sku": format!("SKU-{n:06}"),
            "quantity": n % 7 + 1,
            "digest": format!("{:016x}{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15), n.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)),
        });
        size += line.to_string().len() + 1;
        lines.push(line);
        n += 1;
    }
    let payload = json!({ "order": "large", "lines": lines });
    let measure = "SELECT pg_current_wal_lsn()::text AS lsn, (pg_total_relation_size('webhook_deliveries')          + pg_total_relation_size('submissions') + pg_total_relation_size('events'))::bigint AS stored";
    let read = |row: sea_orm::QueryResult| -> (String, i64) {
        (
            row.try_get("", "lsn").expect("lsn"),
            row.try_get("", "stored").expect("stored"),
        )
    };
    let query = |sql: String| {
        let db = db.clone();
        async move {
            db.conn()
                .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
                .await
                .expect("measure")
                .expect("row")
        }
    };
    let (lsn_before, stored_before) = read(query(measure.to_owned()).await);
    let body = graphql(
        client,
        server,
        token,
        "mutation($input: PublishInput!) { publish(input: $input) { created event { id } } }",
        json!({ "input": { "eventType": "order.paid", "payload": payload } }),
    )
    .await;
    assert!(body["errors"].is_null(), "{body}");
    let (_, stored_after) = read(query(measure.to_owned()).await);
    let wal: i64 = query(format!(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{lsn_before}')::bigint AS lsn, 0::bigint AS stored"
    ))
    .await
    .try_get("", "lsn")
    .expect("wal");
    (wal, stored_after - stored_before)
}
