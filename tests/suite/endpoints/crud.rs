//! Endpoints: create, update, read and list, on SQLite and PostgreSQL.

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::endpoint_count;
use crate::support::fixtures::stored_secret;
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

const ENDPOINT_FIELDS: &str = "id name url disabled createdAt updatedAt";

async fn create_returns_the_endpoint_and_a_secret_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;

    let body = app
        .graphql(
            &admin,
            &format!("mutation {{ createEndpoint(input: {{name: \" Orders \", url: \"https://example.com/hooks\"}}) {{ endpoint {{ {ENDPOINT_FIELDS} }} secret }} }}"),
            json!({}),
        )
        .await;
    let created = &body["data"]["createEndpoint"];
    assert_eq!(created["endpoint"]["name"], "Orders", "{body}");
    assert_eq!(created["endpoint"]["url"], "https://example.com/hooks");
    assert_eq!(created["endpoint"]["disabled"], false);
    let secret = created["secret"].as_str().expect("a secret");
    assert!(secret.starts_with("whsec_"), "{secret}");
    let id = created["endpoint"]["id"].as_str().expect("an id");

    let read = app
        .graphql(
            &admin,
            &format!("query($id: ID!) {{ endpoint(id: $id) {{ {ENDPOINT_FIELDS} }} }}"),
            json!({ "id": id }),
        )
        .await;
    assert_eq!(read["data"]["endpoint"], created["endpoint"], "{read}");
    assert!(
        !read.to_string().contains(secret),
        "the secret is never readable again"
    );
}

async fn update_rotates_the_secret_only_when_the_url_changes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (id, first_secret) = app.create_endpoint(&admin, "https://example.com/a").await;
    let update = "mutation($id: ID!, $input: UpdateEndpointInput!) { updateEndpoint(id: $id, input: $input) { endpoint { id name url disabled } secret } }";

    let renamed = app
        .graphql(
            &admin,
            update,
            json!({ "id": id, "input": { "name": "renamed", "disabled": true } }),
        )
        .await;
    let result = &renamed["data"]["updateEndpoint"];
    assert_eq!(result["endpoint"]["name"], "renamed", "{renamed}");
    assert_eq!(result["endpoint"]["disabled"], true);
    assert!(
        result["secret"].is_null(),
        "no new secret without a URL change"
    );

    let same_url = app
        .graphql(
            &admin,
            update,
            json!({ "id": id, "input": { "url": "https://example.com/a" } }),
        )
        .await;
    assert!(
        same_url["data"]["updateEndpoint"]["secret"].is_null(),
        "{same_url}"
    );

    let moved = app
        .graphql(
            &admin,
            update,
            json!({ "id": id, "input": { "url": "https://example.org/b" } }),
        )
        .await;
    let result = &moved["data"]["updateEndpoint"];
    assert_eq!(
        result["endpoint"]["url"], "https://example.org/b",
        "{moved}"
    );
    let new_secret = result["secret"]
        .as_str()
        .expect("a URL change mints a secret");
    assert!(new_secret.starts_with("whsec_"));
    assert_ne!(new_secret, first_secret);

    let stored = stored_secret(&app, &id).await;
    assert_eq!(stored, new_secret, "the secret returned is the one stored");
}

async fn update_of_an_unknown_endpoint_is_not_found(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let body = app
        .graphql(
            &admin,
            "mutation($id: ID!) { updateEndpoint(id: $id, input: {name: \"x\"}) { endpoint { id } } }",
            json!({ "id": uuid::Uuid::now_v7().to_string() }),
        )
        .await;
    assert_eq!(gql_error_code(&body), Some("NOT_FOUND"), "{body}");

    let read = app
        .graphql(
            &admin,
            "query($id: ID!) { endpoint(id: $id) { id } }",
            json!({ "id": uuid::Uuid::now_v7().to_string() }),
        )
        .await;
    assert!(read["data"]["endpoint"].is_null(), "{read}");
    assert!(read.get("errors").is_none(), "{read}");

    let malformed = app
        .graphql(&admin, "{ endpoint(id: \"not-a-uuid\") { id } }", json!({}))
        .await;
    assert_eq!(
        gql_error_code(&malformed),
        Some("BAD_USER_INPUT"),
        "{malformed}"
    );
}

async fn listing_pages_with_keyset_cursors(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let mut created = Vec::new();
    for i in 0..7 {
        created.push(
            app.create_endpoint(&admin, &format!("https://example.com/{i}"))
                .await
                .0,
        );
    }
    let query = "query($after: String) { endpoints(first: 3, after: $after) { edges { cursor node { id } } pageInfo { hasNextPage endCursor } } }";
    let mut seen = Vec::new();
    let mut after = serde_json::Value::Null;
    let mut pages = 0;
    loop {
        let body = app.graphql(&admin, query, json!({ "after": after })).await;
        let connection = &body["data"]["endpoints"];
        let edges = connection["edges"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"));
        seen.extend(
            edges
                .iter()
                .map(|edge| edge["node"]["id"].as_str().unwrap_or_default().to_owned()),
        );
        pages += 1;
        if connection["pageInfo"]["hasNextPage"] != true {
            break;
        }
        after = connection["pageInfo"]["endCursor"].clone();
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, created, "every endpoint once, in creation order");

    // An endpoints cursor given to another listing is refused, not answered with nothing.
    let first_page = app.graphql(&admin, query, json!({ "after": null })).await;
    let cursor = first_page["data"]["endpoints"]["pageInfo"]["endCursor"].clone();
    let foreign = app
        .graphql(
            &admin,
            "query($after: String) { deliveries(after: $after) { edges { cursor } } }",
            json!({ "after": cursor }),
        )
        .await;
    assert_eq!(
        gql_error_code(&foreign),
        Some("BAD_USER_INPUT"),
        "{foreign}"
    );
    assert!(
        foreign["errors"][0]["message"]
            .as_str()
            .is_some_and(|message| message.contains("another listing")),
        "{foreign}"
    );

    for (first, after) in [
        (json!(101), json!(null)),
        (json!(-1), json!(null)),
        (json!(2), json!("garbage")),
    ] {
        let body = app
            .graphql(&admin, "query($first: Int, $after: String) { endpoints(first: $first, after: $after) { edges { cursor } } }", json!({ "first": first, "after": after }))
            .await;
        assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    }
}

async fn bad_urls_are_refused_and_nothing_is_written(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| config.allow_private_destinations = false).await;
    let admin = app.admin_token().await;
    for url in [
        "not a url",
        "ftp://example.com/x",
        "https://",
        "http://127.0.0.1:9/x",
        "http://localhost/x",
        "http://[::1]/",
        "http://10.0.0.8/",
    ] {
        let body = app
            .graphql(&admin, "mutation($url: String!) { createEndpoint(input: {name: \"x\", url: $url}) { endpoint { id } } }", json!({ "url": url }))
            .await;
        assert_eq!(
            gql_error_code(&body),
            Some("BAD_USER_INPUT"),
            "{url}: {body}"
        );
    }
    for name in ["", "   ", &"n".repeat(201)] {
        let body = app
            .graphql(&admin, "mutation($name: String!) { createEndpoint(input: {name: $name, url: \"https://example.com\"}) { endpoint { id } } }", json!({ "name": name }))
            .await;
        assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    }
    assert_eq!(endpoint_count(&app).await, 0, "nothing was written");

    let (id, _) = app.create_endpoint(&admin, "https://example.com/ok").await;
    let body = app
        .graphql(&admin, "mutation($id: ID!) { updateEndpoint(id: $id, input: {url: \"gopher://x\"}) { endpoint { id } } }", json!({ "id": id }))
        .await;
    assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    let read = app
        .graphql(
            &admin,
            "query($id: ID!) { endpoint(id: $id) { url } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        read["data"]["endpoint"]["url"], "https://example.com/ok",
        "the failed update changed nothing"
    );
}

/// Names stored before the rules they break (here, a right-to-left override) still work:
/// an endpoint's name sent back unchanged with another change is kept (the console sends
/// every field), another such name is refused, and the tenant still gets portal links.
#[tokio::test]
async fn names_stored_before_the_rules_still_work() {
    use sea_orm::ConnectionTrait as _;

    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (id, _) = app.create_endpoint(&admin, "https://example.com/old").await;
    let tenant = crate::support::tenants::create_tenant(&app, &admin, "Acme").await;
    let older = "evil\u{202E}txt";
    let direct = db.connect(1).await;
    for table in ["endpoints", "tenants"] {
        direct
            .conn()
            .execute_unprepared(&format!("UPDATE {table} SET name = '{older}'"))
            .await
            .expect("a name from before the rules");
    }

    let update = "mutation($id: ID!, $name: String!) { updateEndpoint(id: $id, input: {name: $name, maxInFlight: 4}) { endpoint { name maxInFlight } } }";
    let kept = app
        .graphql(&admin, update, json!({ "id": id, "name": older }))
        .await;
    assert_eq!(
        kept["data"]["updateEndpoint"]["endpoint"],
        json!({ "name": older, "maxInFlight": 4 }),
        "{kept}"
    );
    let other = app
        .graphql(
            &admin,
            update,
            json!({ "id": id, "name": "new\u{202E}name" }),
        )
        .await;
    assert_eq!(gql_error_code(&other), Some("BAD_USER_INPUT"), "{other}");

    let link = app
        .graphql(
            &admin,
            "mutation($t: ID!) { createPortalLink(tenantId: $t, ttlSeconds: 60) { token } }",
            json!({ "t": tenant }),
        )
        .await;
    assert!(
        link["data"]["createPortalLink"]["token"].is_string(),
        "{link}"
    );
}

on_both_backends!(
    create_returns_the_endpoint_and_a_secret_once,
    update_rotates_the_secret_only_when_the_url_changes,
    update_of_an_unknown_endpoint_is_not_found,
    listing_pages_with_keyset_cursors,
    bad_urls_are_refused_and_nothing_is_written,
);
