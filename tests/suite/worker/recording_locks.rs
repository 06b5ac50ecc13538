//! Recorders in several processes settling outcomes of the same endpoints (retries, which
//! read an endpoint under the parking rule's share lock, beside failures and recoveries,
//! which write its run of failures, and keyed deliveries handing their lines on, which
//! share-lock it too) lock those endpoints in one order and never deadlock.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
use serde_json::json;

use crate::support::fixtures::{count, endpoint_on, eventually, quick_worker, settle, submit};
use crate::support::operational::{ops_endpoint, update_endpoint};
use crate::support::ordering::submit_keyed;
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// How many deliveries are `delivered` and `failed`.
async fn settled(db: &courier::db::Db) -> (i64, i64) {
    let by_state = |state: &'static str| async move {
        let sql = format!("SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = '{state}'");
        count(db, &sql, vec![]).await
    };
    (by_state("delivered").await, by_state("failed").await)
}

/// Three instances, eight endpoints shared by all: a third of the deliveries always fail
/// (three attempts, then `failed`), a third fail once and then succeed, a third succeed.
/// Every outcome is recorded at its first try, and PostgreSQL breaks no deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recorders_across_instances_lock_endpoints_in_one_order() {
    settle_across_instances(|_| None, false).await;
}

/// The same with an endpoint listening for `courier.delivery.failed`: each recording that
/// fails a delivery also fans its event out to the listener (share-locking it), while other
/// recordings settle the listener's own deliveries (handing their lines on). Before, a
/// recording holding a failing endpoint waited for the listener, held by a recording that
/// waited for that failing endpoint: PostgreSQL broke a deadlock every few failures, and
/// the retried outcomes came seconds late (some after their leases, failing deliveries
/// whose receivers had answered 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recorders_announcing_failures_lock_the_listeners_in_the_same_order() {
    settle_across_instances(|_| None, true).await;
}

/// The same with ordering keys, each key used on every endpoint: every settled head hands
/// its line on, on endpoints whose other outcomes another recorder is settling.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyed_recorders_across_instances_lock_endpoints_in_one_order() {
    settle_across_instances(|n| Some(format!("k{}", n % 10)), false).await;
}

/// A recording that waits for an endpoint row (here the share lock its
/// `courier.delivery.failed` event takes on a listening endpoint, which another session
/// holds) has written no row of the endpoints' shared counters yet: the health minutes and
/// settled counts are written last, after every endpoint lock. Written before, a recorder
/// holding the listener and adding to the same minute would wait for this one, and this one
/// for it, a deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recorder_waiting_for_an_endpoint_holds_no_shared_counter() {
    let db = TestDb::new(Backend::Postgres).await;
    // The submission (`{"n": 1}`) fails; the operational event it causes is taken.
    let receiver = Receiver::start_by_body(|body, _| {
        Reply::status(if body.get("n").is_some() { 500 } else { 200 })
    })
    .await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
    })
    .await;
    let admin = app.admin_token().await;
    let failing = endpoint_on(&app, &admin, &receiver, "failing").await;
    let listener = ops_endpoint(
        &app,
        &admin,
        &receiver,
        "listener",
        None,
        &["courier.delivery.failed"],
    )
    .await;

    let holder = db.connect(1).await;
    let probe = db.connect(1).await;
    let lock = holder.conn().begin().await.expect("begin");
    let holder_pid = lock
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT pg_backend_pid() AS pid FROM endpoints WHERE id = $1::uuid FOR NO KEY UPDATE",
            [listener.clone().into()],
        ))
        .await
        .expect("lock the listener")
        .expect("the listener")
        .try_get::<i32>("", "pid")
        .expect("pid");

    let body = submit(&app, &admin, &failing, json!({ "n": 1 }), None).await;
    assert!(body["errors"].is_null(), "{body}");
    let blocked = format!(
        "SELECT COALESCE(MAX(pid), 0)::int8 AS n FROM pg_stat_activity WHERE datname = current_database() \
         AND {holder_pid} = ANY(pg_blocking_pids(pid))"
    );
    eventually(
        "the recording waits for the listener",
        Duration::from_secs(20),
        || async { count(&probe, &blocked, vec![]).await > 0 },
    )
    .await;
    let recorder = count(&probe, &blocked, vec![]).await;
    let counters = format!(
        "SELECT COUNT(*) AS n FROM pg_locks WHERE pid = {recorder} AND relation IN \
         ('endpoint_health_minutes'::regclass, 'endpoint_settled_counts'::regclass)"
    );
    assert_eq!(
        count(&probe, &counters, vec![]).await,
        0,
        "the waiting recording has written no health minute or settled count"
    );

    lock.commit().await.expect("release the listener");
    let failed = "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'failed'";
    eventually(
        "the failure is recorded once the listener is free",
        Duration::from_secs(20),
        || async { count(&probe, failed, vec![]).await == 1 },
    )
    .await;
    let minutes = format!(
        "SELECT COALESCE(SUM(attempts), 0)::int8 AS n FROM endpoint_health_minutes \
         WHERE endpoint_id = '{failing}'"
    );
    assert_eq!(
        count(&probe, &minutes, vec![]).await,
        1,
        "the attempt counted"
    );
    settle([app]).await;
    assert_eq!(db.deadlocks().await, 0, "PostgreSQL broke no deadlock");
}

/// An operator's disable locks the endpoint and the listeners that will hear of it in one id
/// order. Here another session holds the listener (as a recording settling the listener's
/// own deliveries does) and then locks the endpoint (as that recording does next, the
/// listener's id being the lower). Before, the disable held the endpoint and then waited
/// for the listener to publish its event, and PostgreSQL broke the deadlock after a second;
/// now the disable waits for the listener before it takes the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operators_switch_locks_the_endpoint_and_its_listeners_in_one_order() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let types = &["courier.endpoint.disabled"];
    let listener = ops_endpoint(&app, &admin, &receiver, "listener", None, types).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "switched").await;

    let holder = db.connect(1).await;
    let probe = db.connect(1).await;
    let held = holder.conn().begin().await.expect("begin");
    let lock = |id: &str| {
        Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT pg_backend_pid() AS pid FROM endpoints WHERE id = $1::uuid FOR NO KEY UPDATE",
            [id.into()],
        )
    };
    let holder_pid = held
        .query_one_raw(lock(&listener))
        .await
        .expect("lock the listener")
        .expect("the listener")
        .try_get::<i32>("", "pid")
        .expect("pid");
    let blocked = format!(
        "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE datname = current_database() \
         AND {holder_pid} = ANY(pg_blocking_pids(pid))"
    );
    let disable = json!({ "disabled": true });
    let (answer, ()) = tokio::join!(update_endpoint(&app, &admin, &endpoint, disable), async {
        eventually(
            "the disable waits for the listener",
            Duration::from_secs(10),
            || async { count(&probe, &blocked, vec![]).await > 0 },
        )
        .await;
        held.query_one_raw(lock(&endpoint))
            .await
            .expect("the endpoint is not held by a disable waiting for the listener");
        held.commit().await.expect("commit");
    });
    assert_eq!(
        answer["data"]["updateEndpoint"]["endpoint"]["disabled"], true,
        "{answer}"
    );
    app.stop().await;
    holder.close().await.expect("close");
    probe.close().await.expect("close");
    // The connections have closed, so their statistics are in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(db.deadlocks().await, 0, "PostgreSQL broke no deadlock");
}

/// Submits 240 deliveries (with the ordering key `key_of` gives each) through three
/// instances to eight endpoints, settles them as described above (with an endpoint
/// `listening` for `courier.delivery.failed`, which takes every event), and checks no
/// recording was retried and no deadlock broken.
async fn settle_across_instances(key_of: fn(usize) -> Option<String>, listening: bool) {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start_by_body(|body, nth| {
        if body.get("type").is_some() {
            return Reply::status(200);
        }
        let n = body["n"].as_u64().unwrap_or(0);
        let failing = match n % 3 {
            0 => true,
            1 => nth == 1,
            _ => false,
        };
        Reply::status(if failing { 500 } else { 200 })
    })
    .await;
    let configure = |config: &mut courier::config::ServeArgs| {
        quick_worker(config);
        config.retry_base_ms = Some(20);
        config.retry_max_ms = 100;
        config.disable_after_failures = 0;
    };
    let apps = std::sync::Arc::new([
        TestApp::spawn_with(&db, configure).await,
        TestApp::spawn_with(&db, configure).await,
        TestApp::spawn_with(&db, configure).await,
    ]);
    let admin = apps[0].admin_token().await;
    let mut endpoints = Vec::new();
    // One event per failed delivery, each delivered. The listener is created first: its
    // id (a UUIDv7) comes before the others', so the order in which recordings lock the
    // endpoints' rows takes it first.
    let (announced, types) = match listening {
        true => (80, &["courier.delivery.failed"][..]),
        false => (0, &[][..]),
    };
    if listening {
        ops_endpoint(&apps[0], &admin, &receiver, "listener", None, types).await;
    }
    for n in 0..8 {
        endpoints.push(endpoint_on(&apps[0], &admin, &receiver, &format!("shared-{n}")).await);
    }
    let endpoints = std::sync::Arc::new(endpoints);
    let mut submitters = tokio::task::JoinSet::new();
    for submitter in 0..6 {
        let (apps, admin, endpoints) = (apps.clone(), admin.clone(), endpoints.clone());
        submitters.spawn(async move {
            for k in 0..40 {
                let n = submitter * 40 + k;
                let (app, endpoint) = (&apps[n % 3], &endpoints[n % endpoints.len()]);
                match key_of(n) {
                    None => {
                        let body = submit(app, &admin, endpoint, json!({ "n": n }), None).await;
                        assert!(body["errors"].is_null(), "{body}");
                    }
                    Some(key) => {
                        submit_keyed(app, &admin, endpoint, json!({ "n": n }), Some(&key)).await;
                    }
                }
            }
        });
    }
    while let Some(done) = submitters.join_next().await {
        done.expect("a submitter");
    }
    let apps = std::sync::Arc::into_inner(apps).expect("the submitters are done");
    let counts = db.connect(1).await;
    eventually(
        "every delivery settles",
        Duration::from_secs(60),
        || async { settled(&counts).await.0 + settled(&counts).await.1 == 240 + announced },
    )
    .await;
    assert_eq!(
        settled(&counts).await,
        (160 + announced, 80),
        "every delivery settled as its receiver said"
    );
    let retries: Vec<u64> = apps
        .iter()
        .map(|app| app.state.metrics.recording_retries.get())
        .collect();
    assert_eq!(
        retries,
        [0, 0, 0],
        "every batch of outcomes recorded at its first try"
    );
    settle(apps).await;
    counts.close().await.expect("close");
    // The instances' connections have closed, so their statistics are in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(db.deadlocks().await, 0, "PostgreSQL broke no deadlock");
}
