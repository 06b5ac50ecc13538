//! Strings with control characters in arguments that reach the database (an API key's
//! name, an event type to filter or replay by) are `BAD_USER_INPUT` on every backend: a NUL
//! is text PostgreSQL refuses, and must never surface as an internal error. Nothing is
//! written by a refused request.

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::count;
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

async fn control_characters_in_arguments_are_bad_input(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let keys_before = count(&app.state.db, "SELECT COUNT(*) AS n FROM api_keys", vec![]).await;
    for name in ["a\u{0}b", "a\u{1}b", "\u{0}"] {
        let body = app
            .graphql(
                &admin,
                "mutation($name: String!) { createApiKey(input: {name: $name, role: ADMIN}) { token } }",
                json!({ "name": name }),
            )
            .await;
        assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    }
    assert_eq!(
        count(&app.state.db, "SELECT COUNT(*) AS n FROM api_keys", vec![]).await,
        keys_before,
        "no key was written"
    );
    for event_type in ["a\u{0}b", "a b", ""] {
        let listed = app
            .graphql(
                &admin,
                "query($t: String) { deliveries(filter: {eventType: $t}) { edges { cursor } } }",
                json!({ "t": event_type }),
            )
            .await;
        assert_eq!(gql_error_code(&listed), Some("BAD_USER_INPUT"), "{listed}");
        let replayed = app
            .graphql(
                &admin,
                "mutation($t: String) { replayDeliveries(filter: {eventType: $t}) { replayed } }",
                json!({ "t": event_type }),
            )
            .await;
        assert_eq!(
            gql_error_code(&replayed),
            Some("BAD_USER_INPUT"),
            "{replayed}"
        );
    }
    // A valid type still filters.
    let listed = app
        .graphql(
            &admin,
            "{ deliveries(filter: {eventType: \"order.paid\"}) { edges { cursor } } }",
            json!({}),
        )
        .await;
    assert!(listed.get("errors").is_none(), "{listed}");
}

on_both_backends!(control_characters_in_arguments_are_bad_input);
