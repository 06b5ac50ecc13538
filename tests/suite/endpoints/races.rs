//! Race 6: concurrent endpoint updates are serialised by a row lock, and each caller gets exactly what it stored.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
use serde_json::json;
use tokio::sync::Barrier;

use crate::on_every_backend;
use crate::support::fixtures::stored_secret;
use crate::support::{Backend, TestApp, TestDb};

const RACERS: usize = 8;

const UPDATE_URL: &str =
    "mutation($id: ID!, $url: String!) { updateEndpoint(id: $id, input: {url: $url}) { endpoint { url } secret } }";

/// Eight URL changes, split over two app instances (two independent pools), released at once.
async fn concurrent_url_changes_each_get_what_they_stored(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = [TestApp::spawn(&db).await, TestApp::spawn(&db).await];
    let admin = apps[0].admin_token().await;
    let (id, _) = apps[0]
        .create_endpoint(&admin, "https://example.com/start")
        .await;

    let barrier = Arc::new(Barrier::new(RACERS));
    let racers = (0..RACERS).map(|i| {
        let (app, barrier, admin, id) = (&apps[i % 2], barrier.clone(), admin.clone(), id.clone());
        async move {
            let url = format!("https://example.com/racer-{i}");
            barrier.wait().await;
            let body = app
                .graphql(&admin, UPDATE_URL, json!({ "id": id, "url": url }))
                .await;
            (url, body)
        }
    });
    let answers = futures_util::future::join_all(racers).await;

    let mut secrets = Vec::new();
    for (url, body) in &answers {
        assert!(
            body.get("errors").is_none(),
            "every caller gets an answer: {body}"
        );
        let result = &body["data"]["updateEndpoint"];
        assert_eq!(
            result["endpoint"]["url"],
            url.as_str(),
            "each caller gets back what it stored"
        );
        let secret = result["secret"]
            .as_str()
            .expect("a URL change mints a secret")
            .to_owned();
        secrets.push((url.clone(), secret));
    }
    let distinct: std::collections::HashSet<_> = secrets.iter().map(|(_, s)| s).collect();
    assert_eq!(distinct.len(), RACERS, "every change minted its own secret");

    let read = apps[1]
        .graphql(
            &admin,
            "query($id: ID!) { endpoint(id: $id) { url } }",
            json!({ "id": id }),
        )
        .await;
    let final_url = read["data"]["endpoint"]["url"]
        .as_str()
        .expect("url")
        .to_owned();
    let final_secret = stored_secret(&apps[1], &id).await;
    let (_, winner_secret) = secrets
        .iter()
        .find(|(url, _)| *url == final_url)
        .expect("the stored URL was set by one of the callers");
    assert_eq!(
        *winner_secret, final_secret,
        "the stored URL has exactly the secret its caller was given"
    );
}

on_every_backend!(concurrent_url_changes_each_get_what_they_stored);

/// An update waits for a row lock held by another connection, then proceeds: the lock is real.
async fn update_waits_for_a_row_lock_held_elsewhere(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (id, _) = app
        .create_endpoint(&admin, "https://example.com/start")
        .await;

    let holder = db.connect(1).await;
    let txn = holder.conn().begin().await.expect("begin");
    txn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT id FROM endpoints WHERE id = $1 FOR UPDATE",
        [uuid::Uuid::parse_str(&id).expect("uuid").into()],
    ))
    .await
    .expect("lock the row");

    let update = app.graphql(
        &admin,
        UPDATE_URL,
        json!({ "id": id, "url": "https://example.com/after-lock" }),
    );
    tokio::pin!(update);
    let blocked = tokio::time::timeout(Duration::from_millis(500), &mut update).await;
    assert!(
        blocked.is_err(),
        "the update must wait while another connection holds the row lock"
    );

    txn.commit().await.expect("release the lock");
    let body = tokio::time::timeout(Duration::from_secs(10), update)
        .await
        .expect("the update proceeds once the lock is released");
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"]["url"], "https://example.com/after-lock",
        "{body}"
    );
}

crate::on_postgres!(update_waits_for_a_row_lock_held_elsewhere,);
