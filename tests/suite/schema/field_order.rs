//! Response fields come in the order the operation asks for them, every time (GraphQL spec
//! 7.2.2): async-graphql 7 added them as their resolvers finished.

use serde_json::json;

use crate::support::tenants::{create_tenant, tenant_key};
use crate::support::{Backend, TestApp, TestDb};

/// A field read through a loader (`tenant`) beside fields at hand: before, 1 answer in 5 or
/// so put `expiresAt` before `tenant`. Aliases, fragments and list items keep their places
/// too.
#[tokio::test]
async fn fields_come_in_the_order_they_were_asked_for() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let tenant = create_tenant(&app, &admin, "Acme").await;
    let key = tenant_key(&app, &admin, &tenant).await;
    app.create_endpoint(&admin, "https://example.com/a").await;
    app.create_endpoint(&admin, "https://example.com/b").await;
    let cases = [
        (
            key.as_str(),
            "{ currentKey { role tenant { name } expiresAt } }",
            r#"{"data":{"currentKey":{"role":"PARTNER","tenant":{"name":"Acme"},"expiresAt":null}}}"#,
        ),
        (
            admin.as_str(),
            "query { z: currentKey { role } ...F a: endpoints { edges { node { url disabled id: url } } } } \
             fragment F on Query { m: currentKey { tenant { name } role } }",
            r#"{"data":{"z":{"role":"ADMIN"},"m":{"tenant":null,"role":"ADMIN"},"a":{"edges":[{"node":{"url":"https://example.com/a","disabled":false,"id":"https://example.com/a"}},{"node":{"url":"https://example.com/b","disabled":false,"id":"https://example.com/b"}}]}}}"#,
        ),
    ];
    for (token, query, expected) in cases {
        for _ in 0..30 {
            let text = app
                .post_graphql(Some(token), &json!({ "query": query }))
                .await
                .text()
                .await
                .expect("a body");
            assert_eq!(text, expected, "{query}");
        }
    }
}
