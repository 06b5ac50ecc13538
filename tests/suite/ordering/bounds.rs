//! Where a hand-off starts looking: each line keeps the number below which nothing waits
//! (`waiting_from`), so a hand-off seeks to the next delivery instead of walking past every
//! one the line has settled. The bound must never pass a delivery that waits, even when a
//! replayed delivery brings back a number from before its line was pruned and numbered
//! afresh. On both backends.

use std::time::Duration;

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{endpoint_on, eventually, prune_expired, rows};
use crate::support::ordering::{
    all_settled, arrivals_by_key, id_of, obedient_receiver, read, replay, single_attempt_worker,
    states, submit_keyed,
};
use crate::support::{Backend, TestApp, TestDb};

/// A line of five, its last one failed; the line idles and is pruned, then the key is used
/// again (a fresh line, numbered from 1). The old failed delivery, replayed while the new
/// head is in flight, waits with its old number 5, above anything the fresh line gave out;
/// it goes next, and a delivery submitted while it is in flight (number 3) still follows it.
async fn a_replay_from_before_a_prune_keeps_the_line_moving(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let app = TestApp::spawn_with(&db, single_attempt_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "renumbered").await;
    let key = Some("account-5");
    let mut old = Vec::new();
    for n in 0..4 {
        old.push(id_of(
            &submit_keyed(&app, &admin, &endpoint, json!({ "n": n }), key).await,
        ));
    }
    let failed = id_of(
        &submit_keyed(
            &app,
            &admin,
            &endpoint,
            json!({ "n": 4, "failFirst": 1, "delayMs": 1000 }),
            key,
        )
        .await,
    );
    old.push(failed.clone());
    all_settled(&app, &admin, &old, Duration::from_secs(20)).await;
    assert_eq!(read(&app, &admin, &failed).await["state"], "FAILED");

    // The line idles past the retention and is pruned.
    let past = courier::db::now() - chrono::Duration::days(40);
    rows(
        &app.state.db,
        "UPDATE ordering_lines SET updated_at = $1",
        vec![past.into()],
    )
    .await;
    prune_expired(&app.state.db).await;
    let lines = rows(&app.state.db, "SELECT last_seq FROM ordering_lines", vec![]).await;
    assert!(lines.is_empty(), "the idle line was pruned");

    // A fresh line: its head is number 1, in flight for a while.
    let fresh = id_of(
        &submit_keyed(
            &app,
            &admin,
            &endpoint,
            json!({ "n": 10, "delayMs": 1000 }),
            key,
        )
        .await,
    );
    eventually(
        "the fresh head is in flight",
        Duration::from_secs(10),
        || async { receiver.in_flight("renumbered") == 1 },
    )
    .await;
    replay(&app, &admin, &failed).await;
    assert_eq!(
        read(&app, &admin, &failed).await["waitingBehind"]["id"],
        fresh.as_str()
    );
    // The replayed one becomes the head once the fresh one is delivered; while it is in
    // flight, the next submission waits behind it.
    eventually(
        "the replayed delivery is in flight",
        Duration::from_secs(10),
        || async {
            read(&app, &admin, &failed).await["state"] == "PROCESSING"
                && receiver.in_flight("renumbered") == 1
        },
    )
    .await;
    let last = id_of(&submit_keyed(&app, &admin, &endpoint, json!({ "n": 11 }), key).await);
    assert_eq!(
        read(&app, &admin, &last).await["waitingBehind"]["id"],
        failed.as_str()
    );
    let ids = [fresh, failed, last];
    all_settled(&app, &admin, &ids, Duration::from_secs(20)).await;
    assert_eq!(
        states(&app, &admin, &ids).await,
        ["DELIVERED", "DELIVERED", "DELIVERED"]
    );
    assert_eq!(
        arrivals_by_key(&receiver, "renumbered")["account-5"],
        [0, 1, 2, 3, 4, 10, 4, 11]
    );
    // Emptied, the line's bound is past every number it gave out.
    let line = rows(
        &app.state.db,
        "SELECT last_seq, waiting_from, open FROM ordering_lines",
        vec![],
    )
    .await;
    assert_eq!(line.len(), 1);
    let last_seq: i64 = line[0].try_get("", "last_seq").expect("last_seq");
    let waiting_from: Option<i64> = line[0].try_get("", "waiting_from").expect("bound");
    let open: i32 = line[0].try_get("", "open").expect("open");
    assert_eq!((open, waiting_from), (0, Some(last_seq + 1)));
}

on_both_backends!(a_replay_from_before_a_prune_keeps_the_line_moving);
