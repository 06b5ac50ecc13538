//! `__typename` is held to the rules every other field is: an argument, a selection, an
//! unknown directive or a directive argument of the wrong type is refused before anything
//! runs, and a variable used only in its directive counts as used (async-graphql's
//! validation passed over `__typename` altogether); at a subscription's root it is refused
//! once (the same error came twice).

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Backend, TestApp, TestDb};

#[tokio::test]
async fn typename_is_held_to_the_rules() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    app.create_endpoint(&admin, "https://example.com/a").await;

    for (query, refusal) in [
        ("{ __typename @foo }", "Unknown directive"),
        (
            "{ __typename(x: 1) }",
            r#"Unknown argument "x" on field "__typename"."#,
        ),
        (
            "{ endpoints { __typename { y } } }",
            "must not have a selection",
        ),
        ("{ __typename @skip(if: \"yes\") }", "if"),
        (
            "{ __typename @deprecated }",
            r#"Directive "deprecated" may not be used on "FIELD""#,
        ),
        (
            "query { ...F } fragment F on Query { __typename @include(if: $nope) }",
            "$nope",
        ),
    ] {
        let (status, body) = app.graphql_response(&admin, query, json!({})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert!(body.get("data").is_none(), "{query}: {body}");
        let message = body["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.contains(refusal), "{query}: {body}");
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "BAD_USER_INPUT",
            "{body}"
        );
    }

    for (query, variables, expected) in [
        (
            "query($s: Boolean!) { t: __typename @include(if: $s) }",
            json!({ "s": true }),
            json!({ "t": "Query" }),
        ),
        (
            "query($s: Boolean!) { t: __typename @include(if: $s) }",
            json!({ "s": false }),
            json!({}),
        ),
        (
            "query($s: Boolean!) { endpoints(first: 1) { __typename @include(if: $s) \
             edges { node { __typename @skip(if: $s) } } } }",
            json!({ "s": true }),
            json!({ "endpoints": { "__typename": "EndpointConnection", "edges": [{ "node": {} }] } }),
        ),
        (
            "query($s: Boolean!) { ...F } fragment F on Query { __typename @include(if: $s) }",
            json!({ "s": true }),
            json!({ "__typename": "Query" }),
        ),
    ] {
        let (status, body) = app.graphql_response(&admin, query, variables).await;
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
        assert_eq!(body, json!({ "data": expected }), "{query}");
    }
}

/// `__typename` at a subscription's root is refused with one error, not the same one twice.
#[tokio::test]
async fn typename_at_a_subscription_root_is_refused_once() {
    use crate::support::websocket::{initialised, next, send};

    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let mut socket = initialised(&app, "graphql-transport-ws", &admin).await;
    send(
        &mut socket,
        json!({ "id": "1", "type": "subscribe", "payload": { "query": "subscription { __typename }" } }),
    )
    .await;
    let refused = next(&mut socket).await.expect("an answer");
    assert_eq!(refused["type"], "error", "{refused}");
    let errors = refused["payload"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{refused}");
    assert_eq!(
        errors[0]["extensions"]["code"], "BAD_USER_INPUT",
        "{refused}"
    );
}
