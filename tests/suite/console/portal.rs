//! The console as a tenant's portal, opened from a portal link in a real browser: the
//! tenant's endpoints only, an endpoint created from the page (its secret shown once),
//! a failed delivery replayed, and nothing of another tenant shown, sent or received.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use crate::support::console::{
    assert_only_courier, choose_endpoint, open_console, row, row_in_state, wait_live, WAIT,
};
use crate::support::fixtures::{delivery_id, failing_at_once, submit, wait_for_state};
use crate::support::tenants::tenant_with_endpoints;
use crate::support::{Backend, Receiver, Reply, TestApp, TestBrowser, TestDb};

/// A tenant with one endpoint at `receiver`'s `path`: both ids.
async fn tenant_with_endpoint(
    app: &TestApp,
    admin: &str,
    name: &str,
    receiver: &Receiver,
    path: &str,
) -> (String, String) {
    let tenant = tenant_with_endpoints(app, admin, name, receiver, &[path]).await;
    let endpoint = tenant.endpoints[0].clone();
    (tenant.id, endpoint)
}

/// The token of a portal link of `tenant` living `ttl` seconds, checking the link's URL.
async fn portal_token(app: &TestApp, admin: &str, tenant: &str, ttl: i64) -> String {
    let link = app
        .graphql(
            admin,
            "mutation($tenant: ID!, $ttl: Int) { createPortalLink(tenantId: $tenant, ttlSeconds: $ttl) { url token } }",
            json!({ "tenant": tenant, "ttl": ttl }),
        )
        .await;
    let token = link["data"]["createPortalLink"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("{link}"))
        .to_owned();
    assert!(
        link["data"]["createPortalLink"]["url"]
            .as_str()
            .is_some_and(|url| url.ends_with(&format!("/#token={token}"))),
        "{link}"
    );
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_manages_its_endpoints_in_its_portal() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&db, failing_at_once).await;
    let admin = app.admin_token().await;
    let (receiver, healthy) = Receiver::switchable(503, || Reply::status(204)).await;
    let (acme, acme_endpoint) = tenant_with_endpoint(&app, &admin, "Acme", &receiver, "acme").await;
    let (globex, globex_endpoint) =
        tenant_with_endpoint(&app, &admin, "Globex", &receiver, "globex").await;
    let failed =
        delivery_id(&submit(&app, &admin, &acme_endpoint, json!({ "order": 1 }), None).await);
    wait_for_state(&app, &admin, &failed, "FAILED", WAIT).await;
    let foreign =
        delivery_id(&submit(&app, &admin, &globex_endpoint, json!({ "order": 2 }), None).await);
    wait_for_state(&app, &admin, &foreign, "FAILED", WAIT).await;

    let token = portal_token(&app, &admin, &acme, 600).await;

    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &token, "").await;
    page.wait_for(
        "document.getElementById('identity').textContent === 'Acme portal'",
        "the portal's name",
        WAIT,
    )
    .await;
    page.wait_for(&row(&failed), "the tenant's failed delivery", WAIT)
        .await;
    let endpoints: usize = page
        .eval("document.querySelectorAll('#endpoints tr[data-endpoint-id]').length")
        .await;
    assert_eq!(endpoints, 1, "the tenant's endpoint only");

    // A new endpoint, from the page: its secret is shown once, and it is the tenant's.
    page.click("#new-endpoint").await;
    page.wait_for(
        "document.getElementById('endpoint-editor').open",
        "the editor",
        WAIT,
    )
    .await;
    page.click("#editor-name").await;
    page.type_text("Acme orders").await;
    page.click("#editor-url").await;
    page.type_text(&receiver.url("acme-new")).await;
    page.click("#editor-types").await;
    page.type_text("order.paid, order.shipped").await;
    page.click("#editor-save").await;
    page.wait_for(
        "document.getElementById('secret-shown').open && document.getElementById('secret-value').textContent.startsWith('whsec_')",
        "the new endpoint's secret, shown once",
        WAIT,
    )
    .await;
    page.click("#secret-close").await;
    page.wait_for(
        "!document.getElementById('secret-shown').open && document.getElementById('secret-value').textContent === ''",
        "the secret to leave the page with its dialog",
        WAIT,
    )
    .await;
    page.wait_for(
        "document.querySelectorAll('#endpoints tr[data-endpoint-id]').length === 2",
        "the new endpoint's row",
        WAIT,
    )
    .await;
    let listed = app
        .graphql(
            &admin,
            "query($tenant: ID!) { tenant(id: $tenant) { endpoints { edges { node { name url eventTypes tenant { id } } } } } }",
            json!({ "tenant": acme }),
        )
        .await;
    let created = &listed["data"]["tenant"]["endpoints"]["edges"][1]["node"];
    assert_eq!(created["name"], "Acme orders", "{listed}");
    assert_eq!(created["url"], receiver.url("acme-new"), "{listed}");
    assert_eq!(
        created["eventTypes"],
        json!(["order.paid", "order.shipped"]),
        "{listed}"
    );

    // The failed delivery, replayed from the page once the receiver is back.
    healthy.store(true, Ordering::SeqCst);
    page.click(&format!(
        "[data-delivery-id=\"{failed}\"] [data-action=\"replay\"]"
    ))
    .await;
    page.wait_for(
        &row_in_state(&failed, "DELIVERED"),
        "the replayed delivery, delivered",
        WAIT,
    )
    .await;

    // The other tenant keeps working meanwhile; none of it reaches the page.
    let later =
        delivery_id(&submit(&app, &admin, &globex_endpoint, json!({ "order": 3 }), None).await);
    wait_for_state(&app, &admin, &later, "DELIVERED", WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let html: String = page.eval("document.documentElement.outerHTML").await;
    for theirs in [
        &globex,
        &globex_endpoint,
        &foreign,
        &later,
        &"Globex".to_owned(),
    ] {
        assert!(!html.contains(theirs.as_str()), "the portal shows {theirs}");
        for message in page.traffic() {
            assert!(
                !message.contains(theirs.as_str()),
                "the portal sent or received {theirs}: {message}"
            );
        }
    }
    assert_only_courier(&page, &app, &token);
    browser.close().await;
}

/// An admin's console shows each endpoint's tenant and filters the page by tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_filters_the_console_by_tenant() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (acme, acme_endpoint) = tenant_with_endpoint(&app, &admin, "Acme", &receiver, "acme").await;
    let (_, globex_endpoint) =
        tenant_with_endpoint(&app, &admin, "Globex", &receiver, "globex").await;
    let mine = delivery_id(&submit(&app, &admin, &acme_endpoint, json!({ "n": 1 }), None).await);
    let theirs =
        delivery_id(&submit(&app, &admin, &globex_endpoint, json!({ "n": 2 }), None).await);

    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.wait_for(&row(&theirs), "every tenant's delivery", WAIT)
        .await;
    let tenant_cell: String = page
        .eval(&format!(
            "document.querySelector('#endpoints tr[data-endpoint-id=\"{acme_endpoint}\"] td.tenant').textContent"
        ))
        .await;
    assert_eq!(tenant_cell, "Acme");
    let wide: (f64, f64) = page
        .eval("(() => { const w = document.querySelector('.endpoints .table-wrap'); return [w.scrollWidth, w.clientWidth]; })()")
        .await;
    assert!(
        wide.0 <= wide.1,
        "the endpoints table with tenants does not fit at 1280px: {wide:?}"
    );

    page.eval::<bool>(&format!(
        "(() => {{ const s = document.getElementById('filter-tenant'); s.value = '{acme}'; s.dispatchEvent(new Event('change')); return true; }})()"
    ))
    .await;
    page.wait_for(
        &format!("!{} && {}", row(&theirs), row(&mine)),
        "only the chosen tenant's deliveries",
        WAIT,
    )
    .await;
    let rows: usize = page
        .eval("document.querySelectorAll('#endpoints tr[data-endpoint-id]').length")
        .await;
    assert_eq!(rows, 1, "only the chosen tenant's endpoints");
    browser.close().await;
}

/// A portal link that expires while its console is open signs the tab out, saying why,
/// and the tab forgets the token; also in a browser whose clock is a minute slow (the
/// expiry is judged by Courier's clock: before, that browser showed only the refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_portal_link_signs_the_portal_out() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (acme, _) = tenant_with_endpoint(&app, &admin, "Acme", &receiver, "acme").await;
    let browser = TestBrowser::launch().await;
    let slow_clock = "{ const now = Date.now; Date.now = () => now() - 60000; }";
    for clock in ["", slow_clock] {
        expired_link_signs_out(&browser, &app, &admin, &acme, clock).await;
    }
    browser.close().await;
}

/// [`an_expired_portal_link_signs_the_portal_out`] in a browser whose clock `clock` sets.
async fn expired_link_signs_out(
    browser: &TestBrowser,
    app: &TestApp,
    admin: &str,
    acme: &str,
    clock: &str,
) {
    let token = portal_token(app, admin, acme, 3).await;
    let page = open_console(browser, app, &token, clock).await;
    // Until when, in plain sight.
    let until: String = page
        .eval("document.getElementById('key-expiry').hidden ? '' : document.getElementById('key-expiry').textContent")
        .await;
    assert!(until.starts_with("until "), "{until:?}");
    page.wait_for(
        "!document.getElementById('sign-in').hidden && \
         document.getElementById('sign-in-error').textContent.includes('portal link expired at') && \
         document.getElementById('sign-in-error').textContent.includes('new one')",
        "the sign-in form, saying the portal link expired",
        WAIT,
    )
    .await;
    let until_hidden: bool = page
        .eval("document.getElementById('key-expiry').hidden")
        .await;
    assert!(until_hidden, "signed out, no expiry shown");
    let kept: bool = page
        .eval("sessionStorage.getItem('courier.token') !== null")
        .await;
    assert!(!kept, "the tab forgot the expired token");

    // Opening the expired link again says what may be wrong with it.
    page.navigate(&app.url(&format!("/?again#token={token}")))
        .await;
    page.wait_for(
        "document.getElementById('sign-in-error').textContent.includes('portal link has expired')",
        "the sign-in form, naming an expired link",
        WAIT,
    )
    .await;
}

/// A portal link opened in a tab where the console is signed in (only the fragment
/// changes, so the page does not load again) signs in with the link's key, and its token
/// leaves the address bar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_link_opened_in_a_signed_in_tab_signs_in_with_it() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (acme, _) = tenant_with_endpoint(&app, &admin, "Acme", &receiver, "acme").await;
    let token = portal_token(&app, &admin, &acme, 600).await;
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.wait_for(
        "document.getElementById('identity').textContent === 'Admin'",
        "the admin signed in",
        WAIT,
    )
    .await;

    let _: bool = page
        .eval(&format!("(location.hash = '#token={token}', true)"))
        .await;
    page.wait_for(
        "document.getElementById('identity').textContent === 'Acme portal'",
        "the link's key signed in",
        WAIT,
    )
    .await;
    wait_live(&page).await;
    let href: String = page.eval("location.href").await;
    assert_eq!(href, app.url("/"), "the token left the address bar");
    let kept: String = page.eval("sessionStorage.getItem('courier.token')").await;
    assert_eq!(kept, token, "the tab keeps the link's key");
    browser.close().await;
}

/// A portal link that expires while Courier cannot be reached signs its page out all the
/// same, when it expires by Courier's clock (the page knows when), rather than showing the
/// tenant's data until Courier is back to refuse the key; and the signed-out page holds
/// nothing of the tenant, hidden or shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_link_expiring_while_courier_is_down_signs_out() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (acme, endpoint) =
        tenant_with_endpoint(&app, &admin, "Acme Unique", &receiver, "acme").await;
    let browser = TestBrowser::launch().await;
    // Long enough to open the page and choose the endpoint first, short enough to wait out.
    let token = portal_token(&app, &admin, &acme, 8).await;
    let page = open_console(&browser, &app, &token, "").await;
    // The endpoint chosen, so its actions name it.
    choose_endpoint(&page, &endpoint).await;
    app.stop().await;
    // Courier is down before the link expires: the page, not Courier, signs it out.
    page.wait_for(
        "document.getElementById('connection').dataset.status === 'reconnecting'",
        "the page to find Courier down",
        WAIT,
    )
    .await;
    let signed_in: bool = page.eval("document.getElementById('sign-in').hidden").await;
    assert!(signed_in, "signed out before the link expired");
    page.wait_for(
        "!document.getElementById('sign-in').hidden && \
         document.getElementById('sign-in-error').textContent.includes('portal link expired at')",
        "the sign-in form, saying the portal link expired, with Courier down",
        WAIT,
    )
    .await;
    let kept: Vec<String> = page
        .eval(&format!(
            "[...document.querySelectorAll('body *')].flatMap((e) => [
                ...[...e.attributes].map((a) => a.value),
                ...[...e.childNodes].filter((n) => n.nodeType === 3).map((n) => n.textContent),
             ]).filter((text) => text.includes('Acme Unique') || text.includes('{endpoint}'))"
        ))
        .await;
    assert!(kept.is_empty(), "the signed-out page still holds {kept:?}");
    browser.close().await;
}

/// At a phone's width (390 px) the portal's bar keeps its connection state, the tenant's
/// name and the link's expiry whole and inside the bar and the window: it wraps rather
/// than squeezing them (the state's pill shrank to 23 px and the expiry ran above the
/// window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_portal_bar_fits_a_phone() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (acme, _) = tenant_with_endpoint(&app, &admin, "Acme", &receiver, "acme").await;
    let token = portal_token(&app, &admin, &acme, 600).await;
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &token, "").await;
    page.resize(390, 800).await;
    let cramped: Vec<String> = page
        .eval(
            "(() => { const bar = document.querySelector('header.bar').getBoundingClientRect(); \
               return ['connection', 'identity', 'key-expiry', 'sign-out'].filter((id) => { \
                 const e = document.getElementById(id); const r = e.getBoundingClientRect(); \
                 return e.hidden || e.scrollWidth > e.clientWidth + 1 || r.top < bar.top || r.bottom > bar.bottom \
                   || r.left < 0 || r.right > window.innerWidth; }); })()",
        )
        .await;
    assert!(
        cramped.is_empty(),
        "cramped or outside the bar: {cramped:?}"
    );
    browser.close().await;
}
