//! An admin's console over more endpoints than it reads (the first 2,000): under a tenant
//! filter, deliveries of the tenant's endpoints past those are still shown, read and live,
//! since the API listed them under that filter.

use futures_util::StreamExt as _;
use serde_json::json;

use crate::support::console::{open_console, row, WAIT};
use crate::support::fixtures::{delivery_id, submit};
use crate::support::tenants::tenant_with_endpoints;
use crate::support::{Backend, Receiver, TestApp, TestBrowser, TestDb};

/// Endpoints the console reads (its pages of 100, twenty of them).
const READ_ENDPOINTS: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_filter_shows_deliveries_of_endpoints_the_page_has_not_read() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    // Older than the tenant's endpoint, so the console reads these and not that one.
    futures_util::stream::iter(0..READ_ENDPOINTS)
        .for_each_concurrent(8, |n| {
            let (app, admin) = (&app, &admin);
            async move {
                app.create_endpoint(admin, &format!("https://example.com/filler/{n}"))
                    .await;
            }
        })
        .await;
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
