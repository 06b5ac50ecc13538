//! Hostile GraphQL documents from a valid key: deep nesting, exponential fragments and
//! over-budget queries are refused with 4xx and `BAD_USER_INPUT` on every transport,
//! before any work, and never crash or stall the process.

use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

use crate::on_both_backends;
use crate::support::process::spawn_serve;
use crate::support::{gql_error_code, http_client, Backend, TestApp, TestDb};

/// `[[[...1...]]]`, `depth` levels deep.
fn nested_list(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// `{a: {a: ... 1 ...}}`, `depth` levels deep.
fn nested_object(depth: usize) -> String {
    format!("{}1{}", "{a: ".repeat(depth), "}".repeat(depth))
}

/// The places a literal can hide in a document, each nested `depth` deep.
fn nested_documents(depth: usize) -> Vec<(&'static str, String)> {
    let list = nested_list(depth);
    let endpoint = uuid::Uuid::now_v7();
    vec![
        (
            "field argument",
            format!("{{ endpoints(first: {list}) {{ edges {{ cursor }} }} }}"),
        ),
        (
            "payload literal",
            format!("mutation {{ submit(input: {{endpointId: \"{endpoint}\", payload: {list}}}) {{ created }} }}"),
        ),
        (
            "variable default",
            format!("query($v: [Int] = {list}) {{ endpoints {{ edges {{ cursor }} }} }}"),
        ),
        (
            "directive argument",
            format!("{{ endpoints @include(if: {list}) {{ edges {{ cursor }} }} }}"),
        ),
        (
            "object literal",
            format!(
                "mutation {{ submit(input: {{endpointId: \"{endpoint}\", payload: {}}}) {{ created }} }}",
                nested_object(depth)
            ),
        ),
    ]
}

/// N fragments, each spreading the previous one twice: 2^N selections if expanded.
fn fragment_bomb(n: usize) -> String {
    let mut text = format!(
        "query {{ endpoints(first: 1) {{ edges {{ node {{ ...F{n} }} }} }} }}\nfragment F1 on Endpoint {{ id }}\n"
    );
    for i in 2..=n {
        text.push_str(&format!(
            "fragment F{i} on Endpoint {{ ...F{p} ...F{p} }}\n",
            p = i - 1
        ));
    }
    text
}

async fn post_document(base_url: &str, token: &str, query: &str) -> (StatusCode, Value) {
    let response = http_client()
        .post(format!("{base_url}/graphql"))
        .bearer_auth(token)
        .header("accept", "application/graphql-response+json")
        .json(&json!({ "query": query }))
        .send()
        .await
        .expect("answered");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get_document(base_url: &str, token: &str, query: &str) -> (StatusCode, Value) {
    let mut url = url::Url::parse(&format!("{base_url}/graphql")).expect("url");
    url.query_pairs_mut().append_pair("query", query);
    let response = http_client()
        .get(url.as_str())
        .bearer_auth(token)
        .header("accept", "application/json")
        .send()
        .await
        .expect("answered");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Sends `query` as a `subscribe` message over `graphql-transport-ws` and returns the
/// server's answer to it.
async fn websocket_document(addr: &str, token: &str, query: &str) -> Value {
    let mut request = format!("ws://{addr}/graphql/ws")
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_static("graphql-transport-ws"),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    for message in [
        json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } }),
        json!({ "id": "1", "type": "subscribe", "payload": { "query": query } }),
    ] {
        socket
            .send(Message::text(message.to_string()))
            .await
            .expect("send");
    }
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("the server answers in time")
            .expect("the socket stays open")
            .expect("a message");
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(&text).expect("JSON");
            if value["type"] != "connection_ack" && value["type"] != "ping" {
                return value;
            }
        }
    }
}

/// The real binary, so an abort is observed rather than inherited: every nesting vector
/// on every transport is refused, and the process is still serving afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_literals_never_abort_the_process() {
    let db = TestDb::new(Backend::Postgres).await;
    let pool = db.connect(1).await;
    let admin =
        courier::auth::create_api_key(&pool, "ops", courier::auth::Role::Admin, Default::default())
            .await
            .expect("key")
            .token;
    let (mut child, addr) = spawn_serve(&db.url, &[("COURIER_WORKER_CONCURRENCY", "0")]);
    let base_url = format!("http://{addr}");

    // GET carries the document in the URL, which the HTTP layer caps near 64 KiB.
    for depth in [1_600, 10_000, 100_000] {
        for (vector, document) in nested_documents(depth) {
            let (status, body) = post_document(&base_url, &admin, &document).await;
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "POST {vector} at {depth}: {body}"
            );
            assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
            let post_limit = body["errors"][0]["extensions"]["limit"].clone();
            assert!(post_limit.is_string(), "POST names the limit: {body}");

            // Refused before execution: an `error` message, or a `next` with errors only.
            let answer = websocket_document(&addr, &admin, &document).await;
            let errors = match answer["type"].as_str() {
                Some("error") => &answer["payload"],
                Some("next") => {
                    assert!(answer["payload"]["data"].is_null(), "{answer}");
                    &answer["payload"]["errors"]
                }
                _ => panic!("WS {vector} at {depth}: {answer}"),
            };
            assert_eq!(
                errors[0]["extensions"]["code"], "BAD_USER_INPUT",
                "{answer}"
            );
            if depth <= 1_600 {
                let (status, body) = get_document(&base_url, &admin, &document).await;
                assert_eq!(
                    status,
                    StatusCode::BAD_REQUEST,
                    "GET {vector} at {depth}: {body}"
                );
                assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
                assert_eq!(
                    body["errors"][0]["extensions"]["limit"], post_limit,
                    "GET names the same limit as POST: {body}"
                );
            }
        }
    }

    assert!(
        child.try_wait().expect("status").is_none(),
        "the process is still running"
    );
    let (status, body) = post_document(
        &base_url,
        &admin,
        "{ endpoints(first: 1) { edges { cursor } } }",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["errors"].is_null(), "{body}");
    let _ = child.kill();
    let _ = child.wait();
}

/// Exponential fragment spreads are counted before any expansion: refused at once, and
/// several in flight do not delay a cheap request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exponential_fragments_are_refused_before_the_work() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;

    let started = Instant::now();
    let (status, body) = post_document(&app.base_url, &admin, &fragment_bomb(26)).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused in {:?}",
        started.elapsed()
    );
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");

    let bombs: Vec<_> = (0..4)
        .map(|_| {
            let base_url = app.base_url.clone();
            let admin = admin.clone();
            tokio::spawn(async move { post_document(&base_url, &admin, &fragment_bomb(27)).await })
        })
        .collect();
    let started = Instant::now();
    let (status, body) = post_document(
        &app.base_url,
        &admin,
        "{ endpoints(first: 1) { edges { cursor } } }",
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "a cheap query waited {:?}",
        started.elapsed()
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    for bomb in bombs {
        let (status, body) = bomb.await.expect("joined");
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    }
}

async fn queries_cost_what_they_read(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;

    // One full page is within the budget.
    let page = "endpoints(first: 100) { edges { node { id name url } } }";
    let (status, body) = post_document(&app.base_url, &admin, &format!("{{ {page} }}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Twenty of them cost 20 x 100 x 5 = 10,000: refused before execution.
    let aliased: String = (0..20).map(|i| format!("a{i}: {page} ")).collect();
    let (status, body) = post_document(&app.base_url, &admin, &format!("{{ {aliased} }}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    assert_eq!(body["errors"][0]["extensions"]["limit"], "COST", "{body}");
    assert!(body.get("data").is_none(), "nothing ran: {body}");

    // Three hundred aliased roots are refused however small each is.
    let roots: String = (0..300)
        .map(|i| format!("a{i}: endpoints(first: 1) {{ edges {{ cursor }} }} "))
        .collect();
    let (status, body) = post_document(&app.base_url, &admin, &format!("{{ {roots} }}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");

    // An out-of-range page size gets a code like every other bad input.
    for first in ["2147483648", "-1", "101"] {
        let (_, body) = post_document(
            &app.base_url,
            &admin,
            &format!("{{ endpoints(first: {first}) {{ edges {{ cursor }} }} }}"),
        )
        .await;
        assert_eq!(
            gql_error_code(&body),
            Some("BAD_USER_INPUT"),
            "first: {first}: {body}"
        );
    }
    let body = app
        .graphql(
            &admin,
            "query($n: Int) { endpoints(first: $n) { edges { cursor } } }",
            json!({ "n": 2_147_483_648_u64 }),
        )
        .await;
    assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
}

on_both_backends!(queries_cost_what_they_read);

/// Thousands of fields with one response name (which validation compares pairwise) within
/// the budget: answered, and a cheap query meanwhile is not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_fields_do_not_stall_other_requests() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let repeated = format!(
        "{{ endpoints(first: 1) {{ edges {{ node {{ {} }} }} }} }}",
        "id ".repeat(4_900)
    );
    let heavy: Vec<_> = (0..4)
        .map(|_| {
            let base_url = app.base_url.clone();
            let admin = admin.clone();
            let repeated = repeated.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let answer = post_document(&base_url, &admin, &repeated).await;
                (answer, started.elapsed())
            })
        })
        .collect();
    let started = Instant::now();
    let (status, body) = post_document(
        &app.base_url,
        &admin,
        "{ endpoints(first: 1) { edges { cursor } } }",
    )
    .await;
    let cheap = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{body}");
    for task in heavy {
        let ((status, _), took) = task.await.expect("joined");
        eprintln!("heavy document answered {status} in {took:?}");
    }
    assert!(
        cheap < Duration::from_secs(1),
        "a cheap query waited {cheap:?}"
    );
}

/// graphql-js's standard introspection query (what GraphiQL sends to load the schema): its
/// type references nest fifteen selections deep.
const INTROSPECTION: &str = "query IntrospectionQuery {
  __schema {
    queryType { name } mutationType { name } subscriptionType { name }
    types { ...FullType }
    directives { name description locations args { ...InputValue } }
  }
}
fragment FullType on __Type {
  kind name description
  fields(includeDeprecated: true) {
    name description args { ...InputValue } type { ...TypeRef } isDeprecated deprecationReason
  }
  inputFields { ...InputValue }
  interfaces { ...TypeRef }
  enumValues(includeDeprecated: true) { name description isDeprecated deprecationReason }
  possibleTypes { ...TypeRef }
}
fragment InputValue on __InputValue { name description type { ...TypeRef } defaultValue }
fragment TypeRef on __Type {
  kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name
  ofType { kind name ofType { kind name ofType { kind name ofType { kind name
  ofType { kind name } } } } } } } } }
}";

/// GraphiQL can load the schema: an operation that only introspects may nest deeper than
/// data queries, which keep their limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_introspection_query_passes_and_deep_data_queries_do_not() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;

    let (status, body) = post_document(&app.base_url, &admin, INTROSPECTION).await;
    assert_eq!(status, StatusCode::OK, "{}", body["errors"]);
    assert_eq!(body["data"]["__schema"]["queryType"]["name"], "Query");

    // Thirteen deep through data: refused, also when an introspection field rides along.
    let deep = "deliveries { edges { node { submission { delivery { submission { delivery { \
                submission { delivery { submission { delivery { endpoint { id } } } } } } } } } } } }";
    for query in [format!("{{ {deep} }}"), format!("{{ __typename {deep} }}")] {
        let (status, body) = post_document(&app.base_url, &admin, &query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["errors"][0]["extensions"]["limit"], "DEPTH", "{body}");
    }
    // Introspection has a limit too.
    let ref_chain = "ofType { ".repeat(20) + "name" + &" }".repeat(20);
    let (status, body) = post_document(
        &app.base_url,
        &admin,
        &format!("{{ __type(name: \"Query\") {{ {ref_chain} }} }}"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["errors"][0]["extensions"]["limit"], "DEPTH", "{body}");
}
