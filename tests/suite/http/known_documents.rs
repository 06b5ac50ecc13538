//! Documents sent again are served from the process's cache of parsed documents: each
//! request still gets the answer a fresh parse would give (its own operation, its own
//! variables validated, the limits applied, introspection's allowance), and a refused
//! document stays refused.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::{http_client, Backend, TestApp, TestDb};

async fn post(base_url: &str, token: &str, body: Value) -> (StatusCode, Value) {
    let response = http_client()
        .post(format!("{base_url}/graphql"))
        .bearer_auth(token)
        .header("accept", "application/graphql-response+json")
        .json(&body)
        .send()
        .await
        .expect("answered");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_sent_again_is_answered_as_if_parsed_afresh() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/known")
        .await;
    let url = &app.base_url;

    // One document, two operations: each request runs the one it names.
    let two = "query Name($id: ID!) { endpoint(id: $id) { url } } \
               query Kind($id: ID!) { endpoint(id: $id) { id } }";
    for _ in 0..2 {
        let (status, body) = post(
            url,
            &admin,
            json!({ "query": two, "operationName": "Name", "variables": { "id": endpoint } }),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body["data"]["endpoint"],
            json!({ "url": "https://example.com/known" })
        );
        let (_, body) = post(
            url,
            &admin,
            json!({ "query": two, "operationName": "Kind", "variables": { "id": endpoint } }),
        )
        .await;
        assert_eq!(
            body["data"]["endpoint"],
            json!({ "id": endpoint }),
            "{body}"
        );
    }

    // The same document with variables of the wrong type is refused each time.
    let submit = "mutation($input: SubmitInput!) { submit(input: $input) { created } }";
    let good = json!({ "endpointId": endpoint, "payload": { "n": 1 } });
    let (_, body) = post(
        url,
        &admin,
        json!({ "query": submit, "variables": { "input": good } }),
    )
    .await;
    assert_eq!(body["data"]["submit"]["created"], true, "{body}");
    for _ in 0..2 {
        let (status, body) = post(
            url,
            &admin,
            json!({ "query": submit, "variables": { "input": { "endpointId": 7 } } }),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body["data"].is_null(), "{body}");
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "BAD_USER_INPUT",
            "{body}"
        );
    }

    // Introspection may nest deeper than data, on the second sending too.
    let chain = "ofType { ".repeat(14) + "name" + &" }".repeat(14);
    let introspection = format!("{{ __type(name: \"Query\") {{ {chain} }} }}");
    for _ in 0..2 {
        let (status, body) = post(url, &admin, json!({ "query": introspection })).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body["errors"].is_null(), "{body}");
    }

    // A document over the depth limit is refused every time, never kept.
    let deep = "{ deliveries { edges { node { submission { delivery { submission { delivery { \
                submission { delivery { submission { delivery { endpoint { id } } } } } } } } } } } } }";
    for _ in 0..2 {
        let (status, body) = post(url, &admin, json!({ "query": deep })).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["errors"][0]["extensions"]["limit"], "DEPTH", "{body}");
    }
}
