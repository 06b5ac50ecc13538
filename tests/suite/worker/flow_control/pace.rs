//! A turn a claim sets ahead is taken when it comes, not at the worker's next poll: an
//! endpoint limited to ten requests a second gets ten a second, and a retry goes out when
//! its backoff ends, with the worker polling once a minute. The receiver's clock decides.

use std::time::Duration;

use courier::config::ServeArgs;
use serde_json::json;

use super::{each_once, endpoint_with, most_in_any_window, submit_many, RATE_WINDOW};
use crate::on_both_backends;
use crate::support::fixtures::quick_worker;
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// A quick worker that polls once a minute: anything these tests see sooner was woken.
fn polling_once_a_minute(config: &mut ServeArgs) {
    quick_worker(config);
    config.poll_interval_ms = 60_000;
}

/// Twenty deliveries to an endpoint limited to ten a second arrive within seconds (at the
/// polling pace, one a minute, they would take twenty minutes), never more than ten in any
/// second, each once.
async fn a_rate_limited_endpoint_is_served_at_its_rate(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, polling_once_a_minute).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_with(
        &app,
        &admin,
        &receiver,
        "limited",
        json!({ "rateLimit": 10 }),
    )
    .await;
    submit_many(&app, &admin, &endpoint, 20).await;
    let received = receiver.wait_for(20, Duration::from_secs(30)).await;
    let arrivals: Vec<_> = received.iter().map(|r| r.at).collect();
    let most = most_in_any_window(&arrivals, RATE_WINDOW);
    assert!(most <= 10, "{most} requests started within {RATE_WINDOW:?}");
    each_once(&receiver, "limited", 20);
}

/// A delivery whose first attempt fails is attempted again when its backoff (tens of
/// milliseconds here) ends, not at the worker's next poll a minute later.
async fn a_retry_goes_out_when_its_backoff_ends(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(|nth| Reply::status(if nth == 1 { 500 } else { 204 })).await;
    let app = TestApp::spawn_with(&db, polling_once_a_minute).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_with(&app, &admin, &receiver, "flaky", json!({})).await;
    submit_many(&app, &admin, &endpoint, 3).await;
    let received = receiver.wait_for(6, Duration::from_secs(30)).await;
    for webhook in &received {
        let attempts = received
            .iter()
            .filter(|r| r.webhook_id == webhook.webhook_id)
            .count();
        assert_eq!(attempts, 2, "each webhook failed once, then arrived");
    }
}

on_both_backends!(
    a_rate_limited_endpoint_is_served_at_its_rate,
    a_retry_goes_out_when_its_backoff_ends
);
