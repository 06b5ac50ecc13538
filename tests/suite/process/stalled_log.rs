//! A log reader that stops reading: `courier serve` with stderr a pipe nobody reads any
//! more (a stalled log shipper, a harness that never drains the pipe). The pipe fills; the
//! process must go on answering and delivering, dropping and counting the lines that do not
//! fit, instead of stalling on a write.

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::time::Duration;

use courier::telemetry::sink::QUEUED_LINES;
use serde_json::json;

use crate::support::process::{admin_token, courier_command, Served};
use crate::support::{http_client, Backend, Receiver, TestDb};

/// Each `/healthz` request logs two lines at `tower_http=debug` (started, finished).
const LINES_PER_REQUEST: usize = 2;

/// Requests that log more than the queue and a pipe's buffer (64 KiB: a few hundred lines)
/// hold together.
const REQUESTS: usize = (QUEUED_LINES + 2_000) / LINES_PER_REQUEST;

/// Requests in flight at once while filling.
const CLIENTS: usize = 8;

/// How long any one request may take: a process stalled on its log never answers.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_stderr_pipe_stalls_neither_requests_nor_deliveries() {
    let db = TestDb::new(Backend::Sqlite).await;
    let token = admin_token(&db).await;
    let receiver = Receiver::accepting().await;
    let mut command = courier_command(&db.url);
    command
        .arg("serve")
        .env("COURIER_BIND", "127.0.0.1:0")
        .env("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true")
        .env("RUST_LOG", "info,tower_http=debug")
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn serve");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    // Read up to the line naming the address, then stop reading (the pipe stays open).
    let mut line = String::new();
    let addr = loop {
        line.clear();
        let read = stderr.read_line(&mut line).expect("read stderr");
        assert!(read > 0, "serve exited before it listened");
        let entry: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if entry["message"] == "listening" {
            break entry["addr"].as_str().expect("addr").to_owned();
        }
    };
    let served = Served::new(child, addr);

    let client = http_client();
    let mut fillers = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (client, url) = (client.clone(), format!("http://{}/healthz", served.addr));
        fillers.spawn(async move {
            for _ in 0..REQUESTS / CLIENTS {
                let answer = client.get(&url).timeout(ANSWER_WITHIN).send().await;
                let status = answer.map(|answer| answer.status().as_u16());
                assert!(
                    matches!(status, Ok(200)),
                    "with its log unread the process still answers: {status:?}"
                );
            }
        });
    }
    while let Some(filled) = fillers.join_next().await {
        filled.expect("a filler finished");
    }

    let endpoint = served.create_endpoint(&token, &receiver, "hook", &[]).await;
    let body = served
        .graphql(
            &token,
            "mutation($id: ID!) { submit(input: {endpointId: $id, payload: {n: 1}}) { created } }",
            json!({ "id": endpoint }),
        )
        .await;
    assert_eq!(body["data"]["submit"]["created"], true, "{body}");
    let received = receiver.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(received.len(), 1, "the submission is delivered");

    let metrics = client
        .get(format!("http://{}/metrics", served.addr))
        .timeout(ANSWER_WITHIN)
        .send()
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    let dropped: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("courier_log_lines_dropped_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no dropped-lines counter in {metrics}"));
    assert!(dropped > 0, "lines that did not fit are counted as dropped");
    drop(stderr);
}
