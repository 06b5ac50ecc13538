//! A database that stops answering, through a real cut in the network (the sockets stay
//! open, nothing moves): probes and requests answer within seconds with 503, nothing
//! accepted is lost, and the same process serves again once the database is reachable;
//! and a connection the server closed while it sat idle in the pool is replaced unnoticed.

use std::time::{Duration, Instant};

use courier::auth::Role;
use courier::db::{is_unavailable, Db, Timeouts, PING_WHEN_IDLE_FOR};
use reqwest::{Method, StatusCode};
use sea_orm::ConnectionTrait;
use serde_json::{json, Value};

use crate::support::fixtures::count;
use crate::support::fixtures::eventually;
use crate::support::fixtures::SUBMIT;
use crate::support::fixtures::{endpoint_on, quick_worker, wait_for_state};
use crate::support::gatekeeper::Gatekeeper;
use crate::support::receiver::answering_after;
use crate::support::{gql_error_code, Backend, PartitionProxy, Receiver, TestApp, TestDb};

/// The longest a request may take to give up on a silent database: the 5 s deadline plus
/// room for a loaded machine.
const GIVE_UP_WITHIN: Duration = Duration::from_millis(6_500);

/// POSTs a GraphQL request and returns the status, the `Retry-After` header and the body.
async fn post(
    app: &TestApp,
    token: &str,
    accept: &str,
    query: &str,
    variables: Value,
) -> (StatusCode, Option<u64>, Value) {
    let response = app
        .request(Method::POST, "/graphql")
        .bearer_auth(token)
        .header("accept", accept)
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .expect("answered");
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok());
    (
        status,
        retry_after,
        response.json().await.expect("a JSON body"),
    )
}

fn submit_variables(endpoint: &str, n: u64, key: &str) -> Value {
    json!({ "input": { "endpointId": endpoint, "payload": { "n": n }, "idempotencyKey": key } })
}

/// Asserts the answer of a request that could not reach the database.
fn assert_unavailable(answer: &(StatusCode, Option<u64>, Value), elapsed: Duration) {
    let (status, retry_after, body) = answer;
    assert_eq!(*status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        retry_after.is_some_and(|secs| secs >= 1),
        "a Retry-After header: {body}"
    );
    assert_eq!(gql_error_code(body), Some("SERVICE_UNAVAILABLE"), "{body}");
    assert_eq!(
        body["errors"][0]["extensions"]["retryAfter"].as_u64(),
        *retry_after,
        "{body}"
    );
    assert!(elapsed < GIVE_UP_WITHIN, "answered after {elapsed:?}");
}

/// Polls `/readyz` until it answers 200.
async fn wait_ready(app: &TestApp, within: Duration) {
    eventually("ready again", within, || async {
        let ready = app.request(Method::GET, "/readyz").send().await;
        ready.is_ok_and(|ready| ready.status() == StatusCode::OK)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_database_is_reported_fast_and_the_process_recovers() {
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn_through(&db, &proxy, |config| {
        quick_worker(config);
        // Keys used before the cut stay authenticated, so their requests reach the resolvers.
        config.auth_cache_ms = 60_000;
    })
    .await;
    let admin = app.admin_token().await;
    let unused_key = app.token(Role::Admin, &[]).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "outage").await;
    let gql = "application/graphql-response+json";
    let (status, _, accepted) = post(
        &app,
        &admin,
        gql,
        SUBMIT,
        submit_variables(&endpoint, 1, "before"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{accepted}");
    let accepted_id = accepted["data"]["submit"]["submission"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{accepted}"))
        .to_owned();
    let first_delivery = accepted["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{accepted}"))
        .to_owned();
    wait_for_state(
        &app,
        &admin,
        &first_delivery,
        "DELIVERED",
        Duration::from_secs(10),
    )
    .await;

    proxy.partition();

    let started = Instant::now();
    let ready = app
        .request(Method::GET, "/readyz")
        .send()
        .await
        .expect("answered");
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "/readyz answered after {:?}",
        started.elapsed()
    );

    // A submission, a cheap read, a request whose key must be looked up (in the other media
    // type), and liveness, all at once: each answers on its own, none waits on the others.
    let started = Instant::now();
    let submitted = async {
        let vars = submit_variables(&endpoint, 2, "during");
        let answer = post(&app, &admin, gql, SUBMIT, vars).await;
        (answer, started.elapsed())
    };
    let read = async {
        let query = "query($id: ID!) { endpoint(id: $id) { id name } }";
        let answer = post(&app, &admin, gql, query, json!({ "id": endpoint })).await;
        (answer, started.elapsed())
    };
    let looked_up = async {
        let query = "{ endpoints(first: 1) { edges { cursor } } }";
        let answer = post(&app, &unused_key, "application/json", query, json!({})).await;
        (answer, started.elapsed())
    };
    let alive = async {
        let live = app.request(Method::GET, "/healthz").send().await;
        (live.map(|live| live.status()).ok(), started.elapsed())
    };
    let (
        (submitted, submit_took),
        (read, read_took),
        (looked_up, lookup_took),
        (alive, alive_took),
    ) = tokio::join!(submitted, read, looked_up, alive);
    assert_unavailable(&submitted, submit_took);
    assert_unavailable(&read, read_took);
    assert_unavailable(&looked_up, lookup_took);
    assert_eq!(alive, Some(StatusCode::OK));
    assert!(
        alive_took < Duration::from_secs(1),
        "/healthz took {alive_took:?}"
    );

    proxy.heal();
    wait_ready(&app, Duration::from_secs(15)).await;

    // The same process serves again: the refused submission, retried with its key, is
    // accepted once, and the one accepted before the cut is still there.
    let (status, _, retried) = post(
        &app,
        &admin,
        gql,
        SUBMIT,
        submit_variables(&endpoint, 2, "during"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{retried}");
    let retried_delivery = retried["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{retried}"))
        .to_owned();
    let (status, _, found) = post(
        &app,
        &admin,
        gql,
        "query($id: ID!) { submission(id: $id) { id payload } }",
        json!({ "id": accepted_id }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{found}");
    assert_eq!(
        found["data"]["submission"]["payload"],
        json!({ "n": 1 }),
        "{found}"
    );
    // And the worker delivers again.
    wait_for_state(
        &app,
        &admin,
        &retried_delivery,
        "DELIVERED",
        Duration::from_secs(20),
    )
    .await;
    let received = receiver.received();
    assert!(
        received
            .iter()
            .any(|r| r.body == json!({ "n": 2 }) && r.verified),
        "{received:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_lost_mid_statement_are_replaced() {
    lost_connections_are_replaced("disable").await;
}

/// Over TLS too: closing a silent TLS connection used to wait for the peer (sqlx-core 0.9.0
/// flushed by reading), so every lost connection kept its slot until TCP gave up, and a
/// process whose old connections went silent while new ones got through (a failover)
/// answered 503 all that time. (The server must offer TLS: `sslmode=require`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connections_lost_mid_statement_are_replaced() {
    lost_connections_are_replaced("require").await;
}

/// Every connection of a pool (over `sslmode`) is running a statement when the database
/// fails over: the statements end unavailable, and the pool opens new connections.
async fn lost_connections_are_replaced(sslmode: &str) {
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    let mut url = url::Url::parse(&proxy.url_for(&db.url)).unwrap();
    url.query_pairs_mut().append_pair("sslmode", sslmode);
    let app = TestApp::spawn_on(Db::connect(url.as_str(), 5).await.unwrap(), |_| {}).await;
    let pool = app.state.db.clone();
    // Start-up's warm-up holds every connection of the pool for a moment: the statements
    // below start once it is done, so that all five can run at once.
    wait_ready(&app, Duration::from_secs(15)).await;

    // Every connection of the pool (5) is running a statement when the database goes away.
    let statements: Vec<_> = (0..5)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.within_deadline(pool.conn().execute_unprepared("SELECT pg_sleep(3)"))
                    .await
            })
        })
        .collect();
    let observer = db.connect(1).await;
    let probe = &observer;
    eventually("all five statements run", Duration::from_secs(10), || async {
        count(
            probe,
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND query = 'SELECT pg_sleep(3)' AND state = 'active'",
            vec![],
        )
        .await
            == 5
    })
    .await;
    observer.close().await.expect("close");

    // The old connections never answer again, and are never closed; new ones get through.
    proxy.fail_over();
    for statement in statements {
        let err = statement
            .await
            .expect("the task ran")
            .expect_err("no answer from a lost connection");
        assert!(is_unavailable(&err), "{err}");
    }
    // The abandoned connections must not hold the pool: it opens new ones.
    wait_ready(&app, Duration::from_secs(15)).await;
    let admin = app.admin_token().await;
    let body = app
        .graphql(
            &admin,
            "{ endpoints(first: 1) { edges { cursor } } }",
            json!({}),
        )
        .await;
    assert!(body["errors"].is_null(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_deadline_holds_when_the_pool_would_wait_longer() {
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    let timeouts = Timeouts {
        acquire: Duration::from_secs(30),
        work: Duration::from_secs(2),
    };
    let pool = Db::connect_with(&proxy.url_for(&db.url), 5, timeouts)
        .await
        .unwrap();
    let app = TestApp::spawn_on(pool, |config| config.auth_cache_ms = 60_000).await;
    let admin = app.admin_token().await;
    let query = "{ endpoints(first: 1) { edges { cursor } } }";
    let gql = "application/graphql-response+json";
    let (status, _, body) = post(&app, &admin, gql, query, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    proxy.partition();
    let started = Instant::now();
    let answer = post(&app, &admin, gql, query, json!({})).await;
    let elapsed = started.elapsed();
    assert_unavailable(&answer, elapsed);
    assert!(
        elapsed < Duration::from_secs(4),
        "answered after {elapsed:?}"
    );

    proxy.heal();
    let (status, _, body) = post(&app, &admin, gql, query, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A connection is pinged when it is taken from the pool only after sitting idle for
/// `PING_WHEN_IDLE_FOR`; one the server closed while it sat there longer is replaced
/// without its next user seeing an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_server_closed_while_idle_is_replaced_unnoticed() {
    let db = TestDb::new(Backend::Postgres).await;
    let pool = Db::connect(&db.url, 1).await.unwrap();
    let backend = "SELECT pg_backend_pid()::int8 AS n";
    let first = count(&pool, backend, vec![]).await;
    let killer = db.connect(1).await;
    let terminated = count(
        &killer,
        "SELECT count(*) AS n FROM (SELECT pg_terminate_backend($1::int) AS done) t WHERE done",
        vec![first.into()],
    )
    .await;
    assert_eq!(terminated, 1, "the pool's one connection was terminated");
    tokio::time::sleep(PING_WHEN_IDLE_FOR + Duration::from_millis(500)).await;
    // A failed statement panics here: the next user must get a fresh connection.
    let second = count(&pool, backend, vec![]).await;
    assert_ne!(first, second);
}

/// A database that refuses new connections (as one restarting or failing over does, here
/// with `ALLOW_CONNECTIONS false` and every connection of the process terminated) is
/// unavailable, not an internal error: `503` with `Retry-After` for an API key that must be
/// looked up and for one already known, every time; the outcome of a request that ends
/// meanwhile waits to be recorded rather than being given up (and the webhook sent again
/// after its lease); and the process serves again once connections are allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_refusing_connections_is_unavailable_until_it_accepts_them() {
    let db = TestDb::new(Backend::Postgres).await;
    let slow = Receiver::start(answering_after(Duration::from_millis(1_500))).await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.auth_cache_ms = 60_000;
    })
    .await;
    let admin = app.admin_token().await;
    let unused_key = app.token(Role::Admin, &[]).await;
    let endpoint = endpoint_on(&app, &admin, &slow, "slow").await;
    let gql = "application/graphql-response+json";
    let (status, _, in_flight) = post(
        &app,
        &admin,
        gql,
        SUBMIT,
        submit_variables(&endpoint, 0, "in-flight"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{in_flight}");
    eventually(
        "the webhook is in flight",
        Duration::from_secs(5),
        || async { slow.in_flight("slow") == 1 },
    )
    .await;
    let gatekeeper = Gatekeeper::of(&db).await;
    gatekeeper.refuse().await;

    for n in 0..3 {
        let started = Instant::now();
        let unknown = post(&app, &unused_key, gql, "{ __typename }", json!({})).await;
        assert_unavailable(&unknown, started.elapsed());
        let started = Instant::now();
        let submitted = post(
            &app,
            &admin,
            gql,
            SUBMIT,
            submit_variables(&endpoint, n, &format!("refused-{n}")),
        )
        .await;
        assert_unavailable(&submitted, started.elapsed());
    }
    // Its metrics tell it.
    eventually(
        "the database scraped as out of reach",
        Duration::from_secs(5),
        || async { app.scraped("courier_database_reachable").await == Some(0) },
    )
    .await;

    // The webhook's answer comes while connections are refused; its outcome waits.
    eventually(
        "the webhook is answered",
        Duration::from_secs(5),
        || async { slow.in_flight("slow") == 0 },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    gatekeeper.allow().await;
    wait_ready(&app, Duration::from_secs(10)).await;
    eventually(
        "the database scraped as reached",
        Duration::from_secs(5),
        || async { app.scraped("courier_database_reachable").await == Some(1) },
    )
    .await;
    let delivery = in_flight["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{in_flight}"));
    let delivered =
        wait_for_state(&app, &admin, delivery, "DELIVERED", Duration::from_secs(10)).await;
    assert_eq!(
        delivered["attempts"].as_array().map(Vec::len),
        Some(1),
        "the one attempt is recorded: {delivered}"
    );
    assert_eq!(slow.received().len(), 1, "the webhook was sent once");
    let (status, _, body) = post(
        &app,
        &admin,
        gql,
        SUBMIT,
        submit_variables(&endpoint, 9, "allowed"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["submit"]["created"], true, "{body}");
    app.stop().await;
}

/// A `LISTEN` session lost to a silent network holds its connection on its way out (its
/// `UNLISTEN` waits for an answer that never comes), and however many are lost so, the
/// next session connects: each has a pool of its own. (With one pool of two shared by
/// every session, a process's listener could not connect again after two such losses, and
/// every subscription on it ended at once as lagged.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_sessions_lost_to_a_silent_network_do_not_block_the_next() {
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    let timeouts = Timeouts {
        acquire: Duration::from_secs(2),
        work: Duration::from_secs(5),
    };
    let app_db = Db::connect_with(&proxy.url_for(&db.url), 2, timeouts)
        .await
        .unwrap();
    for lost in 0..3 {
        let pool = app_db.new_listen_pool().expect("a pool on PostgreSQL");
        let connecting = sqlx::postgres::PgListener::connect_with(&pool);
        let mut listener = tokio::time::timeout(Duration::from_secs(10), connecting)
            .await
            .unwrap_or_else(|_| panic!("connected in time after {lost} sessions were lost"))
            .unwrap_or_else(|err| panic!("connected after {lost} sessions were lost: {err}"));
        listener.listen("courier_test").await.expect("LISTEN");
        // This session's connection never answers again; dropped, it says `UNLISTEN`.
        proxy.fail_over();
        drop(listener);
    }
}
