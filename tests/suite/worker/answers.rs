//! What the receiver said: each attempt keeps the start of the response body and the
//! headers, read with a bound, so a receiver that streams for ever is cut off.

use std::time::Duration;

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{delivery_id, endpoint_on, quick_worker, submit, wait_for_state};
use crate::support::{Backend, Receiver, Reply, ReplyBody, TestApp, TestDb};

/// A failing answer's body and headers are kept with the attempt, invalid UTF-8 and NULs
/// replaced (PostgreSQL's text refuses NUL), and so is a success's.
async fn the_body_and_headers_are_kept(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(|n| {
        if n == 1 {
            Reply {
                headers: vec![("x-reason", "database down".to_owned())],
                body: ReplyBody::Bytes(b"{\"error\":\"busy\"}\0\xff tail".to_vec()),
                ..Reply::status(500)
            }
        } else {
            Reply {
                body: ReplyBody::Bytes(b"thanks".to_vec()),
                ..Reply::status(200)
            }
        }
    })
    .await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "said").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({ "hello": 1 }), None).await);
    let delivery = wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    let attempts = delivery["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{delivery}");
    let failed = &attempts[0];
    assert_eq!(failed["statusCode"], 500);
    assert_eq!(
        failed["responseBody"], "{\"error\":\"busy\"}\u{FFFD}\u{FFFD} tail",
        "{failed}"
    );
    assert_eq!(
        failed["responseHeaders"]["x-reason"], "database down",
        "{failed}"
    );
    assert_eq!(failed["responseHeaders"]["content-length"], "23");
    assert_eq!(attempts[1]["responseBody"], "thanks");
    assert!(attempts[1]["responseHeaders"].is_object());
}

/// An attempt that got no response has no body or headers (null, not empty).
async fn no_response_keeps_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
    })
    .await;
    let admin = app.admin_token().await;
    // Nothing listens on port 9 of the loopback.
    let (endpoint, _) = app
        .create_endpoint(&admin, "http://127.0.0.1:9/closed")
        .await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({}), None).await);
    let delivery = wait_for_state(&app, &admin, &id, "FAILED", Duration::from_secs(10)).await;
    let attempt = &delivery["attempts"][0];
    assert!(attempt["statusCode"].is_null(), "{attempt}");
    assert!(attempt["responseBody"].is_null(), "{attempt}");
    assert!(attempt["responseHeaders"].is_null(), "{attempt}");
}

/// An answer without a body (a `204`, or a `200` with `content-length: 0`) is an empty
/// body, not a missing one: null is only for an attempt that got no answer.
async fn an_empty_answer_is_an_empty_body(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(|n| Reply::status(if n == 1 { 204 } else { 200 })).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "empty").await;
    for _ in 0..2 {
        let id = delivery_id(&submit(&app, &admin, &endpoint, json!({}), None).await);
        let delivery =
            wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
        let attempt = &delivery["attempts"][0];
        assert_eq!(attempt["responseBody"], "", "{attempt}");
        assert!(attempt["responseHeaders"].is_object(), "{attempt}");
    }
}

/// A receiver streaming an endless body: the attempt keeps 4 KiB and is recorded at once,
/// well inside the request timeout, instead of reading until the timeout or memory ends.
async fn an_endless_body_is_cut_off(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(|_| Reply {
        body: ReplyBody::Endless,
        ..Reply::status(200)
    })
    .await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.request_timeout_ms = 30_000;
    })
    .await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "endless").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({ "stream": true }), None).await);
    let delivery = wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    let attempt = &delivery["attempts"][0];
    let body = attempt["responseBody"].as_str().expect("a body");
    assert_eq!(body.len(), 4096, "the first 4 KiB");
    assert!(body.bytes().all(|b| b == b'x'));
    let took = attempt["durationMs"].as_i64().expect("a duration");
    assert!(
        took < 10_000,
        "cut off, not read until the timeout: {took} ms"
    );
}

/// Any 2xx is a success, however many headers come with it (more than the 100 an HTTP
/// client library allows by default) or however malformed one of them is; what is kept of
/// them stays bounded.
async fn a_success_dressed_in_many_headers_is_a_success(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(|_| Reply {
        headers: (0..300)
            .map(|n| {
                let name: &'static str = Box::leak(format!("x-header-{n}").into_boxed_str());
                (name, "v".repeat(20))
            })
            .collect(),
        ..Reply::status(200)
    })
    .await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "dressed").await;
    let id = delivery_id(&submit(&app, &admin, &endpoint, json!({}), None).await);
    let delivery = wait_for_state(&app, &admin, &id, "DELIVERED", Duration::from_secs(10)).await;
    let attempts = delivery["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "{delivery}");
    let kept = attempts[0]["responseHeaders"].to_string();
    assert!(kept.contains("x-header-0"), "{kept}");
    assert!(kept.len() < 10 * 1024, "{} bytes kept", kept.len());
}

on_both_backends!(
    a_success_dressed_in_many_headers_is_a_success,
    the_body_and_headers_are_kept,
    no_response_keeps_nothing,
    an_empty_answer_is_an_empty_body,
    an_endless_body_is_cut_off,
);
