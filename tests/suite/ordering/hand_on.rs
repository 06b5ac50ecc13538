//! A settled head's successor goes out at once: the hand-on makes it due without a state
//! change to announce it, so the recorder wakes its own worker rather than leaving the line
//! to wait for the next poll.

use std::time::Duration;

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{endpoint_on, rarely_polling_worker};
use crate::support::ordering::{
    all_settled, arrivals_by_key, id_of, obedient_receiver, states, submit_keyed,
};
use crate::support::{Backend, TestApp, TestDb};

/// A line of ten, far fewer than the endpoint's cap, to a worker that polls every ten
/// minutes: each delivery follows the one before as soon as its outcome is recorded.
async fn the_next_delivery_of_a_line_goes_out_without_waiting_for_a_poll(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let app = TestApp::spawn_with(&db, rarely_polling_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "line").await;
    let mut ids = Vec::new();
    for n in 0..10 {
        // Each request takes a moment, so most of the line is handed on after the last
        // submission (whose wake-up could otherwise carry it).
        let payload = json!({ "n": n, "delayMs": 20 });
        let submitted = submit_keyed(&app, &admin, &endpoint, payload, Some("one")).await;
        ids.push(id_of(&submitted));
    }
    all_settled(&app, &admin, &ids, Duration::from_secs(30)).await;
    assert!(
        states(&app, &admin, &ids)
            .await
            .iter()
            .all(|state| state == "DELIVERED"),
        "every delivery was delivered"
    );
    let lines = arrivals_by_key(&receiver, "line");
    assert_eq!(
        lines.get("one").cloned().unwrap_or_default(),
        (0..10).collect::<Vec<_>>(),
        "in order, once each"
    );
}

on_both_backends!(the_next_delivery_of_a_line_goes_out_without_waiting_for_a_poll);
