//! The operator console in a real browser: served by Courier alone, live, replaying (one
//! delivery or an endpoint's every failed one), scoped to the key, responsive under a
//! stream of events.

mod behind_a_prefix;
mod connection;
mod editor;
mod flow_column;
mod lines;
mod live_views;
mod many_endpoints;
mod portal;
mod reads;
mod recovery;

use std::sync::atomic::Ordering;
use std::time::Duration;

use courier::auth::{self, Role};
use serde_json::json;
use uuid::Uuid;

use crate::on_both_backends;
use crate::support::console::assert_no_csp_violation;
use crate::support::console::assert_only_courier;
use crate::support::console::{open_console, row, row_in_state, wait_live, WAIT};
use crate::support::fixtures::delivery_id;
use crate::support::fixtures::submit;
use crate::support::fixtures::{endpoint_on, quick_worker, wait_for_state};
use crate::support::{Backend, Receiver, Reply, TestApp, TestBrowser, TestDb};

/// The console is the page at `/`, comes from Courier alone (its policy forbids anything
/// else and the browser requested nothing else), takes the token out of the address bar,
/// and fits both a 1280x800 window and a narrow one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_loads_from_courier_alone() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(
            &admin,
            "https://hooks.example.com/webhooks/orders/v2/receive",
        )
        .await;
    let response = app.request(reqwest::Method::GET, "/").send().await.unwrap();
    assert_eq!(response.status(), 200);
    let csp = response.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    for directive in [
        "default-src 'self'",
        "connect-src 'self'",
        "script-src 'self'",
    ] {
        assert!(csp.contains(directive), "{directive} missing from {csp}");
    }
    let html = response.text().await.unwrap();
    assert!(html.contains("\"assets/console.js\"") && !html.contains("https://"));

    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.wait_for(
        &format!("document.querySelector('#endpoints tr[data-endpoint-id=\"{endpoint}\"]')"),
        "the endpoint's row",
        WAIT,
    )
    .await;
    let href: String = page.eval("location.href").await;
    assert_eq!(href, app.url("/"), "the token left the address bar");
    let stored: bool = page
        .eval(&format!(
            "sessionStorage.getItem('courier.token') === '{admin}'"
        ))
        .await;
    assert!(stored, "the token is kept for the tab");
    let foreign: Vec<String> = page
        .eval("performance.getEntriesByType('resource').map((e) => e.name).filter((n) => new URL(n).origin !== location.origin)")
        .await;
    assert!(foreign.is_empty(), "resources from elsewhere: {foreign:?}");
    assert_only_courier(&page, &app, &admin);
    assert_no_csp_violation(&page).await;
    let wide: (f64, f64) = page
        .eval("[document.documentElement.scrollWidth, window.innerWidth]")
        .await;
    assert!(wide.0 <= wide.1, "wider than 1280px: {wide:?}");
    let table: (f64, f64) = page
        .eval("(() => { const w = document.querySelector('.endpoints .table-wrap'); return [w.scrollWidth, w.clientWidth]; })()")
        .await;
    assert!(
        table.0 <= table.1,
        "the endpoints table does not fit at 1280px: {table:?}"
    );
    if let Some(path) = std::env::var_os("COURIER_TEST_CONSOLE_SCREENSHOT") {
        page.screenshot(std::path::Path::new(&path)).await;
    }

    // The longest name and event type allowed, on the endpoints table and in the feed's
    // endpoint filter: cut short, the page still fits (the filter stretched it to 2,389px).
    let long = app
        .graphql(
            &admin,
            "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id } } }",
            json!({ "input": {
                "name": "L".repeat(200),
                "url": format!("https://example.com/{}", "p".repeat(400)),
                "eventTypes": ["x".repeat(255), "order.paid"],
            } }),
        )
        .await;
    let long = long["data"]["createEndpoint"]["endpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{long}"))
        .to_owned();
    page.navigate(&app.url("/")).await;
    page.wait_for(
        &format!("document.querySelector('#endpoints tr[data-endpoint-id=\"{long}\"]')"),
        "the long-named endpoint's row",
        WAIT,
    )
    .await;
    let wide: (f64, f64) = page
        .eval("[document.documentElement.scrollWidth, window.innerWidth]")
        .await;
    assert!(wide.0 <= wide.1, "long names widen the page: {wide:?}");

    // A narrow window: one column, nothing wider than the window, the feed still shown.
    page.resize(420, 800).await;
    let narrow: (f64, f64, f64) = page
        .eval("[document.documentElement.scrollWidth, window.innerWidth, document.getElementById('feed').getBoundingClientRect().width]")
        .await;
    assert!(
        narrow.1 <= 420.0 && narrow.0 <= narrow.1,
        "overflows a narrow window: {narrow:?}"
    );
    assert!(narrow.2 > 300.0, "the feed is squeezed: {narrow:?}");
    browser.close().await;
}

/// Deliveries submitted through the API appear in the open console and follow their state
/// live to `DELIVERED`, with the counts and the chart, without a reload.
async fn deliveries_appear_live_and_reach_delivered(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "live").await;
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.eval::<bool>("(window.__sameDocument = true)").await;

    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(delivery_id(
            &submit(&app, &admin, &endpoint, json!({ "n": n }), None).await,
        ));
    }
    for id in &ids {
        page.wait_for(&row_in_state(id, "DELIVERED"), "a DELIVERED row", WAIT)
            .await;
    }
    let same_document: bool = page.eval("window.__sameDocument === true").await;
    assert!(same_document, "the page was reloaded");
    page.wait_for(
        &format!("document.querySelector('tr[data-endpoint-id=\"{endpoint}\"] [data-count=\"DELIVERED\"]').textContent === '3'"),
        "the endpoint's delivered count to reach 3",
        WAIT,
    )
    .await;
    page.wait_for(
        "document.getElementById('chart-summary').textContent.includes('3 delivered')",
        "the chart to count 3 deliveries",
        WAIT,
    )
    .await;
    assert_no_csp_violation(&page).await;
    browser.close().await;
}

/// Measures the page's work as events stream in: the longest animation-frame callback
/// (where the feed applies its queued events) in `window.__longestFrame`, and how many
/// rows were ever added to the feed in `window.__rowsAdded`.
const FEED_WORK: &str = "window.__longestFrame = 0; window.__rowsAdded = 0;
const nativeFrame = window.requestAnimationFrame.bind(window);
window.requestAnimationFrame = (callback) => nativeFrame((time) => {
  const start = performance.now();
  callback(time);
  window.__longestFrame = Math.max(window.__longestFrame, performance.now() - start);
});
document.addEventListener('DOMContentLoaded', () => {
  new MutationObserver((records) => {
    for (const record of records) window.__rowsAdded += record.addedNodes.length;
  }).observe(document.getElementById('feed'), { childList: true });
});";

/// Over a thousand streamed events (340 deliveries, each created, claimed and delivered)
/// leave the page responsive: the feed keeps only its newest rows, adds each delivery's row
/// once instead of redrawing the list per event, and the counts follow every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_streamed_events_keep_the_page_responsive() {
    const DELIVERIES: usize = 340;
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "many").await;
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, FEED_WORK).await;
    page.eval::<bool>("(window.__longestFrame = 0, window.__rowsAdded = 0, true)")
        .await;

    let mut last = String::new();
    for chunk in 0..DELIVERIES / 10 {
        let batch = (0..10).map(|i| {
            submit(
                &app,
                &admin,
                &endpoint,
                json!({ "n": chunk * 10 + i }),
                None,
            )
        });
        for submitted in futures_util::future::join_all(batch).await {
            last = delivery_id(&submitted);
        }
    }
    page.wait_for(
        &format!("document.querySelector('tr[data-endpoint-id=\"{endpoint}\"] [data-count=\"DELIVERED\"]').textContent === '{DELIVERIES}'"),
        "every delivery to be counted DELIVERED",
        Duration::from_secs(60),
    )
    .await;
    page.wait_for(
        &row_in_state(&last, "DELIVERED"),
        "the newest row DELIVERED",
        WAIT,
    )
    .await;
    let rows: usize = page
        .eval("document.querySelectorAll('#feed [data-delivery-id]').length")
        .await;
    assert_eq!(rows, 200, "the feed keeps the newest 200 rows");
    let added: usize = page.eval("window.__rowsAdded").await;
    assert!(
        // Each new delivery once, plus at most two re-reads (a lag or a reconnection).
        (DELIVERIES..=DELIVERIES + 2 * 200).contains(&added),
        "{added} rows were added to the feed for {DELIVERIES} deliveries"
    );
    // Generous, for a machine shared with other tests: applying a batch of events takes
    // milliseconds, redrawing the list per event would not.
    let longest: f64 = page.eval("window.__longestFrame").await;
    assert!(
        longest < 1000.0,
        "applying events blocked the page for {longest} ms"
    );
    browser.close().await;
}

/// A failed delivery's replay control, clicked in the page, gets it attempted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_replayed_from_the_page_is_attempted_again() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let (receiver, healthy) = Receiver::switchable(500, || Reply::status(200)).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "replay").await;
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;

    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({ "replay": 1 }), None).await);
    let control = format!("[data-delivery-id=\"{id}\"] [data-action=\"replay\"]");
    page.wait_for(
        &format!("document.querySelector('{control}')"),
        "the FAILED row's replay control",
        WAIT,
    )
    .await;
    let failed = wait_for_state(&app, &admin, &id, "FAILED", WAIT).await;
    let attempts_before = failed["attempts"].as_array().unwrap().len();
    healthy.store(true, Ordering::SeqCst);

    page.click(&control).await;
    page.wait_for(
        &row_in_state(&id, "DELIVERED"),
        "the replayed delivery to be DELIVERED",
        WAIT,
    )
    .await;
    let delivered = wait_for_state(&app, &admin, &id, "DELIVERED", WAIT).await;
    let attempts = delivered["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), attempts_before + 1, "{delivered}");
    assert_eq!(attempts.last().unwrap()["statusCode"], 200);
    let received = receiver
        .received()
        .into_iter()
        .filter(|r| r.webhook_id == id)
        .count();
    assert_eq!(received, attempts_before + 1);
    let gone: bool = page
        .eval(&format!("document.querySelector('{control}') === null"))
        .await;
    assert!(gone, "a DELIVERED row offers no replay");
    browser.close().await;
}

/// Holds the page's WebSocket messages while `window.__holdSocket` is true.
const HOLD_SOCKET: &str = "(() => {
  const Native = window.WebSocket;
  const held = [];
  window.__holdSocket = false;
  window.__releaseSocket = () => { window.__holdSocket = false; held.splice(0).forEach((f) => f()); };
  window.WebSocket = class extends Native {
    set onmessage(handler) {
      super.onmessage = (event) => {
        if (window.__holdSocket) held.push(() => handler(event)); else handler(event);
      };
    }
  };
})();";

/// A replay that loses the race (the delivery was replayed elsewhere before the page heard)
/// shows `DELIVERY_NOT_REPLAYABLE` and the state the database settled on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_loses_shows_the_refusal_and_the_state() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let (receiver, healthy) = Receiver::switchable(500, || Reply::status(200)).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "race").await;
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, HOLD_SOCKET).await;

    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({ "race": 1 }), None).await);
    let control = format!("[data-delivery-id=\"{id}\"] [data-action=\"replay\"]");
    page.wait_for(
        &format!("document.querySelector('{control}')"),
        "the FAILED row's replay control",
        WAIT,
    )
    .await;
    healthy.store(true, Ordering::SeqCst);
    page.eval::<bool>("(window.__holdSocket = true)").await;
    let won = app
        .graphql(
            &admin,
            "mutation($id: ID!) { replayDelivery(id: $id) { state } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(won["data"]["replayDelivery"]["state"], "PENDING", "{won}");
    wait_for_state(&app, &admin, &id, "DELIVERED", WAIT).await;

    page.click(&control).await;
    page.wait_for(
        "(document.getElementById('notice').textContent || '').includes('DELIVERY_NOT_REPLAYABLE')",
        "the refusal",
        WAIT,
    )
    .await;
    let notice: String = page
        .eval("document.getElementById('notice').textContent")
        .await;
    assert!(
        notice.contains("DELIVERED"),
        "the refusal names the state: {notice}"
    );
    page.eval::<bool>("(window.__releaseSocket(), true)").await;
    page.wait_for(&row_in_state(&id, "DELIVERED"), "the row to catch up", WAIT)
        .await;
    browser.close().await;
}

/// A partner key, entered in the sign-in form, sees its endpoints and their deliveries
/// only, in what the page reads and in what it streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partner_key_sees_only_its_endpoints() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (mine, _) = app
        .create_endpoint(&admin, "https://example.com/mine")
        .await;
    let (theirs, _) = app
        .create_endpoint(&admin, "https://example.com/theirs")
        .await;
    let partner = app
        .token(Role::Partner, &[Uuid::parse_str(&mine).unwrap()])
        .await;
    let hidden_before = delivery_id(&submit(&app, &admin, &theirs, json!({ "x": 1 }), None).await);
    let shown_before = delivery_id(&submit(&app, &admin, &mine, json!({ "x": 2 }), None).await);

    let browser = TestBrowser::launch().await;
    let page = browser.open(&app.url("/")).await;
    page.wait_for(
        "!document.getElementById('sign-in').hidden",
        "the sign-in form",
        WAIT,
    )
    .await;
    page.click("#token").await;
    page.type_text(&partner).await;
    page.press_enter().await;
    wait_live(&page).await;
    page.wait_for(&row(&shown_before), "the partner's delivery", WAIT)
        .await;
    let search: String = page.eval("location.search + location.hash").await;
    assert_eq!(search, "", "the token went into the URL");

    let hidden_after = delivery_id(&submit(&app, &admin, &theirs, json!({ "x": 3 }), None).await);
    let shown_after = delivery_id(&submit(&app, &admin, &mine, json!({ "x": 4 }), None).await);
    page.wait_for(&row(&shown_after), "the partner's new delivery", WAIT)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leaked: Vec<String> = page
        .eval(&format!(
            "['{theirs}', '{hidden_before}', '{hidden_after}'].filter((id) => document.querySelector(`[data-endpoint-id=\"${{id}}\"], [data-delivery-id=\"${{id}}\"], option[value=\"${{id}}\"]`))"
        ))
        .await;
    assert!(leaked.is_empty(), "the partner saw: {leaked:?}");
    let endpoints: usize = page
        .eval("document.querySelectorAll('#endpoints tr[data-endpoint-id]').length")
        .await;
    assert_eq!(endpoints, 1);
    assert_only_courier(&page, &app, &partner);
    browser.close().await;
}

/// A key revoked while the console is open signs the tab out: the sign-in form comes back
/// saying why, and the tab forgets the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_signs_the_console_out() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let key = auth::create_api_key(&app.state.db, "ops", Role::Admin, Default::default())
        .await
        .unwrap();
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &key.token, "").await;

    auth::revoke_api_key(&app.state.db, key.id).await.unwrap();
    page.wait_for(
        "!document.getElementById('sign-in').hidden && document.getElementById('sign-in-error').textContent !== ''",
        "the sign-in form and its reason",
        WAIT,
    )
    .await;
    let forgotten: bool = page
        .eval("sessionStorage.getItem('courier.token') === null && document.getElementById('dashboard').hidden")
        .await;
    assert!(forgotten, "the revoked token is still in use");
    browser.close().await;
}

on_both_backends!(deliveries_appear_live_and_reach_delivered);
