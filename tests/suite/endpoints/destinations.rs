//! Webhook destinations: malformed URLs and every non-public address range are refused when an
//! endpoint is saved, and again by the worker when it connects.

use std::time::Duration;

use serde_json::{json, Value};

use crate::on_both_backends;
use crate::support::fixtures::endpoint_count;
use crate::support::fixtures::submit;
use crate::support::fixtures::{quick_worker, wait_for_state};
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

/// One or two literal URLs in every refused range (IANA special-purpose registries, multicast,
/// and the IPv6 formats that embed an IPv4 address).
const NON_PUBLIC_URLS: &[&str] = &[
    "http://0.0.0.0/hook",
    "http://0.1.2.3/hook",
    "http://10.0.0.8/hook",
    "http://100.64.0.1/hook",
    "http://100.127.255.254/hook",
    "http://127.0.0.1:9/hook",
    "http://169.254.169.254/latest/meta-data",
    "http://172.16.0.1/hook",
    "http://192.0.0.8/hook",
    "http://192.0.0.170/hook",
    "http://192.0.2.1/hook",
    "http://192.88.99.1/hook",
    "http://192.168.1.1/hook",
    "http://198.18.0.1/hook",
    "http://198.51.100.1/hook",
    "http://203.0.113.1/hook",
    "http://224.0.0.1/hook",
    "http://239.255.255.250/hook",
    "http://240.0.0.1/hook",
    "http://255.255.255.255/hook",
    "http://0x7f.1/hook",
    "http://[::]/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:8.8.8.8]/hook",
    "http://[::127.0.0.1]/hook",
    "http://[::ffff:0:7f00:1]/hook",
    "http://[64:ff9b::7f00:1]/hook",
    "http://[64:ff9b::808:808]/hook",
    "http://[64:ff9b:1::a00:1]/hook",
    "http://[100::1]/hook",
    "http://[2001:1::4]/hook",
    "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/hook",
    "http://[2001:2::1]/hook",
    "http://[2001:db8::1]/hook",
    "http://[2002:7f00:1::]/hook",
    "http://[2002:808:808::1]/hook",
    "http://[3fff::1]/hook",
    "http://[5f00::1]/hook",
    "http://[fd00::1]/hook",
    "http://[fe80::1]/hook",
    "http://[fec0::1]/hook",
    "http://[ff02::1]/hook",
    "http://[ff0e::1]/hook",
];

/// URLs whose shape is wrong whatever the destination policy.
const MALFORMED_URLS: &[&str] = &[
    "http:///path",
    "https:///example.com/hook",
    "http:example.com/hook",
    "http://@example.com/hook",
    "http://user@example.com/hook",
    "http://user:secret@example.com/hook",
    "https://example.com/hook#fragment",
    "https://example.com/hook#",
    "https://example.com:0/hook",
];

const CREATE: &str = "mutation($url: String!) { createEndpoint(input: {name: \"x\", url: $url}) { endpoint { id url } } }";
const UPDATE: &str = "mutation($id: ID!, $url: String!) { updateEndpoint(id: $id, input: {url: $url}) { endpoint { id url } } }";

async fn assert_refused_everywhere(app: &TestApp, admin: &str, urls: &[&str]) {
    for url in urls {
        let body = app.graphql(admin, CREATE, json!({ "url": url })).await;
        assert_eq!(
            gql_error_code(&body),
            Some("BAD_USER_INPUT"),
            "{url}: {body}"
        );
    }
    assert_eq!(endpoint_count(app).await, 0, "nothing was written");

    let (id, _) = app
        .create_endpoint(admin, "https://example.com/stays")
        .await;
    for url in urls {
        let body = app
            .graphql(admin, UPDATE, json!({ "id": id, "url": url }))
            .await;
        assert_eq!(
            gql_error_code(&body),
            Some("BAD_USER_INPUT"),
            "{url}: {body}"
        );
    }
    let read = app
        .graphql(
            admin,
            "query($id: ID!) { endpoint(id: $id) { url } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(read["data"]["endpoint"]["url"], "https://example.com/stays");
}

async fn non_public_ranges_are_refused_at_save_time(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| config.allow_private_destinations = false).await;
    let admin = app.admin_token().await;
    assert_refused_everywhere(&app, &admin, NON_PUBLIC_URLS).await;

    // The same addresses are accepted when private destinations are allowed.
    let permissive = TestApp::spawn(&db).await;
    for url in NON_PUBLIC_URLS {
        let body = permissive
            .graphql(&admin, CREATE, json!({ "url": url }))
            .await;
        assert!(
            body["data"]["createEndpoint"]["endpoint"]["id"].is_string(),
            "{url}: {body}"
        );
    }
}

async fn malformed_urls_are_refused_even_when_private_destinations_are_allowed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    assert_refused_everywhere(&app, &admin, MALFORMED_URLS).await;
}

/// Endpoints saved while private destinations were allowed are refused by a worker that does
/// not allow them: every attempt fails before any connection is opened.
async fn non_public_ranges_are_refused_at_connect_time(backend: Backend) {
    let db = TestDb::new(backend).await;
    let permissive = TestApp::spawn(&db).await;
    let admin = permissive.admin_token().await;
    let mut endpoints = Vec::new();
    // `localhost` reaches the resolver, which must refuse what it resolves to.
    for url in NON_PUBLIC_URLS
        .iter()
        .copied()
        .chain(["http://localhost:9/hook"])
    {
        let (id, _) = permissive.create_endpoint(&admin, url).await;
        endpoints.push((url, id));
    }

    let strict = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
        config.allow_private_destinations = false;
    })
    .await;
    let mut deliveries = Vec::new();
    for (url, endpoint) in &endpoints {
        let submitted = submit(&strict, &admin, endpoint, json!({ "to": url }), None).await;
        let id = submitted["data"]["submit"]["delivery"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{url}: {submitted}"))
            .to_owned();
        deliveries.push((url, id));
    }
    for (url, id) in deliveries {
        let delivery =
            wait_for_state(&strict, &admin, &id, "FAILED", Duration::from_secs(20)).await;
        let attempts = delivery["attempts"].as_array().cloned().unwrap_or_default();
        assert_eq!(attempts.len(), 1, "{url}: {delivery}");
        let attempt = &attempts[0];
        assert_eq!(attempt["statusCode"], Value::Null, "{url}: {attempt}");
        let error = attempt["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("destination refused"),
            "{url} was not refused at connect time: {error}"
        );
    }
}

on_both_backends!(
    non_public_ranges_are_refused_at_save_time,
    malformed_urls_are_refused_even_when_private_destinations_are_allowed,
    non_public_ranges_are_refused_at_connect_time,
);
