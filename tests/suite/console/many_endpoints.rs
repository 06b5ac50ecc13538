//! An admin's console over many endpoints: under a tenant filter, deliveries of the
//! tenant's endpoints past the 2,000 it reads are still shown, read and live, since the API
//! listed them under that filter; and while deliveries flow, a refresh of the endpoint table
//! redraws only the rows of endpoints that changed, so the focus stays where it was.

use futures_util::StreamExt as _;
use serde_json::json;

use crate::support::console::{open_console, row, WAIT};
use crate::support::endpoints::endpoint_with;
use crate::support::fixtures::{delivery_id, quick_worker, submit};
use crate::support::operational::update_endpoint;
use crate::support::tenants::tenant_with_endpoints;
use crate::support::{Backend, Receiver, TestApp, TestBrowser, TestDb};

/// Endpoints the console reads (its pages of 100, twenty of them).
const READ_ENDPOINTS: usize = 2_000;

/// Creates `count` endpoints no delivery goes to, eight at a time.
async fn fillers(app: &TestApp, admin: &str, count: usize) {
    futures_util::stream::iter(0..count)
        .for_each_concurrent(8, |n| async move {
            app.create_endpoint(admin, &format!("https://example.com/filler/{n}"))
                .await;
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_filter_shows_deliveries_of_endpoints_the_page_has_not_read() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    // Older than the tenant's endpoint, so the console reads these and not that one.
    fillers(&app, &admin, READ_ENDPOINTS).await;
    let receiver = Receiver::accepting().await;
    let far = tenant_with_endpoints(&app, &admin, "Far", &receiver, &["far"]).await;
    let endpoint = far.endpoints[0].clone();
    let before = delivery_id(&submit(&app, &admin, &endpoint, json!({ "n": 1 }), None).await);

    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.wait_for(
        &format!(
            "document.querySelectorAll('#endpoints tr[data-endpoint-id]').length === {READ_ENDPOINTS}"
        ),
        "the endpoints the console reads",
        WAIT,
    )
    .await;
    page.eval::<bool>(&format!(
        "(() => {{ const s = document.getElementById('filter-tenant'); s.value = '{}'; s.dispatchEvent(new Event('change')); return true; }})()",
        far.id
    ))
    .await;
    page.wait_for(&row(&before), "the tenant's delivery, read", WAIT)
        .await;
    let live = delivery_id(&submit(&app, &admin, &endpoint, json!({ "n": 2 }), None).await);
    page.wait_for(&row(&live), "the tenant's delivery, live", WAIT)
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_redraws_only_the_endpoints_that_changed() {
    const FILLERS: usize = 300;
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    fillers(&app, &admin, FILLERS).await;
    let receiver = Receiver::accepting().await;
    let busy = endpoint_with(&app, &admin, &receiver, "busy", json!({})).await;
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    let rows = "document.querySelectorAll('#endpoints tr[data-endpoint-id]')";
    page.wait_for(
        &format!("{rows}.length === {}", FILLERS + 1),
        "every endpoint's row",
        WAIT,
    )
    .await;
    // Every row drawn so far is marked, and the busy endpoint's name has the focus.
    let busy_row = format!("document.querySelector('#endpoints tr[data-endpoint-id=\"{busy}\"]')");
    page.eval::<bool>(&format!(
        "(() => {{ {rows}.forEach((tr) => {{ tr.dataset.drawn = 'before'; }}); \
         {busy_row}.querySelector('button').focus(); return true; }})()"
    ))
    .await;
    // Deliveries to the busy endpoint move its counts (written into the row it has) and its
    // health (read, not shown); then one other endpoint is renamed, and the read that shows
    // it, after the deliveries, redraws that row alone.
    for n in 0..3 {
        submit(&app, &admin, &busy, json!({ "n": n }), None).await;
    }
    page.wait_for(
        &format!("{busy_row}.querySelector('[data-count=DELIVERED]').textContent === '3'"),
        "the busy endpoint's deliveries, counted",
        WAIT,
    )
    .await;
    let renamed = page
        .eval::<String>(&format!(
            "[...{rows}].map((tr) => tr.dataset.endpointId).filter((id) => id !== '{busy}')[7]"
        ))
        .await;
    update_endpoint(&app, &admin, &renamed, json!({ "name": "renamed" })).await;
    // One more delivery's events bring the read soon after.
    submit(&app, &admin, &busy, json!({ "n": 3 }), None).await;
    page.wait_for(
        &format!(
            "document.querySelector('#endpoints tr[data-endpoint-id=\"{renamed}\"] th').textContent === 'renamed'"
        ),
        "the renamed endpoint's row, read again",
        WAIT,
    )
    .await;
    let redrawn: Vec<String> = page
        .eval(&format!(
            "[...{rows}].filter((tr) => tr.dataset.drawn !== 'before').map((tr) => tr.dataset.endpointId)"
        ))
        .await;
    assert_eq!(
        redrawn,
        vec![renamed.clone()],
        "only the renamed row is redrawn"
    );
    let focused: String = page
        .eval("document.activeElement.dataset.filterEndpoint || ''")
        .await;
    assert_eq!(focused, busy, "the focus stays on the busy endpoint's name");
    let option: bool = page
        .eval(&format!(
            "[...document.getElementById('filter-endpoint').options].some((o) => o.value === '{renamed}' && o.text === 'renamed')"
        ))
        .await;
    assert!(option, "the endpoint filter offers the new name");
    browser.close().await;
}
