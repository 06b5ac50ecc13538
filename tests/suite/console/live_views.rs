//! What the console shows stays true while deliveries flow: counts settle on the server's
//! after a burst of events, the feed keeps creation order (a delivery it does not hold goes
//! where its creation puts it) and pages to older ones, an admin chooses a new endpoint's
//! tenant, and signing out leaves nothing of the key's on the page.

use std::sync::atomic::Ordering;

use courier::auth::{self, Role};
use serde_json::json;

use crate::support::console::{open_console, row, row_in_state, wait_live, WAIT};
use crate::support::endpoints::{endpoint_with, set_disabled};
use crate::support::fixtures::{
    delivery_id, endpoint_on, failing_at_once, quick_worker, submit, wait_for_state,
};
use crate::support::tenants::{create_tenant, tenant_with_endpoints};
use crate::support::{Backend, Receiver, Reply, TestApp, TestBrowser, TestDb};

/// The counts an endpoint's row shows, `PENDING` to `FAILED`, as a JavaScript expression.
fn shown_counts(endpoint: &str) -> String {
    format!(
        "[...document.querySelectorAll('tr[data-endpoint-id=\"{endpoint}\"] [data-count]')]\
         .map((cell) => cell.textContent).join(',')"
    )
}

/// Parked deliveries released by the page's own Enable make a burst of events around the
/// re-read that action makes: whatever the two counted twice, the row settles on the
/// server's counts (never below zero), and a waiting delivery's detail shows no stray
/// value where its (absent) action would go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_settle_on_the_servers_after_a_burst() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, failing_at_once).await;
    let admin = app.admin_token().await;
    let (receiver, healthy) = Receiver::switchable(500, || Reply::status(200)).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "burst").await;
    let ids = failed_deliveries(&app, &admin, &endpoint, 80).await;
    healthy.store(true, Ordering::SeqCst);
    // Disabled, then replayed: all 80 wait, parked, for the endpoint to be enabled.
    set_disabled(&app, &admin, &endpoint, true).await;
    let replayed = app
        .graphql(
            &admin,
            "mutation($id: ID!) { replayDeliveries(filter: {endpointId: $id}) { replayed } }",
            json!({ "id": endpoint }),
        )
        .await;
    assert_eq!(
        replayed["data"]["replayDeliveries"]["replayed"], 80,
        "{replayed}"
    );
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.wait_for(
        &format!("{} === '80,0,0,0'", shown_counts(&endpoint)),
        "80 waiting deliveries counted",
        WAIT,
    )
    .await;

    let waiting = ids.last().expect("a delivery");
    page.click(&format!(
        "[data-delivery-id=\"{waiting}\"] [data-action=\"open\"]"
    ))
    .await;
    page.wait_for(
        "document.getElementById('detail-body').textContent.includes('This cycle')",
        "the waiting delivery's detail",
        WAIT,
    )
    .await;
    let detail: String = page
        .eval("document.getElementById('detail-body').textContent")
        .await;
    assert!(!detail.contains("null"), "a stray value: {detail}");
    assert!(
        detail.contains("\u{2068}test\u{2069} — \u{2068}http"),
        "the endpoint's name and URL are set apart, so neither can turn the other around: {detail}"
    );
    page.click("#detail-close").await;

    page.click(&format!("[data-filter-endpoint=\"{endpoint}\"]"))
        .await;
    page.wait_for(
        "document.querySelector('#endpoint-actions [data-action=\"toggle-endpoint\"]')?.textContent === 'Enable'",
        "the chosen endpoint's Enable control",
        WAIT,
    )
    .await;
    page.click("#endpoint-actions [data-action=\"toggle-endpoint\"]")
        .await;
    for id in &ids {
        wait_for_state(&app, &admin, id, "DELIVERED", WAIT).await;
    }
    page.wait_for(
        &format!("{} === '0,0,80,0'", shown_counts(&endpoint)),
        "the shown counts to settle on the server's",
        WAIT,
    )
    .await;
    browser.close().await;
}

/// Submits `n` deliveries to `endpoint` and waits until each has failed; their ids, oldest
/// first.
async fn failed_deliveries(app: &TestApp, admin: &str, endpoint: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(delivery_id(
            &submit(app, admin, endpoint, json!({ "n": i }), None).await,
        ));
    }
    for id in &ids {
        wait_for_state(app, admin, id, "FAILED", WAIT).await;
    }
    ids
}

/// The feed is the newest deliveries its filter matches, without gaps: one that comes to
/// match (failed, under a `FAILED` filter) goes where its creation puts it, showing its
/// creation time; one older than every row shown waits for "Show older", which brings the
/// rest below, in order, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_keeps_creation_order_and_pages_to_older_ones() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, failing_at_once).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::start(|_| Reply::status(500)).await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "refusing").await;
    let ids = failed_deliveries(&app, &admin, &endpoint, 60).await;
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.eval::<bool>(
        "(() => { const s = document.getElementById('filter-state'); s.value = 'FAILED'; \
         s.dispatchEvent(new Event('change')); return true; })()",
    )
    .await;
    let rows = "document.querySelectorAll('#feed [data-delivery-id]').length";
    page.wait_for(
        &format!("{rows} === 50 && !document.getElementById('feed-older').hidden"),
        "the newest 50 failed, and a way to older ones",
        WAIT,
    )
    .await;

    // The oldest, replayed, fails again: older than every row shown, it is not put above
    // them (nor below, which would leave a gap).
    let replayed = app
        .graphql(
            &admin,
            "mutation($id: ID!) { replayDelivery(id: $id) { id } }",
            json!({ "id": ids[0] }),
        )
        .await;
    assert!(replayed["errors"].is_null(), "{replayed}");
    wait_for_state(&app, &admin, &ids[0], "FAILED", WAIT).await;
    // A new one fails after it: once its row is shown, the replay's events were seen too.
    let newest = failed_deliveries(&app, &admin, &endpoint, 1)
        .await
        .remove(0);
    page.wait_for(
        &row_in_state(&newest, "FAILED"),
        "the new failed delivery",
        WAIT,
    )
    .await;
    let first: String = page
        .eval("document.querySelector('#feed li').dataset.deliveryId")
        .await;
    assert_eq!(first, newest, "the newest on top");
    let shown: String = page
        .eval(&format!("{}.querySelector('time').dateTime", row(&newest)))
        .await;
    let created = app
        .graphql(
            &admin,
            "query($id: ID!) { delivery(id: $id) { createdAt } }",
            json!({ "id": newest }),
        )
        .await;
    let created = created["data"]["delivery"]["createdAt"]
        .as_str()
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .expect("a creation time");
    let shown = chrono::DateTime::parse_from_rfc3339(&shown).expect("a time");
    assert!(
        (shown - created).num_milliseconds().abs() < 50,
        "its creation time ({created}), not its event's: {shown}"
    );
    assert!(
        !page
            .eval::<bool>(&format!("Boolean({})", row(&ids[0])))
            .await,
        "the replayed oldest is not shown out of order"
    );
    assert_eq!(page.eval::<usize>(rows).await, 51);

    page.click("#feed-older").await;
    page.wait_for(
        &format!("{rows} === 61 && document.getElementById('feed-older').hidden"),
        "every failed delivery, and no more to show",
        WAIT,
    )
    .await;
    let order: Vec<String> = page
        .eval("[...document.querySelectorAll('#feed [data-delivery-id]')].map((e) => e.dataset.deliveryId)")
        .await;
    let newest_first: Vec<String> = std::iter::once(newest)
        .chain(ids.iter().rev().cloned())
        .collect();
    assert_eq!(order, newest_first, "newest first, each once");
    browser.close().await;
}

/// An admin creating an endpoint while the console is filtered to a tenant is shown that
/// tenant as a choice, not given it silently, and may create it without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_chooses_a_new_endpoints_tenant() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let acme = tenant_with_endpoints(&app, &admin, "Acme", &receiver, &["acme"]).await;
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.eval::<bool>(&format!(
        "(() => {{ const s = document.getElementById('filter-tenant'); s.value = '{}'; s.dispatchEvent(new Event('change')); return true; }})()",
        acme.id
    ))
    .await;
    page.click("#new-endpoint").await;
    let offered: (bool, String) = page
        .eval("[document.getElementById('editor-tenant').hidden, document.getElementById('editor-tenant').value]")
        .await;
    assert_eq!(
        offered,
        (false, acme.id.clone()),
        "the filter's tenant, shown"
    );
    page.eval::<bool>(
        "(() => { document.getElementById('editor-tenant').value = ''; \
         document.getElementById('editor-name').value = 'shared'; \
         document.getElementById('editor-url').value = 'https://hooks.example.com/shared'; return true; })()",
    )
    .await;
    page.click("#editor-save").await;
    page.wait_for(
        "document.getElementById('secret-shown').open",
        "the new endpoint's secret",
        WAIT,
    )
    .await;
    let listed = app
        .graphql(
            &admin,
            "{ endpoints(first: 10) { edges { node { name tenant { id } } } } }",
            json!({}),
        )
        .await;
    let shared = listed["data"]["endpoints"]["edges"]
        .as_array()
        .and_then(|edges| edges.iter().find(|e| e["node"]["name"] == "shared"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        shared["node"]["tenant"].is_null(),
        "created without a tenant: {shared}"
    );
    browser.close().await;
}

/// A key revoked while a delivery's detail is open: the dialog closes with the sign-out,
/// nothing the key could see stays on the page (nor its filters, nor its chart), and the
/// next key signed in in the same tab starts afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_out_closes_the_detail_and_empties_the_page() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let key = auth::create_api_key(&app.state.db, "ops", Role::Admin, Default::default())
        .await
        .expect("a key");
    let receiver = Receiver::accepting().await;
    let endpoint = endpoint_on(&app, &key.token, &receiver, "seen").await;
    let other = endpoint_on(&app, &key.token, &receiver, "other").await;
    let id = delivery_id(&submit(&app, &key.token, &endpoint, json!({ "secret": 1 }), None).await);
    let theirs = delivery_id(&submit(&app, &key.token, &other, json!({ "n": 2 }), None).await);
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &key.token, "").await;
    page.click(&format!("[data-filter-endpoint=\"{endpoint}\"]"))
        .await;
    let live = delivery_id(&submit(&app, &key.token, &endpoint, json!({ "n": 3 }), None).await);
    page.wait_for(
        &row_in_state(&live, "DELIVERED"),
        "a delivery seen live",
        WAIT,
    )
    .await;
    page.wait_for(
        "document.getElementById('chart-summary').textContent.includes(' 1 delivered')",
        "the chart counting it",
        WAIT,
    )
    .await;
    page.click(&format!(
        "[data-delivery-id=\"{id}\"] [data-action=\"open\"]"
    ))
    .await;
    page.wait_for(
        "document.getElementById('detail').open && document.getElementById('detail-body').textContent.includes('secret')",
        "the detail with its payload",
        WAIT,
    )
    .await;

    auth::revoke_api_key(&app.state.db, key.id)
        .await
        .expect("revoked");
    page.wait_for(
        "!document.getElementById('sign-in').hidden",
        "the sign-in form",
        WAIT,
    )
    .await;
    let left: (usize, usize, String, String, bool) = page
        .eval(
            "[document.querySelectorAll('dialog[open]').length, \
              document.querySelectorAll('#feed li, #endpoints tbody tr').length, \
              document.getElementById('detail-body').textContent, document.title, \
              document.getElementById('chart-summary').textContent.includes(' 0 delivered')]",
        )
        .await;
    assert_eq!(
        left,
        (0, 0, String::new(), "Courier console".to_owned(), true),
        "what the key could see stayed on the page"
    );

    // A key limited to the other endpoint, in the same tab: no filter of the last key's
    // keeps it from its own deliveries.
    let limits = auth::KeyLimits {
        endpoints: &[uuid::Uuid::parse_str(&other).expect("an id")],
        tenant: None,
        expires_in: None,
    };
    let partner = auth::create_api_key(&app.state.db, "partner", Role::Partner, limits)
        .await
        .expect("a key");
    page.click("#token").await;
    page.type_text(&partner.token).await;
    page.press_enter().await;
    wait_live(&page).await;
    page.wait_for(&row(&theirs), "the next key's own delivery", WAIT)
        .await;
    let notice: String = page
        .eval("document.getElementById('notice').hidden ? '' : document.getElementById('notice').textContent")
        .await;
    assert!(notice.is_empty(), "an error on signing in: {notice}");
    browser.close().await;
}

/// More endpoints, and tenants, than one page of them (100): every one is in the table and
/// the tenant filter, and a delivery to the newest endpoint is shown under its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_and_tenant_is_read_past_the_first_hundred() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let mut newest = String::new();
    for n in 0..105 {
        newest = endpoint_with(&app, &admin, &receiver, &format!("many-{n}"), json!({})).await;
    }
    for n in 0..102 {
        create_tenant(&app, &admin, &format!("tenant-{n}")).await;
    }
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.wait_for(
        "document.querySelectorAll('#endpoints tr[data-endpoint-id]').length === 105 && \
         document.getElementById('endpoints-note').textContent === '(105)'",
        "all 105 endpoints",
        WAIT,
    )
    .await;
    page.wait_for(
        "document.querySelectorAll('#filter-tenant option').length === 103",
        "every tenant, and 'All tenants', in the tenant filter",
        WAIT,
    )
    .await;
    let id = delivery_id(&submit(&app, &admin, &newest, json!({}), None).await);
    page.wait_for(
        &format!(
            "{}?.querySelector('.endpoint').textContent === 'many-104'",
            row(&id)
        ),
        "the delivery under its endpoint's name",
        WAIT,
    )
    .await;
    browser.close().await;
}
