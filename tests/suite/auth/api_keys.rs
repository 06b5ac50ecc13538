//! API keys over GraphQL and the CLI: admins create, list and revoke them; lists never show
//! tokens or hashes; `lastUsedAt` is kept coarsely; a revocation made anywhere (another
//! instance, the CLI) is felt by every instance within a second.

use std::process::Command;
use std::time::Duration;

use courier::auth::{create_api_key, hash_token, Role};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::on_both_backends;
use crate::support::fixtures::poll;
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

const CREATE: &str = "mutation($input: CreateApiKeyInput!) { createApiKey(input: $input) { token apiKey { id name role endpoints { id } createdAt revokedAt lastUsedAt } } }";
const LIST: &str = "{ apiKeys(first: 50) { edges { cursor node { id name role endpoints { id } createdAt revokedAt lastUsedAt } } pageInfo { hasNextPage } } }";
const REVOKE: &str = "mutation($id: ID!) { revokeApiKey(id: $id) { id revokedAt } }";
const WHO_AM_I: &str = "{ endpoints(first: 1) { edges { node { id } } } }";

fn listed<'a>(list: &'a Value, id: &str) -> &'a Value {
    list["data"]["apiKeys"]["edges"]
        .as_array()
        .and_then(|edges| edges.iter().find(|edge| edge["node"]["id"] == id))
        .map(|edge| &edge["node"])
        .unwrap_or_else(|| panic!("{id} not listed: {list}"))
}

/// Polls `app` with `token` until it is refused; returns how long that took.
async fn refused_within(app: &TestApp, token: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let body = app.graphql(token, WHO_AM_I, json!({})).await;
        if gql_error_code(&body) == Some("UNAUTHENTICATED") {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "still accepted: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn admins_manage_keys_over_graphql(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app.create_endpoint(&admin, "http://127.0.0.1:9/hook").await;

    let input = json!({ "name": "partner one", "role": "PARTNER", "endpointIds": [endpoint] });
    let created = app.graphql(&admin, CREATE, json!({ "input": input })).await;
    let token = created["data"]["createApiKey"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    let key = &created["data"]["createApiKey"]["apiKey"];
    let key_id = key["id"].as_str().unwrap().to_owned();
    assert_eq!(key["role"], "PARTNER");
    assert_eq!(key["endpoints"][0]["id"], endpoint.as_str());
    assert!(key["revokedAt"].is_null() && key["lastUsedAt"].is_null());

    // The partner's token works, within its scope.
    let seen = app.graphql(&token, WHO_AM_I, json!({})).await;
    assert_eq!(
        seen["data"]["endpoints"]["edges"][0]["node"]["id"],
        endpoint.as_str()
    );
    for (query, variables) in [(LIST, json!({})), (CREATE, json!({ "input": input }))] {
        let refused = app.graphql(&token, query, variables).await;
        assert_eq!(gql_error_code(&refused), Some("FORBIDDEN"), "{refused}");
    }
    // `input` refused as bad input; the answer, for more to be said of it.
    let refused_as_bad = |input: serde_json::Value| {
        let (app, admin) = (&app, &admin);
        async move {
            let refused = app.graphql(admin, CREATE, json!({ "input": input })).await;
            assert_eq!(
                gql_error_code(&refused),
                Some("BAD_USER_INPUT"),
                "{refused}"
            );
            refused
        }
    };
    refused_as_bad(json!({ "name": "a", "role": "ADMIN", "endpointIds": [endpoint] })).await;

    // A list longer than a key may hold is refused before anything is looked up or kept.
    let keys = || async {
        let listed = app.graphql(&admin, LIST, json!({})).await;
        listed["data"]["apiKeys"]["edges"].as_array().map(Vec::len)
    };
    let keys_before = keys().await;
    let too_many: Vec<String> = (0..=courier::auth::MAX_KEY_ENDPOINTS)
        .map(|_| uuid::Uuid::now_v7().to_string())
        .collect();
    let refused =
        refused_as_bad(json!({ "name": "long", "role": "PARTNER", "endpointIds": too_many })).await;
    assert!(
        refused["errors"][0]["message"]
            .as_str()
            .is_some_and(|message| message.contains("at most 1000")),
        "{refused}"
    );
    assert_eq!(keys().await, keys_before);
    // So is one that names a single endpoint that many times.
    let repeated = vec![endpoint.clone(); courier::auth::MAX_KEY_ENDPOINTS + 1];
    refused_as_bad(json!({ "name": "repeats", "role": "PARTNER", "endpointIds": repeated })).await;
    assert_eq!(keys().await, keys_before);

    // A partner key with no endpoints is a key that reaches none of them.
    let empty = json!({ "name": "no scope", "role": "PARTNER" });
    let created = app.graphql(&admin, CREATE, json!({ "input": empty })).await;
    assert_eq!(
        created["data"]["createApiKey"]["apiKey"]["endpoints"],
        json!([]),
        "{created}"
    );
    let unscoped = created["data"]["createApiKey"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    let seen = app.graphql(&unscoped, WHO_AM_I, json!({})).await;
    assert_eq!(seen["data"]["endpoints"]["edges"], json!([]), "{seen}");
    let submitted = app
        .graphql(
            &unscoped,
            "mutation($e: ID!) { submit(input: { endpointId: $e, payload: {} }) { created } }",
            json!({ "e": endpoint }),
        )
        .await;
    assert_eq!(gql_error_code(&submitted), Some("FORBIDDEN"), "{submitted}");

    // Listed with its use recorded, and never with a token or a hash.
    let (app_ref, admin_ref, key_ref) = (&app, &admin, &key_id);
    let list = poll(
        "lastUsedAt is recorded",
        Duration::from_secs(5),
        || async move {
            let list = app_ref.graphql(admin_ref, LIST, json!({})).await;
            if listed(&list, key_ref)["lastUsedAt"].is_string() {
                Ok(list)
            } else {
                Err(list.to_string())
            }
        },
    )
    .await;
    let first_use = listed(&list, &key_id)["lastUsedAt"].clone();
    let text = list.to_string();
    assert!(!text.contains(&token) && !text.contains(&hash_token(&token)));
    assert!(!text.contains(&admin) && !text.contains(&hash_token(&admin)));
    assert_eq!(listed(&list, &key_id)["name"], "partner one");

    // Coarse: more requests within the minute write nothing new.
    for _ in 0..5 {
        app.graphql(&token, WHO_AM_I, json!({})).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = app.graphql(&admin, LIST, json!({})).await;
    assert_eq!(listed(&again, &key_id)["lastUsedAt"], first_use);

    let revoked = app.graphql(&admin, REVOKE, json!({ "id": key_id })).await;
    let revoked_at = revoked["data"]["revokeApiKey"]["revokedAt"].clone();
    assert!(revoked_at.is_string(), "{revoked}");
    refused_within(&app, &token, Duration::from_secs(1)).await;
    let twice = app.graphql(&admin, REVOKE, json!({ "id": key_id })).await;
    assert_eq!(
        twice["data"]["revokeApiKey"]["revokedAt"], revoked_at,
        "the first time stands"
    );
    let unknown = uuid::Uuid::now_v7().to_string();
    let missing = app.graphql(&admin, REVOKE, json!({ "id": unknown })).await;
    assert_eq!(gql_error_code(&missing), Some("NOT_FOUND"), "{missing}");
}

/// A revocation through one instance's GraphQL API is felt by another within a second.
async fn a_revocation_on_one_instance_is_felt_by_another(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (a, b) = (TestApp::spawn(&db).await, TestApp::spawn(&db).await);
    let admin = a.admin_token().await;
    let token = b.token(Role::Admin, &[]).await;
    // B has the key cached.
    assert!(gql_error_code(&b.graphql(&token, WHO_AM_I, json!({})).await).is_none());
    let id = key_id_of(&a, &token).await;
    let revoked = a.graphql(&admin, REVOKE, json!({ "id": id })).await;
    assert!(
        revoked["data"]["revokeApiKey"]["revokedAt"].is_string(),
        "{revoked}"
    );
    refused_within(&b, &token, Duration::from_secs(1)).await;
}

/// The key id of `token`, found by its hash (the API never shows hashes).
async fn key_id_of(app: &TestApp, token: &str) -> String {
    let identity = courier::auth::authenticate(&app.state.db, Some(&format!("Bearer {token}")))
        .await
        .expect("a live token");
    identity.key_id.to_string()
}

fn courier_cli(database_url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_courier"));
    command
        .env("DATABASE_URL", database_url)
        .env("COURIER_LOG_FORMAT", "json");
    command
}

/// `courier api-key list` prints keys without tokens or hashes; `courier api-key revoke`,
/// another process, makes a running instance refuse the key within a second.
async fn the_cli_lists_and_revokes_keys(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let token = app.admin_token().await;
    assert!(gql_error_code(&app.graphql(&token, WHO_AM_I, json!({})).await).is_none());
    let id = key_id_of(&app, &token).await;
    // A portal link's key, which expires.
    let tenant = app
        .graphql(
            &token,
            r#"mutation { createTenant(input: {name: "Acme"}) { id } }"#,
            json!({}),
        )
        .await["data"]["createTenant"]["id"]
        .as_str()
        .expect("a tenant")
        .to_owned();
    let link = app
        .graphql(
            &token,
            "mutation($t: ID!) { createPortalLink(tenantId: $t) { expiresAt } }",
            json!({ "t": tenant }),
        )
        .await;
    assert!(link["errors"].is_null(), "{link}");

    let url = db.url.clone();
    let listed = tokio::task::spawn_blocking(move || {
        courier_cli(&url)
            .args(["api-key", "list"])
            .output()
            .expect("run list")
    })
    .await
    .unwrap();
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let stdout = String::from_utf8(listed.stdout).expect("utf-8");
    let line = stdout
        .lines()
        .find(|line| line.starts_with(&id))
        .unwrap_or_else(|| panic!("{id} not listed: {stdout}"));
    assert!(line.contains("\tadmin\t"), "{line}");
    assert!(line.ends_with("\t-"), "the admin key never expires: {line}");
    assert!(!stdout.contains(&token) && !stdout.contains(&hash_token(&token)));
    let columns = |line: &str| line.split('\t').map(str::to_owned).collect::<Vec<_>>();
    let header = stdout.lines().next().map(columns).unwrap_or_default();
    assert_eq!(
        header.last().map(String::as_str),
        Some("expires"),
        "{stdout}"
    );
    let portal = stdout
        .lines()
        .find(|line| line.contains(&format!("tenant:{tenant}")))
        .map(columns)
        .unwrap_or_else(|| panic!("the portal link's key is listed: {stdout}"));
    let expires = portal.last().cloned().unwrap_or_default();
    assert!(
        chrono::DateTime::parse_from_rfc3339(&expires).is_ok(),
        "the portal link's key shows when it expires: {portal:?}"
    );

    let url = db.url.clone();
    let revoke_id = id.clone();
    let revoked = tokio::task::spawn_blocking(move || {
        courier_cli(&url)
            .args(["api-key", "revoke", &revoke_id])
            .output()
            .expect("run revoke")
    })
    .await
    .unwrap();
    assert!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );
    refused_within(&app, &token, Duration::from_secs(1)).await;

    let url = db.url.clone();
    let unknown = tokio::task::spawn_blocking(move || {
        courier_cli(&url)
            .args(["api-key", "revoke", &uuid::Uuid::now_v7().to_string()])
            .output()
            .expect("run revoke")
    })
    .await
    .unwrap();
    assert!(!unknown.status.success(), "an unknown key is an error");
}

/// A key held by an open session (a WebSocket, a subscription) is in use for as long as
/// it is open, not only when it authenticated: a console open all day keeps its key's
/// `lastUsedAt` within the minute. (The session's hold is taken here without the socket:
/// the key never authenticates, so only the hold can record its use.)
async fn a_key_held_by_an_open_session_is_in_use(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let key = create_api_key(&app.state.db, "held", Role::Admin, Default::default())
        .await
        .expect("key");
    let admin = app.admin_token().await;
    let key_id = key.id.to_string();
    let held = app.state.revocations.register(key.id, None);
    let (app_ref, admin_ref, key_ref) = (&app, &admin, &key_id);
    poll(
        "the held key's use is recorded",
        Duration::from_secs(5),
        || async move {
            let list = app_ref.graphql(admin_ref, LIST, json!({})).await;
            if listed(&list, key_ref)["lastUsedAt"].is_string() {
                Ok(())
            } else {
                Err(list.to_string())
            }
        },
    )
    .await;
    drop(held);
}

/// An endpoint named twice in a key's list is in its scope once: stored, listed by the CLI
/// and read back once (the CLI listed `X,X`).
async fn an_endpoint_named_twice_is_in_a_keys_scope_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (first, _) = app.create_endpoint(&admin, "https://example.com/a").await;
    let (second, _) = app.create_endpoint(&admin, "https://example.com/b").await;
    let ids: Vec<uuid::Uuid> = [&first, &second, &first]
        .iter()
        .map(|id| id.parse().expect("an id"))
        .collect();
    let key = create_api_key(
        &app.state.db,
        "twice",
        Role::Partner,
        courier::auth::KeyLimits {
            endpoints: &ids,
            ..Default::default()
        },
    )
    .await
    .expect("created");
    assert_eq!(courier::auth::scope_of(&key.key), ids[..2].to_vec());
}

on_both_backends!(
    an_endpoint_named_twice_is_in_a_keys_scope_once,
    admins_manage_keys_over_graphql,
    a_key_held_by_an_open_session_is_in_use,
    a_revocation_on_one_instance_is_felt_by_another,
    the_cli_lists_and_revokes_keys,
);
