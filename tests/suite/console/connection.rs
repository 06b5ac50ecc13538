//! The live feed's connection: one that dies without closing (the network gone, a laptop
//! asleep: the socket stays open and nothing moves) is noticed, shown, replaced, and what
//! happened meanwhile is caught up.

use std::time::Duration;

use serde_json::json;

use crate::support::console::{row_in_state, wait_live, WAIT};
use crate::support::fixtures::{delivery_id, endpoint_on, quick_worker, submit};
use crate::support::{Backend, PartitionProxy, Receiver, TestApp, TestBrowser, TestDb};

/// The console pings a quiet connection and replaces one that answers nothing for 20 s:
/// within half a minute of the network going silent the page says it is reconnecting
/// rather than live, and once bytes flow again it is live with what it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_whose_connection_goes_silent_reconnects_and_catches_up() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "silent").await;
    let proxy = PartitionProxy::start(&app.base_url).await;
    let through_proxy = proxy.url_for(&app.base_url);

    let browser = TestBrowser::launch().await;
    let page = browser
        .open(&format!(
            "{}#token={admin}",
            through_proxy.trim_end_matches('/')
        ))
        .await;
    wait_live(&page).await;

    proxy.partition();
    let missed =
        delivery_id(&submit(&app, &admin, &endpoint, json!({ "missed": true }), None).await);
    page.wait_for(
        "document.getElementById('connection').dataset.status === 'reconnecting'",
        "the page to give up the silent connection",
        Duration::from_secs(45),
    )
    .await;

    proxy.heal();
    wait_live(&page).await;
    page.wait_for(
        &row_in_state(&missed, "DELIVERED"),
        "the delivery made while the network was silent",
        WAIT,
    )
    .await;
    browser.close().await;
}
