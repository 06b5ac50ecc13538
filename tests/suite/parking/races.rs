//! No due delivery on a disabled endpoint, ever: submissions racing a disable over two app
//! instances (two pools) leave nothing due, re-enabling delivers each exactly once, and
//! switches racing each other leave the backlog matching the endpoint.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
use serde_json::json;
use uuid::Uuid;

use crate::support::fixtures::count;
use crate::support::fixtures::created_or_refused;
use crate::support::fixtures::endpoint_on;
use crate::support::fixtures::eventually;
use crate::support::fixtures::settle;
use crate::support::fixtures::submit;
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

const SUBMISSIONS: usize = 50;

const SET_DISABLED: &str = "mutation($id: ID!, $off: Boolean!) { updateEndpoint(id: $id, input: {disabled: $off}) { endpoint { disabled } } }";

/// Backends of this database waiting on a lock.
async fn lock_waiters(probe: &courier::db::Db) -> i64 {
    let row = probe
        .conn()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT COUNT(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        ))
        .await
        .expect("pg_stat_activity")
        .expect("a row");
    row.try_get("", "n").expect("n")
}

async fn wait_for_lock_waiters(probe: &courier::db::Db, at_least: i64) {
    eventually(
        "a statement waits on the lock",
        Duration::from_secs(10),
        || async { lock_waiters(probe).await >= at_least },
    )
    .await;
}

/// The disable is held mid-transaction (it waits on a delivery row the test locks, while
/// holding the endpoint row) as fifty submissions arrive over two instances: whichever
/// way each is serialised with the disable, none leaves a due row behind it.
async fn submissions_racing_a_disable_leave_nothing_due(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(|_| Reply::status(200)).await;
    let apps = [TestApp::spawn(&db).await, TestApp::spawn(&db).await];
    let admin = apps[0].admin_token().await;
    let endpoint = endpoint_on(&apps[0], &admin, &receiver, "racing").await;
    let anchor = submit(&apps[0], &admin, &endpoint, json!({ "n": "anchor" }), None).await;
    let anchor_id: Uuid = anchor["data"]["submit"]["delivery"]["id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("anchor: {anchor}"));

    let holder = db.connect(1).await;
    let probe = db.connect(1).await;
    let lock = holder.conn().begin().await.expect("begin");
    lock.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT id FROM webhook_deliveries WHERE id = $1 FOR UPDATE",
        [anchor_id.into()],
    ))
    .await
    .expect("lock the anchor");

    let disable = apps[1].graphql(&admin, SET_DISABLED, json!({ "id": endpoint, "off": true }));
    let race = async {
        wait_for_lock_waiters(&probe, 1).await;
        let submissions = futures_util::future::join_all(
            (0..SUBMISSIONS)
                .map(|n| submit(&apps[n % 2], &admin, &endpoint, json!({ "n": n }), None)),
        );
        let release = async {
            // Let the submissions reach the endpoint's lock, then let the disable finish.
            wait_for_lock_waiters(&probe, 2).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            lock.commit().await.expect("release the anchor");
        };
        futures_util::future::join(submissions, release).await.0
    };
    let (disabled, answers) = tokio::join!(disable, race);
    assert_eq!(
        disabled["data"]["updateEndpoint"]["endpoint"]["disabled"], true,
        "{disabled}"
    );

    // The anchor, and those the disabling did not refuse as the endpoint's (`BAD_USER_INPUT`).
    let created = 1 + created_or_refused(&answers, "BAD_USER_INPUT");
    let due = probe
        .conn()
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT COUNT(*) AS n FROM webhook_deliveries \
             WHERE endpoint_id = $1 AND next_attempt_at IS NOT NULL",
            [endpoint.parse::<Uuid>().expect("uuid").into()],
        ))
        .await
        .expect("count")
        .expect("a row")
        .try_get::<i64>("", "n")
        .expect("n");
    assert_eq!(due, 0, "no due row on the disabled endpoint");

    let enabled = apps[0]
        .graphql(
            &admin,
            SET_DISABLED,
            json!({ "id": endpoint, "off": false }),
        )
        .await;
    assert_eq!(
        enabled["data"]["updateEndpoint"]["endpoint"]["disabled"], false,
        "{enabled}"
    );
    let worker = TestApp::spawn_with(&db, |config| {
        config.worker_concurrency = 8;
        config.poll_interval_ms = 100;
    })
    .await;
    receiver.wait_for(created, Duration::from_secs(30)).await;
    settle([worker]).await;
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for received in receiver.received() {
        *per_id.entry(received.webhook_id).or_default() += 1;
    }
    assert_eq!(per_id.len(), created, "every stored delivery was delivered");
    assert!(
        per_id.values().all(|&n| n == 1),
        "each delivered exactly once: {:?}",
        per_id.values().filter(|&&n| n > 1).count()
    );
}

crate::on_postgres!(submissions_racing_a_disable_leave_nothing_due);

/// Switches racing each other over two app instances (two pools): forty disables and
/// re-enables at once, then one more of each. Each conditional switch either changes the
/// row or changes nothing, so the backlog always matches the endpoint's final state, and a
/// disable's reason and time go with the flag.
async fn racing_switches_leave_the_backlog_matching_the_endpoint(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = [TestApp::spawn(&db).await, TestApp::spawn(&db).await];
    let admin = apps[0].admin_token().await;
    let (endpoint, _) = apps[0]
        .create_endpoint(&admin, "https://example.com/switched")
        .await;
    for n in 0..10 {
        let body = submit(&apps[0], &admin, &endpoint, json!({ "n": n }), None).await;
        assert!(body["errors"].is_null(), "{body}");
    }
    let switches = (0..40).map(|n| {
        let app = &apps[n % 2];
        app.graphql(
            &admin,
            SET_DISABLED,
            json!({ "id": endpoint, "off": n % 4 < 2 }),
        )
    });
    for body in futures_util::future::join_all(switches).await {
        assert!(body["errors"].is_null(), "{body}");
    }
    let id: Uuid = endpoint.parse().expect("uuid");
    let rows = |sql: &'static str| {
        let db = &apps[1].state.db;
        async move { count(db, sql, vec![id.into()]).await }
    };
    for off in [true, false] {
        let body = apps[usize::from(off)]
            .graphql(&admin, SET_DISABLED, json!({ "id": endpoint, "off": off }))
            .await;
        assert_eq!(
            body["data"]["updateEndpoint"]["endpoint"]["disabled"], off,
            "{body}"
        );
        let due = rows(
            "SELECT COUNT(*) AS n FROM webhook_deliveries \
             WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at IS NOT NULL",
        )
        .await;
        let parked = rows(
            "SELECT COUNT(*) AS n FROM webhook_deliveries \
             WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at IS NULL",
        )
        .await;
        let (want_due, want_parked) = if off { (0, 10) } else { (10, 0) };
        assert_eq!((due, parked), (want_due, want_parked), "disabled: {off}");
        let stamped = rows(
            "SELECT COUNT(*) AS n FROM endpoints \
             WHERE id = $1 AND (disabled_reason IS NOT NULL) = disabled \
               AND (disabled_at IS NOT NULL) = disabled",
        )
        .await;
        assert_eq!(stamped, 1, "the reason and time go with the disabled flag");
    }
}

crate::on_every_backend!(racing_switches_leave_the_backlog_matching_the_endpoint);
