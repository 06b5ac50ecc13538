//! Apollo's automatic persisted queries: a request sending a query's hash alone is answered
//! with the message Apollo Client's persisted-query link looks for (`PersistedQueryNotSupported`),
//! by POST and by GET, so that the link sends the query's text instead; before, the answer
//! was a generic "missing field" and every operation failed.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{Backend, TestApp, TestDb};

const HASH: &str = "ecf4edb46db40b5132295c0291d62fb65d6759a9eedfa4d5d612dd5ec54a6b38";

#[tokio::test]
async fn a_persisted_query_hash_alone_is_answered_not_supported() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let extensions = json!({ "persistedQuery": { "version": 1, "sha256Hash": HASH } });
    let query_string = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("operationName", "Q")
        .append_pair("variables", "{}")
        .append_pair("extensions", &extensions.to_string())
        .finish();
    let answers = [
        app.request(Method::POST, "/graphql")
            .bearer_auth(&admin)
            .json(&json!({ "operationName": "Q", "variables": {}, "extensions": extensions })),
        app.request(Method::GET, &format!("/graphql?{query_string}"))
            .bearer_auth(&admin)
            .header("accept", "application/json"),
        // As Apollo Client sends it by GET: accepting anything.
        app.request(Method::GET, &format!("/graphql?{query_string}"))
            .bearer_auth(&admin)
            .header("accept", "*/*"),
    ];
    for request in answers {
        let response = request.send().await.expect("answered");
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(
            body["errors"][0]["message"], "PersistedQueryNotSupported",
            "{body}"
        );
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "BAD_USER_INPUT",
            "{body}"
        );
    }

    // What the link sends next, the hash with the text, runs.
    let body = app
        .request(Method::POST, "/graphql")
        .bearer_auth(&admin)
        .json(&json!({ "query": "query Q { __typename }", "extensions": extensions }))
        .send()
        .await
        .expect("answered")
        .json::<Value>()
        .await
        .expect("JSON");
    assert_eq!(body, json!({ "data": { "__typename": "Query" } }));

    // A body without a query and without a hash says what it lacks.
    let response = app
        .request(Method::POST, "/graphql")
        .bearer_auth(&admin)
        .json(&json!({ "variables": {} }))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(
        body["errors"][0]["message"], "the body is not a GraphQL request: it has no `query`",
        "{body}"
    );
}
