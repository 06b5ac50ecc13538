//! Retention takes ordering lines idle past the retention with nothing open; a line with a
//! delivery still open, or touched recently, stays; a key used again starts a fresh line.

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{count, prune_expired, rows};
use crate::support::ordering::submit_keyed;
use crate::support::{Backend, TestApp, TestDb};

async fn idle_lines_are_pruned(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    for key in ["settled", "settled", "open", "recent"] {
        submit_keyed(&app, &admin, &endpoint, json!({}), Some(key)).await;
    }
    let past = courier::db::now() - chrono::Duration::days(40);
    // "settled": everything in it delivered long ago; "open": idle as long, but its delivery
    // is still pending; "recent": nothing open, but touched just now.
    rows(
        &app.state.db,
        "UPDATE webhook_deliveries SET state = 'delivered', next_attempt_at = NULL, waiting = FALSE, \
         updated_at = $1 WHERE ordering_key = 'settled'",
        vec![past.into()],
    )
    .await;
    rows(
        &app.state.db,
        "UPDATE ordering_lines SET open = 0, updated_at = $1 WHERE ordering_key = 'settled'",
        vec![past.into()],
    )
    .await;
    rows(
        &app.state.db,
        "UPDATE ordering_lines SET updated_at = $1 WHERE ordering_key = 'open'",
        vec![past.into()],
    )
    .await;
    rows(
        &app.state.db,
        "UPDATE ordering_lines SET open = 0 WHERE ordering_key = 'recent'",
        vec![],
    )
    .await;

    prune_expired(&app.state.db).await;
    let lines = rows(
        &app.state.db,
        "SELECT ordering_key FROM ordering_lines ORDER BY ordering_key",
        vec![],
    )
    .await;
    let kept: Vec<String> = lines
        .iter()
        .map(|row| row.try_get("", "ordering_key").expect("key"))
        .collect();
    assert_eq!(kept, ["open", "recent"]);

    // The key again: a fresh line, whose first delivery is its head.
    let again = submit_keyed(&app, &admin, &endpoint, json!({}), Some("settled")).await;
    assert!(!again["delivery"]["nextAttemptAt"].is_null(), "{again}");
    let numbered = count(
        &app.state.db,
        "SELECT MAX(last_seq) AS n FROM ordering_lines WHERE ordering_key = 'settled'",
        vec![],
    )
    .await;
    assert_eq!(numbered, 1);
}

on_both_backends!(idle_lines_are_pruned);
