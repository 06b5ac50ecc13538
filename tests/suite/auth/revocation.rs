//! Revoking an API key: felt by every instance within a second, whoever wrote the revocation;
//! the key's open subscriptions end with an error and their sockets close with 4403.

use std::time::Duration;

use courier::auth::{self, RevokeOutcome, Role};
use courier::error::Error;
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::{json, Value};
use tokio::time::Instant;
use uuid::Uuid;

use crate::on_both_backends;
use crate::support::fixtures::submit;
use crate::support::websocket::{connect, frame_before, next, send, until_closed, Frame, Socket};
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

const SUBSCRIPTION: &str = "subscription { deliveryStateChanged { deliveryId state } }";

/// How the key gets revoked: through the service (with its `NOTIFY` on PostgreSQL), by an
/// operator's plain SQL, which only the watcher's poll can notice, or by deleting its row
/// (retention does, long after expiry; an operator may by hand).
#[derive(Clone, Copy, Debug)]
enum Revoker {
    Service,
    PlainSql,
    Deleted,
}

/// Opens a socket in `protocol`, authenticates with `token` and subscribes (id `s`).
async fn subscribe(app: &TestApp, token: &str, protocol: &str) -> Socket {
    let mut socket = connect(app, protocol).await;
    send(&mut socket, json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } })).await;
    assert_eq!(
        next(&mut socket).await.expect("ack")["type"],
        "connection_ack"
    );
    let start = if protocol == "graphql-ws" {
        "start"
    } else {
        "subscribe"
    };
    send(
        &mut socket,
        json!({ "id": "s", "type": start, "payload": { "query": SUBSCRIPTION } }),
    )
    .await;
    socket
}

/// Waits for the first event on `socket` (the generator is running), so the subscription is live.
async fn first_event(socket: &mut Socket) {
    let deadline = Instant::now() + Duration::from_secs(10);
    match frame_before(socket, deadline).await {
        Some(Frame::Message(message)) => {
            assert!(
                message["payload"]["data"]["deliveryStateChanged"]["deliveryId"].is_string(),
                "{message}"
            );
        }
        other => panic!("expected an event, got {other:?}"),
    }
}

/// Keeps producing state changes (a submission every 50 ms) through `app` until dropped.
fn generate_changes(app: &TestApp, token: &str, endpoint: &str) -> tokio::task::JoinHandle<()> {
    let (base_url, token, endpoint) = (app.base_url.clone(), token.to_owned(), endpoint.to_owned());
    let client = crate::support::http_client();
    tokio::spawn(async move {
        loop {
            let input = json!({ "endpointId": endpoint, "payload": { "tick": true } });
            let _ = client
                .post(format!("{base_url}/graphql"))
                .bearer_auth(&token)
                .json(&json!({ "query": crate::support::fixtures::SUBMIT, "variables": { "input": input } }))
                .send()
                .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

async fn revoke(app: &TestApp, key: Uuid, revoker: Revoker) {
    match revoker {
        Revoker::Service => {
            let outcome = auth::revoke_api_key(&app.state.db, key)
                .await
                .expect("revoke");
            assert!(matches!(outcome, RevokeOutcome::Revoked(_)), "{outcome:?}");
        }
        Revoker::PlainSql => {
            let backend = app.state.db.backend();
            let sql = match backend {
                DbBackend::Postgres => "UPDATE api_keys SET revoked_at = now() WHERE id = $1",
                _ => "UPDATE api_keys SET revoked_at = created_at WHERE id = $1",
            };
            app.state
                .db
                .conn()
                .execute_raw(Statement::from_sql_and_values(backend, sql, [key.into()]))
                .await
                .expect("revoke with SQL");
        }
        Revoker::Deleted => {
            let backend = app.state.db.backend();
            app.state
                .db
                .conn()
                .execute_raw(Statement::from_sql_and_values(
                    backend,
                    "DELETE FROM api_keys WHERE id = $1",
                    [key.into()],
                ))
                .await
                .expect("delete the key");
        }
    }
}

/// After the revocation a socket may still carry events committed before it, then exactly:
/// the subscription's revocation error, its completion, (legacy: a `connection_error`), and
/// a 4403 close. Nothing else, and no event after the error.
fn assert_ended_by_revocation(protocol: &str, messages: &[Value], close: Option<(u16, String)>) {
    let error_at = messages
        .iter()
        .position(|message| message["payload"].get("errors").is_some())
        .unwrap_or_else(|| panic!("{protocol}: no revocation error in {messages:?}"));
    for event in &messages[..error_at] {
        assert!(
            event["payload"]["data"]["deliveryStateChanged"].is_object(),
            "{protocol}: {event}"
        );
    }
    let error = &messages[error_at];
    assert_eq!(error["id"], "s", "{protocol}: {error}");
    assert_eq!(
        gql_error_code(&error["payload"]),
        Some("UNAUTHENTICATED"),
        "{protocol}: {error}"
    );
    assert_eq!(
        error["payload"]["errors"][0]["message"], "the API key was revoked or has expired",
        "{protocol}: {error}"
    );
    let rest: Vec<&Value> = messages[error_at + 1..].iter().collect();
    let mut expected = vec![json!({ "type": "complete", "id": "s" })];
    if protocol == "graphql-ws" {
        expected.push(json!({ "type": "connection_error", "payload": { "message": "the API key was revoked or has expired" } }));
    }
    assert_eq!(
        rest,
        expected.iter().collect::<Vec<_>>(),
        "{protocol}: nothing but the end follows the error"
    );
    let (code, reason) = close.unwrap_or_else(|| panic!("{protocol}: no close frame"));
    assert_eq!(code, 4403, "{protocol}: {reason}");
    assert!(reason.contains("revoked"), "{protocol}: {reason}");
}

/// A key's subscriptions on instance A (both protocols) end within 2 s of a revocation
/// written through instance B, and HTTP on A refuses the key within 1 s even though A's
/// cache would remember it for a minute. Another key's subscription is untouched.
async fn revocation_reaches_every_instance(backend: Backend, revoker: Revoker) {
    let db = TestDb::new(backend).await;
    let a = TestApp::spawn_with(&db, |config| config.auth_cache_ms = 60_000).await;
    let b = TestApp::spawn(&db).await;
    let admin = a.admin_token().await;
    let (endpoint, _) = a
        .create_endpoint(&admin, "https://example.com/revocation")
        .await;
    let doomed = auth::create_api_key(&a.state.db, "doomed", Role::Admin, Default::default())
        .await
        .expect("key");

    let generator = generate_changes(&a, &admin, &endpoint);
    let mut sockets = Vec::new();
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        let mut socket = subscribe(&a, &doomed.token, protocol).await;
        first_event(&mut socket).await;
        sockets.push((protocol, socket));
    }
    let mut bystander = subscribe(&a, &admin, "graphql-transport-ws").await;
    first_event(&mut bystander).await;
    // The key is now cached on A: HTTP answers from the cache.
    let ok = a
        .graphql(
            &doomed.token,
            "{ endpoints { edges { cursor } } }",
            json!({}),
        )
        .await;
    assert!(ok.get("errors").is_none(), "{ok}");

    revoke(&b, doomed.id, revoker).await;
    let revoked_at = Instant::now();

    let http_refusal = async {
        loop {
            let body = a
                .graphql(
                    &doomed.token,
                    "{ endpoints { edges { cursor } } }",
                    json!({}),
                )
                .await;
            if gql_error_code(&body) == Some("UNAUTHENTICATED") {
                return revoked_at.elapsed();
            }
            assert!(revoked_at.elapsed() < Duration::from_secs(5), "{body}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let endings =
        futures_util::future::join_all(sockets.iter_mut().map(|(protocol, socket)| async move {
            let (messages, close) = until_closed(socket, Duration::from_secs(5)).await;
            (*protocol, messages, close, revoked_at.elapsed())
        }));
    let (refused_after, endings) = tokio::join!(http_refusal, endings);

    assert!(
        refused_after < Duration::from_secs(1),
        "HTTP refused the key after {refused_after:?}"
    );
    for (protocol, messages, close, closed_after) in endings {
        assert_ended_by_revocation(protocol, &messages, close);
        assert!(
            closed_after < Duration::from_secs(2),
            "{protocol}: closed {closed_after:?} after the revocation"
        );
    }
    // Another key's subscription goes on.
    let deadline = Instant::now() + Duration::from_secs(5);
    while frame_before(&mut bystander, Instant::now() + Duration::from_millis(50))
        .await
        .is_some()
    {}
    match frame_before(&mut bystander, deadline).await {
        Some(Frame::Message(message)) => assert!(
            message["payload"]["data"]["deliveryStateChanged"].is_object(),
            "{message}"
        ),
        other => panic!("the bystander stopped: {other:?}"),
    }
    generator.abort();
    // The key stays refused.
    let body = submit(&a, &doomed.token, &endpoint, json!({}), None).await;
    assert_eq!(gql_error_code(&body), Some("UNAUTHENTICATED"), "{body}");
}

async fn revoking_through_the_service_ends_sessions_everywhere(backend: Backend) {
    revocation_reaches_every_instance(backend, Revoker::Service).await;
}

async fn revoking_with_plain_sql_ends_sessions_everywhere(backend: Backend) {
    revocation_reaches_every_instance(backend, Revoker::PlainSql).await;
}

/// A key deleted while in use ends its sessions like a revoked one (they went on before:
/// the watcher asked only about keys it could find).
async fn deleting_a_key_ends_sessions_everywhere(backend: Backend) {
    revocation_reaches_every_instance(backend, Revoker::Deleted).await;
}

/// `revoke_api_key` is one conditional UPDATE: of racing revocations from separate pools
/// exactly one revokes, the rest find the key revoked at the winner's time; an unknown
/// key is `NOT_FOUND`.
async fn racing_revocations_settle_on_one(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let key = auth::create_api_key(&app.state.db, "raced", Role::Admin, Default::default())
        .await
        .expect("key");
    let mut pools = Vec::new();
    for _ in 0..4 {
        pools.push(db.connect(2).await);
    }
    let outcomes =
        futures_util::future::join_all(pools.iter().map(|pool| auth::revoke_api_key(pool, key.id)))
            .await;
    let outcomes: Vec<RevokeOutcome> = outcomes
        .into_iter()
        .map(|outcome| outcome.expect("settled"))
        .collect();
    let winners: Vec<&RevokeOutcome> = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, RevokeOutcome::Revoked(_)))
        .collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    let revoked_at = winners[0].key().revoked_at.expect("revoked_at");
    for outcome in &outcomes {
        assert_eq!(outcome.key().revoked_at, Some(revoked_at), "{outcomes:?}");
    }
    let again = auth::revoke_api_key(&app.state.db, key.id)
        .await
        .expect("again");
    assert!(
        matches!(again, RevokeOutcome::AlreadyRevoked(_)),
        "{again:?}"
    );
    assert!(matches!(
        auth::revoke_api_key(&app.state.db, Uuid::now_v7()).await,
        Err(Error::NotFound(_))
    ));
    let refused = app
        .graphql(&key.token, "{ endpoints { edges { cursor } } }", json!({}))
        .await;
    assert_eq!(
        gql_error_code(&refused),
        Some("UNAUTHENTICATED"),
        "{refused}"
    );
}

/// A key deleted while a process still holds it as valid (until its revocation check comes
/// round) is refused with 401 all the same: its request runs into the missing row and the
/// whole answer is the 401 a missing key gets, not a 200 carrying `UNAUTHENTICATED` beside
/// what the rest of the request read.
async fn a_deleted_key_is_answered_401_at_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let key = auth::create_api_key(&app.state.db, "deleted", Role::Admin, Default::default())
        .await
        .expect("key");
    let query = json!({ "query": "{ currentKey { id } endpoints { edges { cursor } } }" });
    let held = app.post_graphql(Some(&key.token), &query).await;
    assert_eq!(held.status(), reqwest::StatusCode::OK);
    app.state
        .db
        .conn()
        .execute_raw(sea_orm::Statement::from_sql_and_values(
            app.state.db.backend(),
            "DELETE FROM api_keys WHERE id = $1",
            [key.id.into()],
        ))
        .await
        .expect("deleted");
    let refused = app.post_graphql(Some(&key.token), &query).await;
    assert_eq!(refused.status(), reqwest::StatusCode::UNAUTHORIZED);
    assert_eq!(refused.headers()["www-authenticate"], "Bearer");
    let body: serde_json::Value = refused.json().await.expect("a JSON body");
    assert_eq!(gql_error_code(&body), Some("UNAUTHENTICATED"), "{body}");
    assert!(body.get("data").is_none(), "nothing read is shown: {body}");
}

/// A key revoked through `revokeApiKey` is refused by the same process from the moment the
/// mutation answers, and its sockets there end, without waiting for the watcher (on SQLite
/// the key kept working there for up to half a second, its poll).
async fn a_key_revoked_here_is_refused_here_at_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    for round in 0..10 {
        let key = auth::create_api_key(&app.state.db, "revoked", Role::Admin, Default::default())
            .await
            .expect("key");
        let mut socket = subscribe(&app, &key.token, "graphql-transport-ws").await;
        let query = json!({ "query": "{ currentKey { id } }" });
        let held = app.post_graphql(Some(&key.token), &query).await;
        assert_eq!(held.status(), reqwest::StatusCode::OK, "cached as valid");
        let revoked = app
            .graphql(
                &admin,
                "mutation($id: ID!) { revokeApiKey(id: $id) { revokedAt } }",
                json!({ "id": key.id }),
            )
            .await;
        assert!(
            revoked["data"]["revokeApiKey"]["revokedAt"].is_string(),
            "{revoked}"
        );
        let refused = app.post_graphql(Some(&key.token), &query).await;
        assert_eq!(
            refused.status(),
            reqwest::StatusCode::UNAUTHORIZED,
            "round {round}: refused as soon as the revocation answered"
        );
        let (_, close) = until_closed(&mut socket, Duration::from_secs(2)).await;
        assert_eq!(close.map(|(code, _)| code), Some(4403), "round {round}");
    }
}

on_both_backends!(
    a_key_revoked_here_is_refused_here_at_once,
    a_deleted_key_is_answered_401_at_once,
    revoking_through_the_service_ends_sessions_everywhere,
    revoking_with_plain_sql_ends_sessions_everywhere,
    deleting_a_key_ends_sessions_everywhere,
    racing_revocations_settle_on_one,
);
