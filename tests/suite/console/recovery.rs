//! Recovery from the console: an endpoint's failed deliveries replayed in one click, a
//! test webhook sent, a delivered one sent again, and what the receiver answered shown in
//! a delivery's detail.

use std::sync::atomic::Ordering;

use serde_json::json;

use crate::support::console::{assert_only_courier, open_console, row_in_state, WAIT};
use crate::support::fixtures::{delivery_id, endpoint_on, failing_at_once, submit, wait_for_state};
use crate::support::{Backend, Receiver, Reply, ReplyBody, TestApp, TestBrowser, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_from_the_console() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, failing_at_once).await;
    let admin = app.admin_token().await;
    let (receiver, healthy) = Receiver::switchable(503, || Reply {
        headers: vec![("x-receiver", "yes".to_owned())],
        body: ReplyBody::Bytes(b"received, thank you".to_vec()),
        ..Reply::status(200)
    })
    .await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "down").await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let id = delivery_id(&submit(&app, &admin, &endpoint, json!({ "n": n }), None).await);
        wait_for_state(&app, &admin, &id, "FAILED", WAIT).await;
        ids.push(id);
    }
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    healthy.store(true, Ordering::SeqCst);

    // Every failed delivery of the endpoint, in one click, once it is chosen.
    page.click(&format!("[data-filter-endpoint=\"{endpoint}\"]"))
        .await;
    // Its last hour at a glance: three attempts, none answered 2xx.
    page.wait_for(
        "document.getElementById('endpoint-health').textContent.startsWith('Last hour: 0% of 3 attempts answered 2xx')",
        "the chosen endpoint's health",
        WAIT,
    )
    .await;
    let replay_failed = "#endpoint-actions [data-action=\"replay-failed\"]";
    page.wait_for(
        &format!(
            "document.querySelector('{replay_failed}')?.disabled === false && \
             document.querySelector('{replay_failed}').textContent === 'Replay 3 failed'"
        ),
        "the chosen endpoint's replay-failed control, enabled",
        WAIT,
    )
    .await;
    page.click(replay_failed).await;
    page.wait_for(
        "document.getElementById('notice').textContent.includes('Replayed 3 failed deliveries')",
        "the bulk replay's count",
        WAIT,
    )
    .await;
    for id in &ids {
        page.wait_for(
            &row_in_state(id, "DELIVERED"),
            "each replayed delivery delivered",
            WAIT,
        )
        .await;
    }

    // A test webhook: signed, and in the feed like any delivery.
    page.click("#endpoint-actions [data-action=\"test-event\"]")
        .await;
    let arrived = receiver.wait_for(7, WAIT).await;
    let test = arrived
        .iter()
        .find(|r| r.body["type"] == "courier.test")
        .expect("the test webhook arrived");
    assert!(test.verified, "signed with the endpoint's secret");
    page.wait_for(
        &row_in_state(&test.webhook_id, "DELIVERED"),
        "the test webhook in the feed, delivered",
        WAIT,
    )
    .await;

    // The detail shows what the receiver said, and sends a delivered delivery again.
    page.click(&format!(
        "[data-delivery-id=\"{}\"] [data-action=\"open\"]",
        ids[0]
    ))
    .await;
    page.wait_for(
        "document.querySelectorAll('#detail-body details[data-response]').length === 2",
        "both attempts' responses in the detail",
        WAIT,
    )
    .await;
    let said: Vec<String> = page
        .eval(
            "[...document.querySelectorAll('#detail-body details[data-response=\"2\"] pre')]\
             .map((pre) => pre.textContent)",
        )
        .await;
    assert_eq!(said[0], "received, thank you");
    assert!(said[1].contains("x-receiver: yes"), "{said:?}");
    page.click("#detail-resend").await;
    receiver.wait_for(8, WAIT).await;
    let resent = receiver
        .received()
        .into_iter()
        .filter(|r| r.webhook_id == ids[0])
        .count();
    assert_eq!(
        resent, 3,
        "failed once, replayed, then sent again with the same webhook-id"
    );
    assert_only_courier(&page, &app, &admin);
    browser.close().await;
}
