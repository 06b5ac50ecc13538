//! Several hosts, one database, clocks that disagree: real `courier serve` processes run
//! under libfaketime two minutes ahead and two minutes behind, next to a correct one, on one
//! PostgreSQL database. Every decision about time is the database's, so none of it shows.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use courier::auth::{self, Role};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::{json, Value};

use crate::support::process::{admin_token, spawn_serve_skewed, Served};
use crate::support::receiver::slow_first_attempt;
use crate::support::{gql_error_code, Backend, Receiver, Reply, TestDb};

const AHEAD: i64 = 120;
const BEHIND: i64 = -120;

/// A `courier serve` process with the settings every process here shares.
fn correct(db: &TestDb, settings: &[(&str, &str)]) -> Served {
    Served::start(&db.url, &with_defaults(settings))
}

/// Like [`correct`], with its wall clock `offset_secs` off.
fn skewed(db: &TestDb, offset_secs: i64, settings: &[(&str, &str)]) -> Served {
    let (child, addr) = spawn_serve_skewed(&db.url, &with_defaults(settings), offset_secs);
    Served::new(child, addr)
}

/// Settings every process here shares, then `settings` (API only unless they say otherwise).
fn with_defaults<'a>(settings: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all = vec![
        ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("COURIER_WORKER_CONCURRENCY", "0"),
        ("COURIER_POLL_INTERVAL_MS", "100"),
        ("COURIER_LEASE_SECS", "60"),
    ];
    all.extend_from_slice(settings);
    all
}

const WORKER: (&str, &str) = ("COURIER_WORKER_CONCURRENCY", "4");

const SUBMIT: &str = "mutation($id: ID!, $n: JSON!) { submit(input: {endpointId: $id, payload: $n}) { created submission { createdAt } delivery { id } } }";

async fn submit(process: &Served, token: &str, endpoint: &str, n: usize) -> Value {
    process
        .graphql(token, SUBMIT, json!({ "id": endpoint, "n": n }))
        .await
}

/// Requests received per webhook id.
fn per_delivery(receiver: &Receiver) -> HashMap<String, Vec<crate::support::receiver::Received>> {
    let mut per: HashMap<String, Vec<_>> = HashMap::new();
    for received in receiver.received() {
        per.entry(received.webhook_id.clone())
            .or_default()
            .push(received);
    }
    per
}

/// A slow receiver holds a delivery claimed by the correct process; processes whose clocks
/// run two minutes ahead and behind start polling meanwhile. The 60 s lease is live on the
/// database's clock, so neither takes the delivery over: it is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_live_lease_is_stolen_by_a_skewed_clock() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(slow_first_attempt(Duration::from_secs(4))).await;
    let token = admin_token(&db).await;
    let correct = correct(&db, &[WORKER]);
    let endpoint = correct
        .create_endpoint(&token, &receiver, "slow", &[])
        .await;
    let body = submit(&correct, &token, &endpoint, 1).await;
    assert_eq!(body["data"]["submit"]["created"], true, "{body}");
    receiver.wait_for(1, Duration::from_secs(10)).await;

    let _ahead = skewed(&db, AHEAD, &[WORKER]);
    let _behind = skewed(&db, BEHIND, &[WORKER]);
    // The held request ends 4 s after it began; watch well past it for a second copy.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let sent: Vec<usize> = per_delivery(&receiver).values().map(Vec::len).collect();
    assert_eq!(sent, vec![1], "the delivery was sent exactly once");
}

/// Submissions accepted by API processes two minutes ahead and behind are stamped with the
/// database's time and delivered at once by a correct worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_through_skewed_apis_are_delivered_at_once() {
    const EACH: usize = 3;
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(|_| Reply::status(200)).await;
    let token = admin_token(&db).await;
    let ahead = skewed(&db, AHEAD, &[]);
    let behind = skewed(&db, BEHIND, &[]);
    let _worker = correct(&db, &[WORKER]);
    let endpoint = ahead
        .create_endpoint(&token, &receiver, "prompt", &[])
        .await;

    let started = Instant::now();
    for n in 0..EACH {
        for api in [&ahead, &behind] {
            let body = submit(api, &token, &endpoint, n).await;
            assert_eq!(body["data"]["submit"]["created"], true, "{body}");
            let created_at: chrono::DateTime<chrono::Utc> = body["data"]["submit"]["submission"]
                ["createdAt"]
                .as_str()
                .and_then(|at| at.parse().ok())
                .unwrap_or_else(|| panic!("createdAt: {body}"));
            let off = (created_at - chrono::Utc::now()).num_seconds().abs();
            assert!(
                off <= 10,
                "createdAt is the database's time, not the API host's ({off} s off)"
            );
        }
    }
    receiver.wait_for(2 * EACH, Duration::from_secs(20)).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "delivered at once"
    );
}

/// Retries scheduled by a worker two minutes behind, then by one two minutes ahead, come
/// due after the retry delay on the database's clock: neither at once nor two minutes late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_keep_their_schedule_on_skewed_workers() {
    const EACH: usize = 2;
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(|n| Reply::status(if n == 1 { 500 } else { 200 })).await;
    let token = admin_token(&db).await;
    let api = correct(&db, &[]);
    let endpoint = api.create_endpoint(&token, &receiver, "flaky", &[]).await;
    let retry = [WORKER, ("COURIER_RETRY_BASE_MS", "2000")];
    for (round, offset) in [BEHIND, AHEAD].into_iter().enumerate() {
        let worker = skewed(&db, offset, &retry);
        for n in 0..EACH {
            let body = submit(&api, &token, &endpoint, round * EACH + n).await;
            assert_eq!(body["data"]["submit"]["created"], true, "{body}");
        }
        receiver
            .wait_for(2 * EACH * (round + 1), Duration::from_secs(30))
            .await;
        drop(worker);
    }
    let now = chrono::Utc::now().timestamp();
    for (id, requests) in per_delivery(&receiver) {
        assert_eq!(requests.len(), 2, "one failure, one retry for {id}");
        let gap = requests[1].at - requests[0].at;
        // 2 s less up to 20 % jitter, give or take polling.
        assert!(
            gap >= Duration::from_millis(1400) && gap <= Duration::from_secs(8),
            "the retry came {gap:?} after the failure"
        );
        // Sent by the skewed workers (the API process runs none), stamped with the
        // database's time.
        for request in &requests {
            let skew = (request.timestamp_secs - now).abs();
            assert!(skew < 30, "webhook-timestamp {skew} s off");
            assert!(request.verified);
        }
    }
}

/// A limit of 4 per window, counted by API processes two minutes ahead and behind: both
/// count in the database's window, so exactly 4 of 10 concurrent submissions are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_rate_limit_stays_exact_across_skewed_clocks() {
    const LIMIT: usize = 4;
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(|_| Reply::status(200)).await;
    let limited = [
        ("COURIER_RATE_LIMIT", "4"),
        ("COURIER_RATE_LIMIT_WINDOW_SECS", "60"),
    ];
    let ahead = skewed(&db, AHEAD, &limited);
    let behind = skewed(&db, BEHIND, &limited);
    let admin = admin_token(&db).await;
    let endpoint = ahead
        .create_endpoint(&admin, &receiver, "limited", &[])
        .await;
    let pool = db.connect(1).await;
    // A burst may straddle a window boundary of the database's clock; then try again.
    for _ in 0..3 {
        let key = auth::create_api_key(&pool, "burst", Role::Admin, Default::default())
            .await
            .expect("create an API key");
        let answers = futures_util::future::join_all((0..10).map(|n| {
            let api = if n % 2 == 0 { &ahead } else { &behind };
            submit(api, &key.token, &endpoint, n)
        }))
        .await;
        let windows: i64 = pool
            .conn()
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT COUNT(*) AS n FROM rate_limit_counters WHERE subject = $1",
                [key.id.to_string().into()],
            ))
            .await
            .expect("count windows")
            .expect("a row")
            .try_get("", "n")
            .expect("n");
        if windows > 1 {
            continue;
        }
        let admitted = answers
            .iter()
            .filter(|a| a["data"]["submit"]["created"] == true)
            .count();
        for answer in &answers {
            if answer["data"]["submit"]["created"] != true {
                assert_eq!(gql_error_code(answer), Some("RATE_LIMITED"), "{answer}");
            }
        }
        assert_eq!(admitted, LIMIT, "exactly the limit is admitted");
        return;
    }
    panic!("every burst straddled a window boundary");
}

/// An operational event says when it happened by the database's clock: an endpoint
/// disabled through a process whose clock runs two minutes ahead is announced with the
/// time the database gave the change, not the process's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operational_events_are_stamped_with_the_database_time() {
    let db = TestDb::new(Backend::Postgres).await;
    let token = admin_token(&db).await;
    let ahead = skewed(&db, AHEAD, &[WORKER]);
    let receiver = Receiver::accepting().await;
    ahead
        .create_endpoint(&token, &receiver, "pager", &["courier.endpoint.disabled"])
        .await;
    let subject = ahead
        .create_endpoint(&token, &receiver, "subject", &[])
        .await;

    let disabled = ahead
        .graphql(
            &token,
            "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: true}) { endpoint { disabled } } }",
            json!({ "id": subject }),
        )
        .await;
    assert_eq!(
        disabled["data"]["updateEndpoint"]["endpoint"]["disabled"], true,
        "{disabled}"
    );
    let received = receiver.wait_for(1, Duration::from_secs(20)).await;
    assert!(received[0].verified);
    assert_eq!(received[0].body["type"], "courier.endpoint.disabled");
    let off = seconds_off(&received[0].body["at"]);
    assert!(
        off < 30,
        "the event's time is the database's, not the skewed process's ({off} s off)"
    );
}

/// How far `at` (RFC 3339) is from this host's time, in seconds.
fn seconds_off(at: &Value) -> i64 {
    let at: chrono::DateTime<chrono::Utc> = at
        .as_str()
        .and_then(|at| at.parse().ok())
        .unwrap_or_else(|| panic!("a time: {at}"));
    (at - chrono::Utc::now()).num_seconds().abs()
}

/// What a process ten minutes ahead stamps carries the database's time, as it measured
/// it: the rows it creates (endpoint, tenant, key) and changes (a revocation), its answers'
/// `Date`, its attempts, and its webhooks' `webhook-timestamp`, which the official verifier takes only
/// within five minutes of the receiver's clock. (Each was ten minutes off before, and every
/// webhook of the process failed verification.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_skewed_process_stamps_carries_the_database_time() {
    let db = TestDb::new(Backend::Postgres).await;
    let token = admin_token(&db).await;
    let ahead = skewed(&db, 600, &[WORKER]);
    let receiver = Receiver::accepting().await;
    let endpoint = ahead.create_endpoint(&token, &receiver, "hook", &[]).await;

    let made = ahead
        .graphql(
            &token,
            "mutation($id: ID!) { updateEndpoint(id: $id, input: {name: \"renamed\"}) \
             { endpoint { createdAt updatedAt } } \
             createTenant(input: {name: \"t\"}) { createdAt } \
             createApiKey(input: {name: \"k\", role: ADMIN}) { apiKey { id createdAt } } }",
            json!({ "id": endpoint }),
        )
        .await;
    let key = &made["data"]["createApiKey"]["apiKey"];
    let revoked = ahead
        .graphql(
            &token,
            "mutation($id: ID!) { revokeApiKey(id: $id) { revokedAt } }",
            json!({ "id": key["id"] }),
        )
        .await;
    for (what, at) in [
        (
            "endpoint createdAt",
            &made["data"]["updateEndpoint"]["endpoint"]["createdAt"],
        ),
        (
            "endpoint updatedAt",
            &made["data"]["updateEndpoint"]["endpoint"]["updatedAt"],
        ),
        (
            "tenant createdAt",
            &made["data"]["createTenant"]["createdAt"],
        ),
        ("key createdAt", &key["createdAt"]),
        (
            "key revokedAt",
            &revoked["data"]["revokeApiKey"]["revokedAt"],
        ),
    ] {
        assert!(seconds_off(at) < 30, "{what}: {at} ({made} {revoked})");
    }

    // So is every answer's `Date` (what the console judges an expiry by), a CORS
    // preflight's included.
    let client = reqwest::Client::new();
    let answers = [
        client.get(format!("http://{}/healthz", ahead.addr)),
        client
            .request(
                reqwest::Method::OPTIONS,
                format!("http://{}/graphql", ahead.addr),
            )
            .header("origin", "https://dashboard.example.com")
            .header("access-control-request-method", "POST"),
    ];
    for answer in answers {
        let answer = answer.send().await.expect("answered");
        let date = answer
            .headers()
            .get("date")
            .and_then(|date| date.to_str().ok())
            .and_then(|date| chrono::DateTime::parse_from_rfc2822(date).ok())
            .unwrap_or_else(|| panic!("a Date: {:?}", answer.headers()));
        assert!(
            (date.timestamp() - chrono::Utc::now().timestamp()).abs() < 30,
            "Date {date} is the database's time, not the process's ({answer:?})"
        );
    }

    submit(&ahead, &token, &endpoint, 1).await;
    let received = receiver.wait_for(1, Duration::from_secs(20)).await;
    assert!(received[0].verified, "the official verifier accepts it");
    let now = chrono::Utc::now().timestamp();
    assert!(
        (received[0].timestamp_secs - now).abs() < 30,
        "webhook-timestamp {} is the database's time, not the process's",
        received[0].timestamp
    );
    // The attempt is recorded a moment after the receiver answered.
    let (ahead_ref, token_ref) = (&ahead, &token);
    let started = crate::support::fixtures::poll(
        "the attempt is recorded",
        Duration::from_secs(10),
        || async move {
            let attempts = ahead_ref
                .graphql(
                    token_ref,
                    "{ deliveries(first: 1) { edges { node { attempts { startedAt } } } } }",
                    json!({}),
                )
                .await;
            let started = attempts["data"]["deliveries"]["edges"][0]["node"]["attempts"][0]
                ["startedAt"]
                .clone();
            if started.is_string() {
                Ok(started)
            } else {
                Err(attempts.to_string())
            }
        },
    )
    .await;
    assert!(seconds_off(&started) < 30, "attempt startedAt: {started}");
}

/// A receiver answers `503` with `Retry-After` as an HTTP date 30 s ahead (and its own
/// `Date`): workers two minutes ahead and two minutes behind both pause the endpoint for
/// those 30 s on the database's clock, neither ignoring the wait nor adding their skew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_date_pauses_as_long_as_the_receiver_asked_on_skewed_workers() {
    const ASKED: Duration = Duration::from_secs(30);
    let db = TestDb::new(Backend::Postgres).await;
    let token = admin_token(&db).await;
    let pool = db.connect(1).await;
    for offset in [AHEAD, BEHIND] {
        let receiver = Receiver::start(|_| {
            let now = std::time::SystemTime::now();
            Reply {
                headers: vec![
                    ("retry-after", httpdate::fmt_http_date(now + ASKED)),
                    ("date", httpdate::fmt_http_date(now)),
                ],
                ..Reply::status(503)
            }
        })
        .await;
        let worker = skewed(&db, offset, &[WORKER]);
        let endpoint = worker.create_endpoint(&token, &receiver, "busy", &[]).await;
        let body = submit(&worker, &token, &endpoint, 1).await;
        assert_eq!(body["data"]["submit"]["created"], true, "{body}");
        receiver.wait_for(1, Duration::from_secs(20)).await;
        let paused_for = crate::support::fixtures::poll(
            "the endpoint is paused",
            Duration::from_secs(10),
            || async {
                let row = pool
                    .conn()
                    .query_one_raw(Statement::from_sql_and_values(
                        DbBackend::Postgres,
                        "SELECT EXTRACT(EPOCH FROM paused_until - now())::float8 AS s \
                         FROM endpoints WHERE id = $1::uuid",
                        [endpoint.clone().into()],
                    ))
                    .await
                    .map_err(|err| err.to_string())?
                    .ok_or("no endpoint")?;
                row.try_get::<Option<f64>>("", "s")
                    .map_err(|err| err.to_string())?
                    .ok_or_else(|| "not paused".to_owned())
            },
        )
        .await;
        assert!(
            (15.0..=31.0).contains(&paused_for),
            "a worker {offset} s off paused the endpoint for {paused_for:.1} s, not about 30 s"
        );
        drop(worker);
    }
}

/// Submissions made in turn through API processes two minutes ahead and two minutes behind
/// list newest first in the order they were made: their ids carry the database's time, not
/// their hosts'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_first_listing_is_in_the_order_the_database_saw() {
    const EACH: usize = 3;
    let db = TestDb::new(Backend::Postgres).await;
    let token = admin_token(&db).await;
    let receiver = Receiver::accepting().await;
    let ahead = skewed(&db, AHEAD, &[]);
    let behind = skewed(&db, BEHIND, &[]);
    let endpoint = ahead
        .create_endpoint(&token, &receiver, "ordered", &[])
        .await;
    let mut made = Vec::new();
    for n in 0..EACH {
        for api in [&ahead, &behind] {
            let body = submit(api, &token, &endpoint, n).await;
            let id = body["data"]["submit"]["delivery"]["id"]
                .as_str()
                .unwrap_or_else(|| panic!("{body}"))
                .to_owned();
            made.push(id);
            // Well apart, beyond any error in the processes' measurements of the clock.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let listing = behind
        .graphql(
            &token,
            "query($n: Int!) { deliveries(first: $n) { edges { node { id } } } }",
            json!({ "n": 2 * EACH }),
        )
        .await;
    let listed: Vec<String> = listing["data"]["deliveries"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{listing}"))
        .iter()
        .filter_map(|edge| edge["node"]["id"].as_str().map(str::to_owned))
        .collect();
    made.reverse();
    assert_eq!(listed, made, "newest first, in the order they were made");
}
