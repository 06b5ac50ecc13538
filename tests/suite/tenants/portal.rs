//! Portal links: a short-lived key of the tenant and the console URL signed in with it. The
//! key works on every instance until it expires; then every instance refuses it and ends
//! its subscriptions, as a revocation does.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::on_both_backends;
use crate::support::fixtures::{quick_worker, submit};
use crate::support::tenants::{create_tenant, tenant_with_endpoints};
use crate::support::websocket::{
    connect, frame_before, initialised, next, send, until_closed, Frame,
};
use crate::support::{gql_error_code, Backend, Receiver, TestApp, TestDb};
use futures_util::SinkExt as _;
use tokio_tungstenite::tungstenite::Message;

const PORTAL_LINK: &str = "mutation($tenant: ID!, $ttl: Int) { createPortalLink(tenantId: $tenant, ttlSeconds: $ttl) { url token expiresAt } }";

async fn a_portal_link_expires_on_every_instance(backend: Backend) {
    let db = TestDb::new(backend).await;
    let setup = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.public_url = Some("https://courier.example.com/ops/".parse().expect("a URL"));
    })
    .await;
    let other = TestApp::spawn_with(&db, quick_worker).await;
    let admin = setup.admin_token().await;
    let receiver = Receiver::accepting().await;
    let acme = tenant_with_endpoints(&setup, &admin, "Acme", &receiver, &["acme"]).await;

    // Bad lifetimes and unknown tenants are refused, with no key minted.
    for (ttl, code) in [
        (json!(0), "BAD_USER_INPUT"),
        (json!(86_401), "BAD_USER_INPUT"),
    ] {
        let body = setup
            .graphql(
                &admin,
                PORTAL_LINK,
                json!({ "tenant": acme.id, "ttl": ttl }),
            )
            .await;
        assert_eq!(gql_error_code(&body), Some(code), "{body}");
    }
    let unknown = setup
        .graphql(
            &admin,
            PORTAL_LINK,
            json!({ "tenant": uuid::Uuid::now_v7(), "ttl": 60 }),
        )
        .await;
    assert_eq!(gql_error_code(&unknown), Some("NOT_FOUND"), "{unknown}");

    let default = setup
        .graphql(&admin, PORTAL_LINK, json!({ "tenant": acme.id }))
        .await;
    let expires: chrono::DateTime<chrono::Utc> = default["data"]["createPortalLink"]["expiresAt"]
        .as_str()
        .and_then(|at| at.parse().ok())
        .unwrap_or_else(|| panic!("{default}"));
    let hour = expires - chrono::Utc::now();
    assert!(
        (3_590..=3_610).contains(&hour.num_seconds()),
        "an hour by default: {default}"
    );

    let link = setup
        .graphql(&admin, PORTAL_LINK, json!({ "tenant": acme.id, "ttl": 3 }))
        .await;
    let link = &link["data"]["createPortalLink"];
    let token = link["token"]
        .as_str()
        .unwrap_or_else(|| panic!("{link}"))
        .to_owned();
    assert_eq!(
        link["url"],
        format!("https://courier.example.com/ops/#token={token}"),
        "{link}"
    );
    let keys = setup
        .graphql(
            &admin,
            "{ apiKeys { edges { node { role tenant { id } expiresAt } } } }",
            json!({}),
        )
        .await;
    let portal_keys: Vec<&Value> = keys["data"]["apiKeys"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{keys}"))
        .iter()
        .filter(|edge| !edge["node"]["expiresAt"].is_null())
        .collect();
    assert_eq!(portal_keys.len(), 2, "one key per link minted: {keys}");
    assert!(
        portal_keys
            .iter()
            .all(|edge| edge["node"]["role"] == "PARTNER"
                && edge["node"]["tenant"]["id"] == acme.id.as_str()),
        "{keys}"
    );

    // Until it expires the link's key is the tenant's, on the other instance too, with a
    // subscription open there.
    let listed = other
        .graphql(&token, "{ endpoints { edges { node { id } } } }", json!({}))
        .await;
    assert_eq!(
        listed["data"]["endpoints"]["edges"][0]["node"]["id"],
        acme.endpoints[0].as_str(),
        "{listed}"
    );
    let mut socket = connect(&other, "graphql-transport-ws").await;
    send(&mut socket, json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } })).await;
    assert_eq!(
        next(&mut socket).await.expect("ack")["type"],
        "connection_ack"
    );
    send(
        &mut socket,
        json!({ "id": "s", "type": "subscribe", "payload": { "query": "subscription { deliveryStateChanged { deliveryId state } }" } }),
    )
    .await;
    let sent = submit(
        &other,
        &token,
        &acme.endpoints[0],
        json!({"live": true}),
        None,
    )
    .await;
    assert!(sent["data"]["submit"]["created"] == true, "{sent}");
    match frame_before(&mut socket, Instant::now() + Duration::from_secs(10)).await {
        Some(Frame::Message(message)) => assert!(
            message["payload"]["data"]["deliveryStateChanged"]["deliveryId"].is_string(),
            "{message}"
        ),
        other => panic!("expected an event, got {other:?}"),
    }

    // After expiry: the subscription ends with UNAUTHENTICATED within about a second, and
    // every instance refuses the key.
    let expires: chrono::DateTime<chrono::Utc> = link["expiresAt"]
        .as_str()
        .and_then(|at| at.parse().ok())
        .unwrap_or_else(|| panic!("{link}"));
    let (messages, close) = until_closed(&mut socket, Duration::from_secs(10)).await;
    let ended = chrono::Utc::now();
    assert!(
        ended - expires < chrono::Duration::milliseconds(2_500),
        "ended within about a second of the expiry ({expires}), at {ended}"
    );
    let error = messages
        .iter()
        .find(|message| message["payload"].get("errors").is_some())
        .unwrap_or_else(|| panic!("no error before the close: {messages:?}"));
    assert_eq!(
        gql_error_code(&error["payload"]),
        Some("UNAUTHENTICATED"),
        "{error}"
    );
    assert_eq!(close.map(|(code, _)| code), Some(4403), "{messages:?}");
    for app in [&setup, &other] {
        let refused = app
            .graphql(&token, "{ endpoints { edges { node { id } } } }", json!({}))
            .await;
        assert_eq!(
            gql_error_code(&refused),
            Some("UNAUTHENTICATED"),
            "{refused}"
        );
    }
}

on_both_backends!(a_portal_link_expires_on_every_instance);

/// A tenant whose name takes the whole 200 characters still gets portal links: the link's
/// key is named after it, cut to fit (before, names of 185 characters and more were refused
/// as the key's name). Names that show nothing, or show in another order than stored, are
/// refused, with nothing written.
#[tokio::test]
async fn any_tenant_gets_a_portal_link_and_names_show_what_they_are() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let name = "é".repeat(200);
    let tenant = create_tenant(&app, &admin, &name).await;
    let link = app
        .graphql(&admin, PORTAL_LINK, json!({ "tenant": tenant, "ttl": 60 }))
        .await;
    assert!(
        link["data"]["createPortalLink"]["token"].is_string(),
        "{link}"
    );
    let keys = app
        .graphql(
            &admin,
            "{ apiKeys { edges { node { name expiresAt } } } }",
            json!({}),
        )
        .await;
    let portal = keys["data"]["apiKeys"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{keys}"))
        .iter()
        .find(|edge| !edge["node"]["expiresAt"].is_null())
        .and_then(|edge| edge["node"]["name"].as_str())
        .unwrap_or_else(|| panic!("the link's key: {keys}"))
        .to_owned();
    assert_eq!(portal.chars().count(), 200, "{portal}");
    assert!(portal.starts_with("portal link for éé") && portal.ends_with('…'));

    for (name, message) in [
        ("\u{200B}\u{FEFF}", "name must contain a visible character"),
        (
            "evil\u{202E}txt.exe",
            "name must not contain bidirectional override or isolate characters",
        ),
    ] {
        let refused = app
            .graphql(
                &admin,
                "mutation($name: String!) { createTenant(input: {name: $name}) { id } }",
                json!({ "name": name }),
            )
            .await;
        assert_eq!(
            gql_error_code(&refused),
            Some("BAD_USER_INPUT"),
            "{refused}"
        );
        assert_eq!(refused["errors"][0]["message"], message, "{refused}");
    }
    let tenants = app
        .graphql(&admin, "{ tenants { edges { node { id } } } }", json!({}))
        .await;
    assert_eq!(
        tenants["data"]["tenants"]["edges"].as_array().map(Vec::len),
        Some(1),
        "nothing written: {tenants}"
    );
}

/// A portal link's key that expires while a WebSocket is open runs nothing the client sends
/// after its expiry: the session ends when the key expires, not at the revocation watcher's
/// next check (before, mutations sent over the socket were stored up to half a second late).
#[tokio::test]
async fn an_expired_portal_key_runs_nothing_more_over_an_open_socket() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let acme = tenant_with_endpoints(&app, &admin, "Acme", &receiver, &["acme"]).await;
    let link = app
        .graphql(&admin, PORTAL_LINK, json!({ "tenant": acme.id, "ttl": 2 }))
        .await;
    let link = &link["data"]["createPortalLink"];
    let (token, expires) = (
        link["token"].as_str().unwrap_or_else(|| panic!("{link}")),
        link["expiresAt"]
            .as_str()
            .and_then(|at| at.parse::<chrono::DateTime<chrono::Utc>>().ok())
            .unwrap_or_else(|| panic!("{link}")),
    );

    let mut socket = initialised(&app, "graphql-transport-ws", token).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sent = 0;
    let close = loop {
        sent += 1;
        let subscribe = json!({ "id": format!("m{sent}"), "type": "subscribe", "payload": {
            "query": "mutation($input: SubmitInput!) { submit(input: $input) { created } }",
            "variables": { "input": { "endpointId": acme.endpoints[0], "payload": { "n": sent } } } } });
        if socket
            .send(Message::Text(subscribe.to_string().into()))
            .await
            .is_err()
        {
            break None;
        }
        // Its answer and `complete`, or the close.
        let mut answered = 0;
        let closed = loop {
            match frame_before(&mut socket, deadline).await {
                Some(Frame::Message(_)) => {
                    answered += 1;
                    if answered == 2 {
                        break None;
                    }
                }
                Some(Frame::Closed(close)) => break Some(close),
                None => panic!("neither answered nor closed by the deadline"),
            }
        };
        if let Some(close) = closed {
            break close;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(close.map(|(code, _)| code), Some(4403));

    // The client waits for each answer before it sends the next, so one submission at the
    // most was under way when the key expired; nothing sent after it ran.
    let after = app
        .graphql(
            &admin,
            "query($e: ID!, $at: DateTime!) { deliveries(filter: {endpointId: $e, createdAfter: $at}, first: 100) { edges { node { createdAt } } } }",
            json!({ "e": acme.endpoints[0], "at": expires.to_rfc3339() }),
        )
        .await;
    let late = after["data"]["deliveries"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{after}"))
        .len();
    assert!(
        late <= 1 && sent > 1,
        "{late} of {sent} stored after the key expired at {expires}: {after}"
    );
}
