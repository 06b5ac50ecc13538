//! The measured workloads: submit throughput, drain throughput, and submit-to-arrival latency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::db::Db;
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::json;

use crate::process::{admin_token, Scratch, Server};
use crate::receiver;

const SUBMIT: &str =
    "mutation($input: SubmitInput!) { submit(input: $input) { created delivery { id } } }";

pub struct Throughput {
    pub per_second: f64,
    pub errors: u64,
}

pub struct Drain {
    pub elapsed: Duration,
    pub per_second: f64,
    pub peak_rss_mb: f64,
}

pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
}

async fn graphql(
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

async fn create_endpoint(
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
    let server = Server::start(
        &scratch.url,
        &[
            ("COURIER_WORKER_CONCURRENCY", "0".into()),
            ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into()),
        ],
    );
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
    for task in tasks {
        let _ = task.await;
    }
    server.stop();
    scratch.drop_now().await;
    Throughput {
        per_second: ok.load(Ordering::Relaxed) as f64 / duration.as_secs_f64(),
        errors: errors.load(Ordering::Relaxed),
    }
}

/// Deliveries per second from `pending` rows to `delivered`, by one `courier serve`.
pub async fn drain_throughput(server_url: &str, pending: usize) -> Drain {
    let scratch = Scratch::create(server_url, "drain").await;
    let _token = admin_token(&scratch.url); // migrates the database
    let (receiver_url, arrivals) = receiver::start().await;
    let db = Db::connect(&scratch.url, 2).await.expect("connect");
    seed_pending(&db, &receiver_url, pending).await;

    let concurrency = std::env::var("BENCH_WORKER_CONCURRENCY").unwrap_or_else(|_| "128".into());
    let started = Instant::now();
    let server = Server::start(
        &scratch.url,
        &[
            ("COURIER_WORKER_CONCURRENCY", concurrency),
            ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into()),
        ],
    );
    loop {
        if arrivals.count() >= pending && delivered(&db).await >= pending as i64 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the drain did not finish"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let peak_rss_mb = server.peak_rss_mb();
    server.stop();
    db.close().await.expect("close");
    scratch.drop_now().await;
    Drain {
        elapsed,
        per_second: pending as f64 / elapsed.as_secs_f64(),
        peak_rss_mb,
    }
}

async fn seed_pending(db: &Db, receiver_url: &str, count: usize) {
    let conn = db.conn();
    let endpoint = uuid::Uuid::now_v7();
    conn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO endpoints (id, name, url, signing_secret, disabled, created_at, updated_at) \
         VALUES ($1, 'bench', $2, $3, false, now(), now())",
        [
            endpoint.into(),
            receiver_url.into(),
            courier::signing::mint_secret().into(),
        ],
    ))
    .await
    .expect("endpoint");
    conn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at) \
         SELECT gen_random_uuid(), $1, jsonb_build_object('n', g, 'event', 'order.paid'), 'bench', now() \
         FROM generate_series(1, $2) g",
        [endpoint.into(), (count as i64).into()],
    ))
    .await
    .expect("submissions");
    conn.execute_unprepared(
        "INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts, next_attempt_at, created_at, updated_at) \
         SELECT gen_random_uuid(), id, endpoint_id, 'pending', 0, now(), now(), now() FROM submissions",
    )
    .await
    .expect("deliveries");
    conn.execute_unprepared("ANALYZE").await.expect("analyze");
}

async fn delivered(db: &Db) -> i64 {
    let row = db
        .conn()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'delivered'",
        ))
        .await
        .expect("count")
        .expect("row");
    row.try_get("", "n").expect("n")
}

/// Submit response to webhook arrival, at light load, API and worker in one process.
pub async fn latency(server_url: &str, samples: usize) -> Latency {
    let scratch = Scratch::create(server_url, "latency").await;
    let token = admin_token(&scratch.url);
    let (receiver_url, arrivals) = receiver::start().await;
    let server = Server::start(
        &scratch.url,
        &[("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into())],
    );
    let client = reqwest::Client::new();
    let endpoint = create_endpoint(&client, &server, &token, &receiver_url).await;

    let mut latencies = Vec::with_capacity(samples);
    for n in 0..samples + 5 {
        let body = graphql(
            &client,
            &server,
            &token,
            SUBMIT,
            json!({ "input": { "endpointId": endpoint, "payload": { "n": n } } }),
        )
        .await;
        let answered = Instant::now();
        let id = body["data"]["submit"]["delivery"]["id"]
            .as_str()
            .expect("delivery id")
            .to_owned();
        let arrived = loop {
            if let Some(at) = arrivals.at(&id) {
                break at;
            }
            assert!(
                answered.elapsed() < Duration::from_secs(30),
                "delivery {id} never arrived"
            );
            tokio::time::sleep(Duration::from_micros(100)).await;
        };
        if n >= 5 {
            latencies.push(arrived.saturating_duration_since(answered).as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop();
    scratch.drop_now().await;
    latencies.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| {
        latencies[((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1]
    };
    Latency {
        p50_ms: pick(0.50),
        p99_ms: pick(0.99),
    }
}

pub struct Publish {
    pub endpoints: usize,
    pub p50_ms: f64,
    pub max_ms: f64,
}

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
    server.stop();
    let _ = db.close().await;
    scratch.drop_now().await;
    took.sort_by(f64::total_cmp);
    Publish {
        endpoints,
        p50_ms: took[took.len() / 2],
        max_ms: took[took.len() - 1],
    }
}
