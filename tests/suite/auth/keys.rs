//! Authentication and authorisation: missing and wrong keys, partner scope, tokens stored only as hashes.

use courier::auth::Role;
use reqwest::StatusCode;
use sea_orm::{ConnectionTrait, EntityTrait, Statement};
use serde_json::json;

use crate::on_both_backends;
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

async fn missing_or_wrong_keys_are_unauthenticated(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let query = json!({ "query": "{ endpoints { edges { cursor } } }" });

    let missing = app.post_graphql(None, &query).await;
    assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
    let body: serde_json::Value = missing.json().await.expect("json");
    assert_eq!(gql_error_code(&body), Some("UNAUTHENTICATED"), "{body}");

    let wrong = app
        .post_graphql(Some("courier_not-a-real-token"), &query)
        .await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let body: serde_json::Value = wrong.json().await.expect("json");
    assert_eq!(gql_error_code(&body), Some("UNAUTHENTICATED"), "{body}");

    let introspection = app
        .post_graphql(
            None,
            &json!({ "query": "{ __schema { queryType { name } } }" }),
        )
        .await;
    assert_eq!(
        introspection.status(),
        StatusCode::UNAUTHORIZED,
        "nothing answers without a key"
    );

    // A legacy client asking for application/json gets the same code and status.
    let legacy = app
        .request(reqwest::Method::POST, "/graphql")
        .header("accept", "application/json")
        .json(&query)
        .send()
        .await
        .expect("answered");
    assert_eq!(legacy.status(), StatusCode::UNAUTHORIZED);
    let body: serde_json::Value = legacy.json().await.expect("json");
    assert_eq!(gql_error_code(&body), Some("UNAUTHENTICATED"), "{body}");

    // Two `Authorization` headers leave the caller ambiguous, whichever comes first.
    let admin = app.admin_token().await;
    for pair in [
        ["courier_wrong", admin.as_str()],
        [admin.as_str(), "courier_wrong"],
    ] {
        let two = app
            .request(reqwest::Method::POST, "/graphql")
            .header("authorization", format!("Bearer {}", pair[0]))
            .header("authorization", format!("Bearer {}", pair[1]))
            .json(&query)
            .send()
            .await
            .expect("answered");
        assert_eq!(two.status(), StatusCode::UNAUTHORIZED, "{pair:?}");
    }
}

async fn partners_are_confined_to_their_scope(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (mine, _) = app
        .create_endpoint(&admin, "https://example.com/mine")
        .await;
    let (theirs, _) = app
        .create_endpoint(&admin, "https://example.com/theirs")
        .await;
    let partner = app
        .token(
            Role::Partner,
            &[uuid::Uuid::parse_str(&mine).expect("uuid")],
        )
        .await;

    let own = app
        .graphql(
            &partner,
            "query($id: ID!) { endpoint(id: $id) { id } }",
            json!({ "id": mine }),
        )
        .await;
    assert_eq!(own["data"]["endpoint"]["id"], mine.as_str(), "{own}");

    let other = app
        .graphql(
            &partner,
            "query($id: ID!) { endpoint(id: $id) { id } }",
            json!({ "id": theirs }),
        )
        .await;
    assert_eq!(gql_error_code(&other), Some("FORBIDDEN"), "{other}");

    let listed = app
        .graphql(
            &partner,
            "{ endpoints { edges { node { id } } } }",
            json!({}),
        )
        .await;
    let ids: Vec<&str> = listed["data"]["endpoints"]["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .filter_map(|edge| edge["node"]["id"].as_str())
        .collect();
    assert_eq!(ids, vec![mine.as_str()], "a partner lists only its scope");

    let create = app
        .graphql(&partner, "mutation { createEndpoint(input: {name: \"x\", url: \"https://example.com\"}) { endpoint { id } } }", json!({}))
        .await;
    assert_eq!(gql_error_code(&create), Some("FORBIDDEN"), "{create}");
    let update = app
        .graphql(&partner, "mutation($id: ID!) { updateEndpoint(id: $id, input: {name: \"x\"}) { endpoint { id } } }", json!({ "id": mine }))
        .await;
    assert_eq!(gql_error_code(&update), Some("FORBIDDEN"), "{update}");
}

async fn tokens_are_stored_only_as_hashes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let token = app.admin_token().await;
    let keys = entity::api_key::Entity::find()
        .all(app.state.db.conn())
        .await
        .expect("keys");
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].token_hash, courier::auth::hash_token(&token));
    assert!(!keys[0].token_hash.contains(&token));

    // No column of any row holds the token.
    let backend = app.state.db.backend();
    let rows = app
        .state
        .db
        .conn()
        .query_all_raw(Statement::from_string(
            backend,
            "SELECT id, name, role, token_hash FROM api_keys",
        ))
        .await
        .expect("rows");
    for row in rows {
        let hash: String = row.try_get("", "token_hash").expect("hash");
        let name: String = row.try_get("", "name").expect("name");
        assert!(!hash.contains(&token) && !name.contains(&token));
    }
}

async fn revoked_keys_authenticate_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    // Keys are remembered briefly; a revoked key stops working once that has passed.
    let app = TestApp::spawn_with(&db, |config| config.auth_cache_ms = 300).await;
    let token = app.admin_token().await;
    let ok = app
        .graphql(&token, "{ endpoints { edges { cursor } } }", json!({}))
        .await;
    assert!(ok.get("errors").is_none(), "{ok}");
    app.state
        .db
        .conn()
        .execute_unprepared("UPDATE api_keys SET revoked_at = created_at")
        .await
        .expect("revoke");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let refused = app
        .graphql(&token, "{ endpoints { edges { cursor } } }", json!({}))
        .await;
    assert_eq!(
        gql_error_code(&refused),
        Some("UNAUTHENTICATED"),
        "{refused}"
    );
    let fresh = app.admin_token().await;
    let works = app
        .graphql(&fresh, "{ endpoints { edges { cursor } } }", json!({}))
        .await;
    assert!(
        works.get("errors").is_none(),
        "a new key works at once: {works}"
    );
}

on_both_backends!(
    missing_or_wrong_keys_are_unauthenticated,
    partners_are_confined_to_their_scope,
    tokens_are_stored_only_as_hashes,
    revoked_keys_authenticate_nothing,
);
