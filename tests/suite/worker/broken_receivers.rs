//! A receiver that breaks HTTP on a kept-alive connection (a second response after the
//! first, an answer before the request's body was read) spoils nothing for another endpoint
//! on the same host: connections are never shared between endpoints.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::on_both_backends;
use crate::support::fixtures::{delivery_id, eventually, quick_worker, settle, submit};
use crate::support::{Backend, TestApp, TestDb};

/// A receiver speaking HTTP/1.1 by hand, one request at a time per connection, whose
/// answer depends on the path: `/stray` answers `204` and, 200 ms later, a second `200`
/// nobody asked for; `/early` answers `200` without reading the body, then closes a
/// second later without reading what follows; `/failing` answers `500`; anything else
/// `204`. Returns its address and how many requests it read.
async fn broken_receiver() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve(socket, counted.clone()));
        }
    });
    (format!("http://{addr}"), requests)
}

/// Serves one connection of [`broken_receiver`].
async fn serve(mut socket: TcpStream, requests: Arc<AtomicUsize>) {
    let mut buffer = Vec::new();
    loop {
        let Some(head_end) = read_head(&mut socket, &mut buffer).await else {
            return;
        };
        requests.fetch_add(1, Ordering::SeqCst);
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let length: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        if path == "/early" {
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nearly")
                .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 8192];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        buffer.drain(..head_end + length);
        let answer: &[u8] = match path.as_str() {
            "/failing" => b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nfail",
            _ => b"HTTP/1.1 204 No Content\r\n\r\n",
        };
        if socket.write_all(answer).await.is_err() {
            return;
        }
        if path == "/stray" {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let stray = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray";
            if socket.write_all(stray).await.is_err() {
                return;
            }
        }
    }
}

/// Reads into `buffer` until it holds a whole request head; returns where the head ends,
/// or `None` once the connection closes.
async fn read_head(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(at + 4);
        }
        let mut chunk = [0u8; 8192];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Submits `payload` to `endpoint` and waits until the receiver has read one more request.
async fn submit_and_wait(
    app: &TestApp,
    admin: &str,
    endpoint: &str,
    payload: serde_json::Value,
    requests: &AtomicUsize,
) -> String {
    let before = requests.load(Ordering::SeqCst);
    let body = submit(app, admin, endpoint, payload, None).await;
    assert!(body["errors"].is_null(), "{body}");
    eventually(
        "the receiver reads the request",
        Duration::from_secs(10),
        || async { requests.load(Ordering::SeqCst) > before },
    )
    .await;
    delivery_id(&body)
}

/// An app whose deliveries get one attempt, and its admin token.
async fn one_attempt_app(db: &TestDb) -> (TestApp, String) {
    let app = TestApp::spawn_with(db, |config| {
        quick_worker(config);
        config.max_attempts = Some(1);
    })
    .await;
    let admin = app.admin_token().await;
    (app, admin)
}

/// The state and attempt statuses of delivery `id`, once it has settled.
async fn settled(app: &TestApp, admin: &str, id: &str) -> serde_json::Value {
    let query = "query($id: ID!) { delivery(id: $id) { state attempts { statusCode error } } }";
    let mut last = serde_json::Value::Null;
    for _ in 0..200 {
        last = app.graphql(admin, query, json!({ "id": id })).await;
        let state = &last["data"]["delivery"]["state"];
        if state == "DELIVERED" || state == "FAILED" {
            return last["data"]["delivery"].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("delivery {id} never settled: {last}");
}

/// A receiver answers one endpoint's webhook twice, the second answer arriving while the
/// next request (to another endpoint of the same host, whose receiver answers `500`) is
/// under way. The other endpoint's delivery gets its own answer, `500`: before, it took the
/// stray `200` from the shared connection and was recorded `DELIVERED`.
async fn a_stray_answer_is_never_another_endpoints(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (base, requests) = broken_receiver().await;
    let (app, admin) = one_attempt_app(&db).await;
    let (stray, _) = app.create_endpoint(&admin, &format!("{base}/stray")).await;
    let (failing, _) = app
        .create_endpoint(&admin, &format!("{base}/failing"))
        .await;
    for round in 0..3 {
        let first =
            submit_and_wait(&app, &admin, &stray, json!({ "round": round }), &requests).await;
        let second =
            submit_and_wait(&app, &admin, &failing, json!({ "round": round }), &requests).await;
        let failed = settled(&app, &admin, &second).await;
        assert_eq!(failed["state"], "FAILED", "round {round}: {failed}");
        assert_eq!(failed["attempts"][0]["statusCode"], 500, "{failed}");
        let delivered = settled(&app, &admin, &first).await;
        assert_eq!(delivered["state"], "DELIVERED", "{delivered}");
        assert_eq!(delivered["attempts"][0]["statusCode"], 204, "{delivered}");
        // Let the stray answer come and its connection be dropped.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    settle([app]).await;
}

/// A receiver answers before reading a large body and closes the connection a second later
/// without reading on. Another endpoint's webhook to the same host, sent meanwhile, goes
/// out on a connection of its own and is delivered: before, it went out on the doomed
/// connection and failed with the connection closed.
async fn an_answer_before_the_body_spoils_no_other_endpoint(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (base, requests) = broken_receiver().await;
    let (app, admin) = one_attempt_app(&db).await;
    let (early, _) = app.create_endpoint(&admin, &format!("{base}/early")).await;
    let (good, _) = app.create_endpoint(&admin, &format!("{base}/good")).await;
    let large = json!({ "filler": "x".repeat(200_000) });
    let first = submit_and_wait(&app, &admin, &early, large, &requests).await;
    let answered = settled(&app, &admin, &first).await;
    assert_eq!(answered["state"], "DELIVERED", "{answered}");
    let second = submit_and_wait(&app, &admin, &good, json!({ "n": 1 }), &requests).await;
    let delivered = settled(&app, &admin, &second).await;
    assert_eq!(delivered["state"], "DELIVERED", "{delivered}");
    settle([app]).await;
}

on_both_backends!(
    a_stray_answer_is_never_another_endpoints,
    an_answer_before_the_body_spoils_no_other_endpoint,
);
