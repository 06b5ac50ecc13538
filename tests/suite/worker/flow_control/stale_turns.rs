//! Turns left ready with nothing due (as outcomes leave them, for a claim to put to sleep)
//! do not hold up the endpoints behind them until the next poll: a claim that took nothing
//! but put endpoints to sleep claims again at once.

use std::time::Duration;

use courier::config::ServeArgs;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::json;

use super::{each_once, endpoint_with, submit_many};
use crate::support::fixtures::{eventually, publish, quick_worker, rarely_polling_worker};
use crate::support::{Backend, Receiver, TestApp, TestDb};

/// How many endpoints' turns are ready now.
async fn ready_turns(app: &TestApp) -> i64 {
    let db = &app.state.db;
    let sql = "SELECT COUNT(*) FROM endpoint_flow WHERE turn_at <= now()";
    let row = db
        .conn()
        .query_one_raw(Statement::from_string(db.backend(), sql.to_owned()))
        .await
        .expect("query")
        .expect("a row");
    row.try_get_by_index::<i64>(0).expect("a count")
}

/// A hundred endpoints that each had one delivery of a published event leave their turns
/// ready, ahead of an
/// endpoint created after them. A worker that polls only every ten minutes, woken once by
/// that endpoint's submission, gets to it at once: three claims' worth of turns to put to
/// sleep first is no reason to wait for the poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn turns_left_ready_with_nothing_due_do_not_wait_for_the_poll() {
    let db = TestDb::new(Backend::Postgres).await;
    let fast = Receiver::accepting().await;
    let first = TestApp::spawn_with(&db, quick_worker).await;
    let admin = first.admin_token().await;
    let subscribed = json!({ "eventTypes": ["order.paid"] });
    for n in 0..100 {
        endpoint_with(
            &first,
            &admin,
            &fast,
            &format!("old-{n}"),
            subscribed.clone(),
        )
        .await;
    }
    let published = publish(&first, &admin, "order.paid", json!({}), None).await;
    assert!(published["errors"].is_null(), "{published}");
    eventually(
        "the hundred deliveries arrive",
        Duration::from_secs(20),
        || async { fast.received().len() == 100 },
    )
    .await;
    first.stop().await;

    let app = TestApp::spawn_with(&db, |config: &mut ServeArgs| {
        rarely_polling_worker(config);
        // Every delivery goes through the claiming loop.
        config.claim_at_submit = false;
    })
    .await;
    let stale = ready_turns(&app).await;
    assert!(
        stale > 64,
        "the test needs more ready turns than two claims look at: {stale}"
    );
    let late = endpoint_with(&app, &admin, &fast, "late", json!({})).await;
    submit_many(&app, &admin, &late, 1).await;
    eventually(
        "the late endpoint's delivery arrives long before the poll",
        Duration::from_secs(3),
        || async { fast.received().iter().any(|r| r.path == "late") },
    )
    .await;
    each_once(&fast, "late", 1);
    app.stop().await;
}
