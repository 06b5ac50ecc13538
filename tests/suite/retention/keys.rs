//! Retention takes API keys expired longer ago than `COURIER_RETENTION_DAYS`: every portal
//! link leaves one behind, refused from its expiry, listed a while, then gone. Keys that
//! never expire stay, and the others go even when another kind of history cannot.

use std::time::Duration;

use courier::db::{Db, Timeouts};
use courier::worker::retention::{prune, EventSweep};
use sea_orm::{ConnectionTrait as _, TransactionTrait as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::on_both_backends;
use crate::support::fixtures::{count, prune_expired, rows};
use crate::support::tenants::create_tenant;
use crate::support::{Backend, TestApp, TestDb};

/// A portal link for `tenant`, valid a minute: it leaves a key that expires.
async fn portal_link(app: &TestApp, admin: &str, tenant: &str) {
    let link = app
        .graphql(
            admin,
            "mutation($t: ID!) { createPortalLink(tenantId: $t, ttlSeconds: 60) { url } }",
            json!({ "t": tenant }),
        )
        .await;
    assert!(link["errors"].is_null(), "{link}");
}

async fn keys_expired_past_the_retention_are_pruned(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let tenant = create_tenant(&app, &admin, "acme").await;
    for _ in 0..2 {
        portal_link(&app, &admin, &tenant).await;
    }
    let keys = |sql: &'static str| {
        let db = app.state.db.clone();
        async move { count(&db, sql, vec![]).await }
    };
    // The admin's key and the two links'.
    assert_eq!(keys("SELECT COUNT(*) AS n FROM api_keys").await, 3);
    // One link expired forty days ago, the other a minute from now.
    let past = courier::db::now() - chrono::Duration::days(40);
    rows(
        &app.state.db,
        "UPDATE api_keys SET expires_at = $1 WHERE id = \
         (SELECT id FROM api_keys WHERE expires_at IS NOT NULL ORDER BY id LIMIT 1)",
        vec![past.into()],
    )
    .await;
    prune_expired(&app.state.db).await;
    assert_eq!(
        keys("SELECT COUNT(*) AS n FROM api_keys WHERE expires_at IS NOT NULL").await,
        1,
        "the link expired forty days ago went, the other stays"
    );
    assert_eq!(
        keys("SELECT COUNT(*) AS n FROM api_keys WHERE expires_at IS NULL").await,
        1,
        "a key that never expires stays"
    );
    let listed = app
        .graphql(&admin, "{ apiKeys { edges { node { id } } } }", json!({}))
        .await;
    assert_eq!(
        listed["data"]["apiKeys"]["edges"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
}

/// Events that cannot be pruned (their table locked by another session past the prune's
/// deadline) leave the expired keys to be pruned all the same, and the run reports the
/// failure. Before, the failure ended the run there: keys and idle ordering lines were
/// left to grow for as long as events kept failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_pruned_when_events_cannot_be() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let tenant = create_tenant(&app, &admin, "acme").await;
    portal_link(&app, &admin, &tenant).await;
    let past = courier::db::now() - chrono::Duration::days(40);
    rows(
        &app.state.db,
        "UPDATE api_keys SET expires_at = $1 WHERE expires_at IS NOT NULL",
        vec![past.into()],
    )
    .await;
    let pruner = Db::connect_with(
        &db.url,
        2,
        Timeouts {
            work: Duration::from_millis(1_000),
            ..Timeouts::default()
        },
    )
    .await
    .expect("a pool with a short deadline");
    let holder = db.connect(1).await;
    let lock = holder.conn().begin().await.expect("begin");
    lock.execute_unprepared("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock events");
    let pruned = prune(
        &pruner,
        30,
        &EventSweep::default(),
        &CancellationToken::new(),
    )
    .await;
    lock.rollback().await.expect("unlocked");
    assert!(pruned.is_err(), "the events' failure is reported");
    assert_eq!(
        count(
            &app.state.db,
            "SELECT COUNT(*) AS n FROM api_keys WHERE expires_at IS NOT NULL",
            vec![]
        )
        .await,
        0,
        "the expired key went all the same"
    );
}

on_both_backends!(keys_expired_past_the_retention_are_pruned);
