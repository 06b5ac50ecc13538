//! The feed's read racing live events: what changes while the read is on its way (a
//! delivery created, one replayed) wins over the read's older answer, so the feed ends with
//! every delivery, each in its current state.

use std::sync::atomic::Ordering;

use serde_json::json;

use crate::support::console::{row_in_state, WAIT};
use crate::support::fixtures::{delivery_id, endpoint_on, failing_at_once, submit, wait_for_state};
use crate::support::{Backend, Receiver, Reply, TestApp, TestBrowser, TestDb};

/// Holds every answer to the feed's read (`query Feed`) until `window.__releaseFeed()`:
/// the server has answered, so the answer is as old as the moment it was read.
const HOLD_FEED_READS: &str = r#"
window.__held = [];
window.__hold = true;
const realFetch = window.fetch.bind(window);
window.fetch = async (url, init) => {
  const response = await realFetch(url, init);
  if (window.__hold && init && typeof init.body === "string" && init.body.includes("query Feed")) {
    await new Promise((resolve) => window.__held.push(resolve));
  }
  return response;
};
window.__releaseFeed = () => {
  window.__hold = false;
  window.__held.splice(0).forEach((resolve) => resolve());
  return true;
};
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_during_the_feeds_read_win_over_its_answer() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, failing_at_once).await;
    let admin = app.admin_token().await;
    let (receiver, healthy) = Receiver::switchable(500, || Reply::status(200)).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "raced").await;
    let failed = delivery_id(&submit(&app, &admin, &endpoint, json!({ "n": 0 }), None).await);
    wait_for_state(&app, &admin, &failed, "FAILED", WAIT).await;
    healthy.store(true, Ordering::SeqCst);
    let delivered = delivery_id(&submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await);
    wait_for_state(&app, &admin, &delivered, "DELIVERED", WAIT).await;

    let browser = TestBrowser::launch().await;
    let page = browser
        .open_with(&app.url(&format!("/#token={admin}")), HOLD_FEED_READS)
        .await;
    page.wait_for(
        "window.__held.length > 0",
        "the feed's read, answered and held",
        WAIT,
    )
    .await;
    // While its answer is held: the failed one is replayed and delivered, three more are
    // created and delivered.
    let replayed = app
        .graphql(
            &admin,
            "mutation($id: ID!) { replayDelivery(id: $id) { id } }",
            json!({ "id": failed }),
        )
        .await;
    assert!(replayed["errors"].is_null(), "{replayed}");
    let mut ids = vec![delivered, failed.clone()];
    for n in 2..5 {
        ids.push(delivery_id(
            &submit(&app, &admin, &endpoint, json!({ "n": n }), None).await,
        ));
    }
    for id in &ids {
        wait_for_state(&app, &admin, id, "DELIVERED", WAIT).await;
    }
    page.wait_for(
        "document.getElementById('chart-summary').textContent.includes(' 4 delivered')",
        "the page to have heard the four deliveries",
        WAIT,
    )
    .await;

    page.eval::<bool>("window.__releaseFeed()").await;
    for id in &ids {
        page.wait_for(
            &row_in_state(id, "DELIVERED"),
            "every delivery in the feed, delivered",
            WAIT,
        )
        .await;
    }
    let shown: usize = page
        .eval("document.querySelectorAll('#feed [data-delivery-id]').length")
        .await;
    assert_eq!(shown, 5, "each delivery once");
    browser.close().await;
}
