//! The console's endpoint editor changes what was edited and nothing else: a new name
//! leaves event types (even ones holding a comma) and a cap that follows the process-wide
//! default as they were, and event types are read as written (commas in a type the
//! endpoint had kept, new ones split at their commas); numbers are read as the browser
//! reads them, and a name as long as one may be keeps the editor within the window.

use serde_json::{json, Value};

use crate::support::console::{choose_endpoint, open_console, WAIT};
use crate::support::endpoints::create_endpoint;
use crate::support::fixtures::rows;
use crate::support::{Backend, TestApp, TestBrowser, TestDb, TestPage};

/// The endpoint's name and event types as the API has them, and its cap as stored (NULL:
/// it follows `COURIER_ENDPOINT_MAX_IN_FLIGHT`).
async fn stored(app: &TestApp, admin: &str, id: &str) -> (Value, Value, Option<i32>) {
    let read = app
        .graphql(
            admin,
            "query($id: ID!) { endpoint(id: $id) { name eventTypes } }",
            json!({ "id": id }),
        )
        .await;
    let endpoint = &read["data"]["endpoint"];
    let uuid: uuid::Uuid = id.parse().expect("an endpoint id");
    let cap = rows(
        &app.state.db,
        "SELECT max_in_flight FROM endpoints WHERE id = $1",
        vec![uuid.into()],
    )
    .await;
    let cap: Option<i32> = cap
        .first()
        .and_then(|row| row.try_get("", "max_in_flight").ok())
        .flatten();
    (
        endpoint["name"].clone(),
        endpoint["eventTypes"].clone(),
        cap,
    )
}

/// Waits until the console on `page` shows `endpoint`'s row.
async fn wait_for_row(page: &TestPage, endpoint: &str) {
    page.wait_for(
        &format!("document.querySelector('[data-filter-endpoint=\"{endpoint}\"]')"),
        "the endpoint's row",
        WAIT,
    )
    .await;
}

/// Opens the editor on `endpoint`, runs `fill` in the page, saves, and waits until the
/// API shows `name`.
async fn edit(page: &TestPage, app: &TestApp, admin: &str, endpoint: &str, fill: &str, name: &str) {
    choose_endpoint(page, endpoint).await;
    page.click("#endpoint-actions [data-action=\"edit-endpoint\"]")
        .await;
    page.wait_for(
        "document.getElementById('endpoint-editor').open",
        "the editor",
        WAIT,
    )
    .await;
    page.eval::<bool>(&format!("(() => {{ {fill}; return true; }})()"))
        .await;
    page.click("#editor-save").await;
    page.wait_for(
        "!document.getElementById('endpoint-editor').open",
        "the editor to close once saved",
        WAIT,
    )
    .await;
    let error: String = page
        .eval("document.getElementById('editor-error').textContent")
        .await;
    assert_eq!(error, "", "the save was refused");
    let (saved, _, _) = stored(app, admin, endpoint).await;
    assert_eq!(saved, name, "the new name");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_editor_changes_only_what_was_edited() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let endpoint = create_endpoint(
        &app,
        &admin,
        json!({
            "name": "orders",
            "url": "https://hooks.example.com/orders",
            "eventTypes": ["invoice.created,v2", "order.paid"],
        }),
    )
    .await;
    let types = json!(["invoice.created,v2", "order.paid"]);
    assert_eq!(
        stored(&app, &admin, &endpoint).await,
        (json!("orders"), types.clone(), None)
    );

    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    wait_for_row(&page, &endpoint).await;

    // A new name only: the types keep their comma, and the cap still follows the default
    // (the editor showed the default's value, and saving it pinned it before).
    edit(
        &page,
        &app,
        &admin,
        &endpoint,
        "document.getElementById('editor-name').value = 'orders, renamed'",
        "orders, renamed",
    )
    .await;
    assert_eq!(
        stored(&app, &admin, &endpoint).await,
        (json!("orders, renamed"), types, None)
    );

    // Types written in the editor, separated by commas or spaces; a comma inside a type
    // the endpoint already had stays part of it.
    edit(
        &page,
        &app,
        &admin,
        &endpoint,
        "document.getElementById('editor-name').value = 'orders'; \
         document.getElementById('editor-types').value = \
           document.getElementById('editor-types').value + ', order.shipped  refund.made,refund.failed'",
        "orders",
    )
    .await;
    assert_eq!(
        stored(&app, &admin, &endpoint).await,
        (
            json!("orders"),
            json!([
                "invoice.created,v2",
                "order.paid",
                "order.shipped",
                "refund.failed",
                "refund.made"
            ]),
            None
        )
    );
    browser.close().await;
}

/// A number the browser reads (`1e2`) is saved as that number, one that is no whole number
/// (`1.5`) is refused in the editor without a request; and an endpoint's name as long as
/// one may be (200 characters, unbroken) keeps the editor, its Save button included,
/// within a phone's window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_editor_reads_numbers_as_written_and_keeps_long_names_in_the_window() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let name = "L".repeat(200);
    let endpoint = create_endpoint(
        &app,
        &admin,
        json!({ "name": name, "url": "https://hooks.example.com/long" }),
    )
    .await;
    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.resize(390, 800).await;
    wait_for_row(&page, &endpoint).await;
    edit(
        &page,
        &app,
        &admin,
        &endpoint,
        "document.getElementById('editor-in-flight').value = '1e2'",
        &name,
    )
    .await;
    assert_eq!(stored(&app, &admin, &endpoint).await.2, Some(100));

    page.click("#endpoint-actions [data-action=\"edit-endpoint\"]")
        .await;
    page.wait_for(
        "document.getElementById('endpoint-editor').open",
        "the editor",
        WAIT,
    )
    .await;
    // What the editor shows (its heading, labels and buttons) lies within the window, its
    // buttons whole: the long name wraps in the heading rather than pushing them aside.
    let outside: Vec<String> = page
        .eval(
            "[...document.querySelectorAll('#endpoint-editor h2, #endpoint-editor label, #endpoint-editor button')] \
               .filter((e) => !e.closest('[hidden]')) \
               .filter((e) => { const r = e.getBoundingClientRect(); \
                 return r.left < 0 || r.right > window.innerWidth || (e.tagName === 'BUTTON' && e.scrollWidth > e.clientWidth + 1); }) \
               .map((e) => e.id || e.textContent.slice(0, 20))",
        )
        .await;
    assert!(outside.is_empty(), "outside a 390 px window: {outside:?}");
    // The browser refuses 1.5 itself (the field takes whole steps); without its check,
    // the editor does.
    let valid: bool = page
        .eval("(document.getElementById('editor-in-flight').value = '1.5', document.getElementById('editor-in-flight').validity.valid)")
        .await;
    assert!(!valid, "the browser reads 1.5 as no whole number");
    page.eval::<bool>("(document.getElementById('editor-form').noValidate = true, true)")
        .await;
    page.click("#editor-save").await;
    page.wait_for(
        "document.getElementById('editor-error').textContent.includes('must be a whole number')",
        "the editor refusing 1.5",
        WAIT,
    )
    .await;
    let open: bool = page
        .eval("document.getElementById('endpoint-editor').open")
        .await;
    assert!(open, "the editor stays open with its error");
    assert_eq!(
        stored(&app, &admin, &endpoint).await.2,
        Some(100),
        "nothing saved"
    );
    browser.close().await;
}
