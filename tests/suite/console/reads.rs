//! The feed's reads racing live events: what changes while the read is on its way (a
//! delivery created, one replayed) wins over the read's older answer, so the feed ends with
//! every delivery, each in its current state; and older deliveries read while new ones
//! overflow the feed go below it without a gap.

use std::sync::atomic::Ordering;

use serde_json::json;

use crate::support::console::{row_in_state, WAIT};
use crate::support::fixtures::{
    delivery_id, endpoint_on, failing_at_once, quick_worker, submit, wait_for_state,
};
use crate::support::{Backend, Receiver, Reply, TestApp, TestBrowser, TestDb};

/// Holds every answer to the feed's read (`query Feed`) until `window.__releaseFeed()`:
/// the server has answered, so the answer is as old as the moment it was read. With
/// `window.__holdAfter` set, only a read going on from that cursor is held.
const HOLD_FEED_READS: &str = r#"
window.__held = [];
window.__hold = !location.search.includes("unheld");
const realFetch = window.fetch.bind(window);
window.fetch = async (url, init) => {
  const response = await realFetch(url, init);
  const body = init && typeof init.body === "string" ? init.body : "";
  const held = body.includes("query Feed")
    && (!window.__holdAfter || body.includes(window.__holdAfter));
  if (window.__hold && held) {
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

/// The ids and cursors of the newest `n` deliveries, as the API lists them.
async fn newest(app: &TestApp, admin: &str, n: usize) -> Vec<(String, String)> {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    while ids.len() < n {
        let page = app
            .graphql(
                admin,
                "query($after: String) { deliveries(first: 100, after: $after) { edges { cursor node { id } } } }",
                json!({ "after": after }),
            )
            .await;
        let edges = page["data"]["deliveries"]["edges"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if edges.is_empty() {
            break;
        }
        for edge in &edges {
            ids.push((
                edge["node"]["id"].as_str().expect("an id").to_owned(),
                edge["cursor"].as_str().expect("a cursor").to_owned(),
            ));
        }
        after = edges
            .last()
            .and_then(|e| e["cursor"].as_str())
            .map(str::to_owned);
    }
    ids.truncate(n);
    ids
}

/// "Show older" while more deliveries arrive than the feed keeps (so its rows all came
/// live, without a cursor, and the bottom would move while the read is on its way): the
/// older ones go below without a gap, and the feed is the API's listing from the top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_deliveries_go_below_without_a_gap_while_the_feed_overflows() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "flood").await;
    for n in 0..10 {
        submit(&app, &admin, &endpoint, json!({ "n": n }), None).await;
    }
    let browser = TestBrowser::launch().await;
    let page = browser
        .open_with(
            &app.url(&format!("/?unheld#token={admin}")),
            HOLD_FEED_READS,
        )
        .await;
    crate::support::console::wait_live(&page).await;
    let rows = "document.querySelectorAll('#feed [data-delivery-id]').length";
    page.wait_for(&format!("{rows} === 10"), "the first ten", WAIT)
        .await;
    // 210 more, heard live: the feed keeps 200, none with a cursor.
    for n in 10..220 {
        submit(&app, &admin, &endpoint, json!({ "n": n }), None).await;
    }
    page.wait_for(
        &format!("{rows} === 200 && !document.getElementById('feed-older').hidden"),
        "a full feed, with older ones to show",
        WAIT,
    )
    .await;
    // Without cursors, the read starts from the top, passes the pages shown, and reads on
    // from the feed's bottom: that read is held.
    let shown_then = newest(&app, &admin, 200).await;
    page.eval::<bool>(&format!(
        "(window.__holdAfter = {:?}, window.__hold = true)",
        shown_then[199].1
    ))
    .await;
    page.click("#feed-older").await;
    page.wait_for(
        "window.__held.length > 0",
        "the read below the bottom, held",
        WAIT,
    )
    .await;
    // 60 more while it is held: without care, they would push the bottom up, and what it
    // read would go below a gap.
    for n in 220..280 {
        submit(&app, &admin, &endpoint, json!({ "n": n }), None).await;
    }
    let api: Vec<String> = newest(&app, &admin, 280)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    page.wait_for(
        &format!(
            "document.querySelector('[data-delivery-id=\"{}\"]') !== null",
            api[0]
        ),
        "the newest delivery heard",
        WAIT,
    )
    .await;
    page.eval::<bool>("window.__releaseFeed()").await;
    page.wait_for(
        "!document.getElementById('feed-older').disabled",
        "the older read done",
        WAIT,
    )
    .await;
    let shown: Vec<String> = page
        .eval("[...document.querySelectorAll('#feed [data-delivery-id]')].map((e) => e.dataset.deliveryId)")
        .await;
    assert!(shown.len() > 200, "older ones were added: {}", shown.len());
    assert_eq!(
        shown,
        api[..shown.len()].to_vec(),
        "the API's listing from the top, without a gap"
    );
    browser.close().await;
}
