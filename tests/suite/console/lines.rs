//! Ordering lines in the console: a waiting delivery's detail shows its ordering key and the
//! delivery it waits behind, which opens with one click.

use std::time::Duration;

use serde_json::json;

use crate::support::console::{open_console, row, WAIT};
use crate::support::fixtures::{endpoint_on, quick_worker};
use crate::support::{Backend, Receiver, Reply, TestApp, TestBrowser, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_delivery_shows_its_key_and_what_it_waits_behind() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.request_timeout_ms = 10_000;
        config.lease_secs = 30;
    })
    .await;
    let admin = app.admin_token().await;
    // The head is held at the receiver for a while, so the next one waits behind it.
    let receiver = Receiver::start(|_| Reply {
        delay: Duration::from_secs(6),
        ..Reply::status(200)
    })
    .await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "slow").await;
    let mut ids = Vec::new();
    for n in 0..2 {
        let submitted = crate::support::ordering::submit_keyed(
            &app,
            &admin,
            &endpoint,
            json!({ "n": n }),
            Some("cart-12"),
        )
        .await;
        ids.push(crate::support::ordering::id_of(&submitted));
    }
    let (head, waiting) = (&ids[0], &ids[1]);
    receiver.wait_for(1, WAIT).await;

    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.wait_for(&row(waiting), "the waiting delivery in the feed", WAIT)
        .await;
    page.click(&format!("[data-delivery-id=\"{waiting}\"] .open"))
        .await;
    page.wait_for(
        &format!(
            "document.getElementById('detail-ordering-key')?.textContent === 'cart-12' && \
             document.getElementById('detail-head')?.dataset.head === '{head}'"
        ),
        "the key and the head it waits behind",
        WAIT,
    )
    .await;
    let next: String = page
        .eval("document.querySelector('#detail-body .facts').textContent")
        .await;
    assert!(
        next.contains("when the delivery ahead of it in its line settles"),
        "{next}"
    );
    page.click("#detail-head").await;
    page.wait_for(
        &format!(
            "document.querySelector('#detail-body .facts code')?.textContent === '{head}' && \
             !document.getElementById('detail-head') && \
             document.getElementById('detail-ordering-key')?.textContent === 'cart-12'"
        ),
        "the head's own detail",
        WAIT,
    )
    .await;
}
