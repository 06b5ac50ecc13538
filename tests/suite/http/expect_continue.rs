//! A request refused before its body is read (no key, a media type Courier does not take,
//! no route for it): a client that waits for `100 Continue` is not asked for a body that
//! would be thrown away, and one that sends it at once gets the answer, not a reset.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::{Backend, TestApp, TestDb};

/// Sends `head` (a request's head, announcing a body and waiting for `100 Continue`) and
/// returns, lower-cased, the first answer: the refusal, without any body sent, and saying
/// that the connection closes after it.
async fn refused_unasked(app: &TestApp, head: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(app.addr)
        .await
        .expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut answer = vec![0u8; 2048];
    let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut answer))
        .await
        .expect("answered without a body")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..read]).to_lowercase();
    assert!(
        answer.contains("\r\nconnection: close\r\n"),
        "the connection closes after the answer, and says so: {answer}"
    );
    answer
}

/// A client that waits for `100 Continue` before its body, refused before the body would be
/// read (no key, or a media type Courier does not take), gets the refusal at once: it is
/// not asked for a body only for it to be thrown away, and is told the connection closes
/// after the answer. One that sends its body without waiting gets the same refusal.
#[tokio::test]
async fn a_refusal_asks_no_body_of_a_client_that_waits_to_be_asked() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    for (authorization, content_type, refusal) in [
        (String::new(), "application/json", "http/1.1 401"),
        (
            format!("authorization: Bearer {admin}\r\n"),
            "text/plain",
            "http/1.1 415",
        ),
    ] {
        let head = format!(
            "POST /graphql HTTP/1.1\r\nhost: courier\r\n{authorization}\
             content-type: {content_type}\r\ncontent-length: 100000\r\n\
             expect: 100-continue\r\n\r\n"
        );
        let answer = refused_unasked(&app, &head).await;
        assert!(answer.starts_with(refusal), "{refusal}: {answer}");
    }
    // Without the header, the body is read past and the same refusal comes.
    let body = "x".repeat(100_000);
    let refused = app
        .request(Method::POST, "/graphql")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("answered");
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
}

/// Requests no route takes (a method the path does not allow, an unknown path) are refused
/// the same way: a client that waits is not asked for its body and is told the connection
/// closes; one that sends a large body at once gets the answer, not a reset.
#[tokio::test]
async fn unrouted_requests_are_refused_as_the_others_are() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    for (method, path, status) in [
        ("PUT", "/graphql", "405"),
        ("POST", "/graphql/ws", "405"),
        ("POST", "/no-such-path", "404"),
    ] {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: courier\r\ncontent-type: application/json\r\n\
             content-length: 100000\r\nexpect: 100-continue\r\n\r\n"
        );
        let answer = refused_unasked(&app, &head).await;
        assert!(
            answer.starts_with(&format!("http/1.1 {status}")),
            "{method} {path}: {answer}"
        );

        let sent = app
            .request(method.parse().expect("a method"), path)
            .header("content-type", "application/json")
            .body("x".repeat(900_000))
            .send()
            .await
            .expect("answered, not reset");
        assert_eq!(sent.status().as_str(), status, "{method} {path}");
        if status == "405" {
            assert!(sent.headers().contains_key("allow"), "{method} {path}");
        }
    }
}
