//! The console's endpoint editor changes what was edited and nothing else: a new name
//! leaves event types (even ones holding a comma) and a cap that follows the process-wide
//! default as they were, and event types are read as written (commas in a type the
//! endpoint had kept, new ones split at their commas).

use serde_json::{json, Value};

use crate::support::console::{open_console, WAIT};
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

/// Opens the editor on `endpoint`, runs `fill` in the page, saves, and waits until the
/// API shows `name`.
async fn edit(page: &TestPage, app: &TestApp, admin: &str, endpoint: &str, fill: &str, name: &str) {
    page.click(&format!("[data-filter-endpoint=\"{endpoint}\"]"))
        .await;
    page.wait_for(
        "!document.getElementById('endpoint-actions').hidden",
        "the chosen endpoint's actions",
        WAIT,
    )
    .await;
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
    let created = app
        .graphql(
            &admin,
            "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id } } }",
            json!({ "input": {
                "name": "orders",
                "url": "https://hooks.example.com/orders",
                "eventTypes": ["invoice.created,v2", "order.paid"],
            } }),
        )
        .await;
    let endpoint = created["data"]["createEndpoint"]["endpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    let types = json!(["invoice.created,v2", "order.paid"]);
    assert_eq!(
        stored(&app, &admin, &endpoint).await,
        (json!("orders"), types.clone(), None)
    );

    let browser = TestBrowser::launch().await;
    let page = open_console(&browser, &app, &admin, "").await;
    page.wait_for(
        &format!("document.querySelector('[data-filter-endpoint=\"{endpoint}\"]')"),
        "the endpoint's row",
        WAIT,
    )
    .await;

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
