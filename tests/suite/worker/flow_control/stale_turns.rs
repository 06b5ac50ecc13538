//! Turns left ready with nothing due (as outcomes and settings changes leave them, for a
//! claim to put to sleep) do not hold up the endpoints behind them until the next poll: a
//! claim that took nothing but put endpoints to sleep claims again at once.

use std::time::Duration;

use courier::config::ServeArgs;
use serde_json::json;

use super::{each_once, endpoint_with, submit_many};
use crate::support::fixtures::{count, eventually, rarely_polling_worker};
use crate::support::operational::update_endpoint;
use crate::support::{Backend, Receiver, TestApp, TestDb};

/// How many endpoints' turns are ready now.
async fn ready_turns(app: &TestApp) -> i64 {
    let sql = "SELECT COUNT(*) AS n FROM endpoint_flow WHERE turn_at <= now()";
    count(&app.state.db, sql, Vec::new()).await
}

/// A hundred endpoints whose settings changed are looked at afresh (their turns ready with
/// nothing due), ahead of an endpoint created after them. A worker that polls only every
/// ten minutes, starting with that endpoint's delivery due, gets to it at once: four
/// claims' worth of turns to put to sleep first is no reason to wait for the poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn turns_left_ready_with_nothing_due_do_not_wait_for_the_poll() {
    let db = TestDb::new(Backend::Postgres).await;
    let fast = Receiver::accepting().await;
    let api = TestApp::spawn_with(&db, |config: &mut ServeArgs| {
        config.worker_concurrency = 0;
    })
    .await;
    let admin = api.admin_token().await;
    for n in 0..100 {
        let endpoint = endpoint_with(&api, &admin, &fast, &format!("old-{n}"), json!({})).await;
        update_endpoint(&api, &admin, &endpoint, json!({ "maxInFlight": 4 })).await;
    }
    let late = endpoint_with(&api, &admin, &fast, "late", json!({})).await;
    submit_many(&api, &admin, &late, 1).await;
    let stale = ready_turns(&api).await;
    assert!(
        stale > 64,
        "more ready turns than two claims look at: {stale}"
    );

    let worker = TestApp::spawn_with(&db, |config: &mut ServeArgs| {
        rarely_polling_worker(config);
        config.claim_at_submit = false;
    })
    .await;
    eventually(
        "the late endpoint's delivery arrives long before the poll",
        Duration::from_secs(3),
        || async { fast.received().iter().any(|r| r.path == "late") },
    )
    .await;
    each_once(&fast, "late", 1);
    worker.stop().await;
    api.stop().await;
}
