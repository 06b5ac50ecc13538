//! Bad and hostile HTTP input: clear 4xx answers with codes, never a 5xx, never a half-written row.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::on_both_backends;
use crate::support::fixtures::endpoint_count;
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

async fn post_raw(
    app: &TestApp,
    token: &str,
    content_type: &str,
    body: impl Into<reqwest::Body>,
) -> (StatusCode, String) {
    let response = app
        .request(Method::POST, "/graphql")
        .bearer_auth(token)
        .header("accept", "application/graphql-response+json")
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("answered");
    let status = response.status();
    (status, response.text().await.unwrap_or_default())
}

async fn malformed_requests_get_400_with_a_code(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    for body in [
        "{not json",
        "[]",
        "\"a string\"",
        "{}",
        "{\"query\": 42}",
        "{\"query\": \"{ endpoints { edges { cursor } } }\", \"variables\": [1]}",
        "{\"query\": \"{ __typename }\", \"extensions\": \"x\"}",
        "{\"query\": \"{ __typename }\", \"extensions\": [1]}",
        "{\"query\": \"mutation { createEndpoint(input: {name: \\\"x\\\", url: \\\"https://example.com\\\"}) { endpoint { id } } }\"",
    ] {
        let (status, text) = post_raw(&app, &admin, "application/json", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {text}");
        let parsed: Value = serde_json::from_str(&text).expect("a JSON error body");
        assert_eq!(gql_error_code(&parsed), Some("BAD_USER_INPUT"), "{text}");
    }
    // JSON is UTF-8, in members Courier does not read too.
    let mut not_utf8 = br#"{"query": "{ __typename }", "note": ""#.to_vec();
    not_utf8.extend([0xff, 0xfe]);
    not_utf8.extend(br#""}"#);
    let (status, text) = post_raw(&app, &admin, "application/json", not_utf8).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("not UTF-8"), "{text}");
    // A byte-order mark before the JSON (some clients write one) is read past (RFC 8259,
    // section 8.1), once: a second is not JSON.
    let with_bom = "\u{feff}{\"query\": \"{ __typename }\"}";
    let (status, text) = post_raw(&app, &admin, "application/json", with_bom).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, text) = post_raw(
        &app,
        &admin,
        "application/json",
        format!("\u{feff}{with_bom}"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    // Extensions that are a map are accepted (and unused).
    let (status, text) = post_raw(
        &app,
        &admin,
        "application/json",
        r#"{"query": "{ __typename }", "extensions": {"persistedQuery": null}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    // A batch is refused saying so.
    let batch = json!([{ "query": "{ endpoints { edges { cursor } } }" }]).to_string();
    let (status, text) = post_raw(&app, &admin, "application/json", batch).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(
        text.contains("batched requests are not supported"),
        "{text}"
    );
    for query in [
        "{ endpoints { edges ",
        "{ noSuchField }",
        "mutation { createEndpoint { id } }",
    ] {
        let (status, text) = post_raw(
            &app,
            &admin,
            "application/json",
            json!({ "query": query }).to_string(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query} -> {text}");
        let parsed: Value = serde_json::from_str(&text).expect("json");
        assert!(
            parsed.get("data").is_none(),
            "a request that did not run has no data: {text}"
        );
        assert_eq!(gql_error_code(&parsed), Some("BAD_USER_INPUT"), "{text}");
    }
    assert_eq!(endpoint_count(&app).await, 0, "nothing was written");
}

/// A body naming a member twice in one object is refused, wherever the repeat is: before,
/// variables and payloads kept the last value (`{"e": A, "e": B}` ran against B).
async fn a_member_named_twice_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let create = "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id } } }";
    for (body, name) in [
        (
            format!(
                r#"{{"query": "{create}", "variables": {{"input": {{"name": "a", "url": "https://example.com/a", "name": "b"}}}}}}"#
            ),
            "name",
        ),
        (
            format!(
                r#"{{"query": "{create}", "variables": {{"input": {{"name": "a", "url": "https://example.com/a"}}, "input": {{}}}}}}"#
            ),
            "input",
        ),
        (
            r#"{"query": "{ __typename }", "query": "{ __typename }"}"#.to_owned(),
            "query",
        ),
    ] {
        let (status, text) = post_raw(&app, &admin, "application/json", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {text}");
        let parsed: Value = serde_json::from_str(&text).expect("a JSON error body");
        assert_eq!(gql_error_code(&parsed), Some("BAD_USER_INPUT"), "{text}");
        assert!(
            text.contains(&format!("names \\\"{name}\\\" twice")),
            "{text}"
        );
    }
    let mut url = reqwest::Url::parse("http://courier.invalid/graphql").expect("a URL");
    url.query_pairs_mut()
        .append_pair(
            "query",
            "query($f: Int) { endpoints(first: $f) { edges { cursor } } }",
        )
        .append_pair("variables", r#"{"f": 1, "f": 2}"#);
    let response = app
        .request(
            Method::GET,
            &format!("/graphql?{}", url.query().unwrap_or_default()),
        )
        .bearer_auth(&admin)
        .header("accept", "application/json")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(endpoint_count(&app).await, 0, "nothing was written");
    // The same names in sibling objects, and names differing in case, are distinct.
    let body = format!(
        r#"{{"query": "{create}", "variables": {{"input": {{"name": "a", "url": "https://example.com/a"}}, "Input": {{"name": "b"}}}}}}"#
    );
    let (status, text) = post_raw(&app, &admin, "application/json", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

async fn oversized_bodies_get_413_and_write_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| config.max_body_bytes = 64 * 1024).await;
    let admin = app.admin_token().await;
    let huge_name = "x".repeat(100 * 1024);
    let body = json!({
        "query": "mutation($name: String!) { createEndpoint(input: {name: $name, url: \"https://example.com\"}) { endpoint { id } } }",
        "variables": { "name": huge_name },
    });
    let (status, answer) = post_raw(&app, &admin, "application/json", body.to_string()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let error: Value = serde_json::from_str(&answer).expect("a GraphQL error");
    assert_eq!(gql_error_code(&error), Some("BAD_USER_INPUT"), "{answer}");

    // Without a Content-Length (chunked), the limit still holds.
    let chunks: Vec<Result<String, std::io::Error>> = vec![Ok(body.to_string())];
    let stream = futures_util::stream::iter(chunks);
    let (status, answer) = post_raw(
        &app,
        &admin,
        "application/json",
        reqwest::Body::wrap_stream(stream),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let error: Value = serde_json::from_str(&answer).expect("a GraphQL error");
    assert_eq!(gql_error_code(&error), Some("BAD_USER_INPUT"), "{answer}");
    assert_eq!(endpoint_count(&app).await, 0);

    // A length over the limit is refused as soon as it is declared, before any body.
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    for declared in ["2000000", "99999999999"] {
        let mut stream = tokio::net::TcpStream::connect(app.addr)
            .await
            .expect("connect");
        let head = format!(
            "POST /graphql HTTP/1.1\r\nhost: courier\r\nauthorization: Bearer {admin}\r\n\
             content-type: application/json\r\ncontent-length: {declared}\r\n\r\n{{\"q"
        );
        stream.write_all(head.as_bytes()).await.expect("write");
        let mut answer = vec![0u8; 512];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut answer))
            .await
            .expect("answered without waiting for the body")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer[..read]);
        assert!(answer.starts_with("HTTP/1.1 413"), "{declared}: {answer}");
    }
}

on_both_backends!(
    malformed_requests_get_400_with_a_code,
    a_member_named_twice_is_refused,
    oversized_bodies_get_413_and_write_nothing
);

#[tokio::test]
async fn too_deep_or_too_complex_queries_are_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let deep = format!(
        "{{ __schema {{ types {{ fields {{ type {{ {} name {} }} }} }} }} }}",
        "ofType { ".repeat(20),
        "} ".repeat(20)
    );
    let (status, text) = post_raw(
        &app,
        &admin,
        "application/json",
        json!({ "query": deep }).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(
        text.contains("BAD_USER_INPUT") && text.to_lowercase().contains("deep"),
        "{text}"
    );

    let aliases: String = (0..1000)
        .map(|i| format!("a{i}: endpoints {{ edges {{ cursor }} }} "))
        .collect();
    let (status, text) = post_raw(
        &app,
        &admin,
        "application/json",
        json!({ "query": format!("{{ {aliases} }}") }).to_string(),
    )
    .await;
    let head: String = text.chars().take(300).collect();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{head}");
    assert!(text.contains("BAD_USER_INPUT"), "{head}");
}

#[tokio::test]
async fn media_types_and_methods_follow_graphql_over_http() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let query = json!({ "query": "{ endpoints { edges { cursor } } }" }).to_string();

    let (status, _) = post_raw(&app, &admin, "text/plain", query.clone()).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // JSON declared in another charset would be read wrongly: refused, not read as UTF-8.
    let utf16 = "application/json; charset=utf-16";
    let (status, _) = post_raw(&app, &admin, utf16, query.clone()).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let utf8 = "application/json; charset=UTF-8";
    let (status, _) = post_raw(&app, &admin, utf8, query.clone()).await;
    assert_eq!(status, StatusCode::OK);

    // A body declared compressed is refused, not read as if it were plain: nothing runs.
    let create = json!({ "query": "mutation { createEndpoint(input: {name: \"z\", \
        url: \"https://example.com/z\"}) { endpoint { id } } }" })
    .to_string();
    for coding in ["gzip", "br", "identity, gzip"] {
        let refused = app
            .request(Method::POST, "/graphql")
            .bearer_auth(&admin)
            .header("content-type", "application/json")
            .header("content-encoding", coding)
            .body(create.clone())
            .send()
            .await
            .expect("answered");
        assert_eq!(
            refused.status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{coding}"
        );
        assert_eq!(refused.headers()["accept-encoding"], "identity", "{coding}");
        let body: serde_json::Value = refused.json().await.expect("a JSON body");
        assert_eq!(body["errors"][0]["extensions"]["code"], "BAD_USER_INPUT");
    }
    let listed = app
        .graphql(&admin, "{ endpoints { edges { cursor } } }", json!({}))
        .await;
    assert_eq!(listed["data"]["endpoints"]["edges"], json!([]), "{listed}");
    // Without a key, 401 whatever else is wrong with the request.
    for (content_type, coding) in [("text/plain", "identity"), ("application/json", "br")] {
        let refused = app
            .request(Method::POST, "/graphql")
            .header("content-type", content_type)
            .header("content-encoding", coding)
            .body(query.clone())
            .send()
            .await
            .expect("answered");
        assert_eq!(
            refused.status(),
            StatusCode::UNAUTHORIZED,
            "{content_type}, {coding}"
        );
    }
    let identity = app
        .request(Method::POST, "/graphql")
        .bearer_auth(&admin)
        .header("content-type", "application/json")
        .header("content-encoding", "identity")
        .body(query.clone())
        .send()
        .await
        .expect("answered");
    assert_eq!(identity.status(), StatusCode::OK);

    let ok = app
        .request(Method::POST, "/graphql")
        .bearer_auth(&admin)
        .header("content-type", "application/json; charset=utf-8")
        .body(query.clone())
        .send()
        .await
        .expect("answered");
    assert_eq!(ok.status(), StatusCode::OK);
    let content_type = ok.headers()["content-type"]
        .to_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("application/json"),
        "no Accept header gets application/json: {content_type}"
    );
    for accept in ["*/*", "application/*", "application/json"] {
        let answered = app
            .request(Method::POST, "/graphql")
            .bearer_auth(&admin)
            .header("accept", accept)
            .header("content-type", "application/json")
            .body(query.clone())
            .send()
            .await
            .expect("answered");
        assert!(
            answered.headers()["content-type"]
                .to_str()
                .unwrap_or_default()
                .starts_with("application/json"),
            "Accept: {accept}"
        );
    }
    let modern = app
        .request(Method::POST, "/graphql")
        .bearer_auth(&admin)
        .header("accept", "application/graphql-response+json")
        .header("content-type", "application/json")
        .body(query.clone())
        .send()
        .await
        .expect("answered");
    assert!(modern.headers()["content-type"]
        .to_str()
        .unwrap_or_default()
        .starts_with("application/graphql-response+json"));

    // A required variable left out is a request error: nothing runs, no `data`.
    let missing = app
        .request(Method::POST, "/graphql")
        .bearer_auth(&admin)
        .header("accept", "application/graphql-response+json")
        .json(&json!({ "query": "query($id: ID!) { delivery(id: $id) { id } }" }))
        .send()
        .await
        .expect("answered");
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    let body: Value = missing.json().await.expect("json");
    assert!(body.get("data").is_none(), "{body}");
    assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");

    // application/json when asked: a request that cannot run is still a 200 there.
    let legacy = app
        .request(Method::POST, "/graphql")
        .bearer_auth(&admin)
        .header("accept", "application/json")
        .json(&json!({ "query": "{ noSuchField }" }))
        .send()
        .await
        .expect("answered");
    assert_eq!(legacy.status(), StatusCode::OK);
    assert!(legacy.headers()["content-type"]
        .to_str()
        .unwrap_or_default()
        .starts_with("application/json"));
    let body: Value = legacy.json().await.expect("json");
    assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");

    let unacceptable = app
        .request(Method::POST, "/graphql")
        .bearer_auth(&admin)
        .header("accept", "text/csv")
        .json(&json!({ "query": "{ endpoints { edges { cursor } } }" }))
        .send()
        .await
        .expect("answered");
    assert_eq!(unacceptable.status(), StatusCode::NOT_ACCEPTABLE);

    let get_query = app
        .request(
            Method::GET,
            "/graphql?query=%7B%20endpoints%20%7B%20edges%20%7B%20cursor%20%7D%20%7D%20%7D",
        )
        .bearer_auth(&admin)
        .send()
        .await
        .expect("answered");
    assert_eq!(get_query.status(), StatusCode::OK);
    let body: Value = get_query.json().await.expect("json");
    assert!(body["data"]["endpoints"]["edges"].is_array(), "{body}");

    let get_mutation = app
        .request(Method::GET, "/graphql?query=mutation%20%7B%20createEndpoint(input%3A%7Bname%3A%22x%22%2Curl%3A%22https%3A%2F%2Fexample.com%22%7D)%20%7B%20secret%20%7D%20%7D")
        .bearer_auth(&admin)
        .send()
        .await
        .expect("answered");
    assert_eq!(get_mutation.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(endpoint_count(&app).await, 0, "a GET never mutates");

    // A document holding a mutation beside the query it selects runs the query.
    let document = r#"query A { endpoints { edges { cursor } } } mutation B { createEndpoint(input: {name: "x", url: "https://example.com"}) { secret } }"#;
    let mut url = reqwest::Url::parse("http://courier.invalid/graphql").expect("a URL");
    for (name, selected, status) in [
        ("A", true, StatusCode::OK),
        ("B", false, StatusCode::METHOD_NOT_ALLOWED),
    ] {
        url.query_pairs_mut()
            .clear()
            .append_pair("query", document)
            .append_pair("operationName", name);
        let path = format!("/graphql?{}", url.query().unwrap_or_default());
        let answer = app
            .request(Method::GET, &path)
            .bearer_auth(&admin)
            .send()
            .await
            .expect("answered");
        let got = answer.status();
        let body: Value = answer.json().await.expect("json");
        assert_eq!(got, status, "{name}: {body}");
        assert_eq!(
            body["data"]["endpoints"]["edges"].is_array(),
            selected,
            "{name}: {body}"
        );
    }
    assert_eq!(endpoint_count(&app).await, 0, "a GET never mutates");
}
