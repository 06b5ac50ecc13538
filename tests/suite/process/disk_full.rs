//! A disk that fills up under a serving process (its files capped with `ulimit -f`, the
//! signal a write past the cap raises ignored, so each such write fails as on a full disk):
//! submissions are answered `SERVICE_UNAVAILABLE` (HTTP 503 with `Retry-After`), which a
//! client knows to retry, rather than `INTERNAL_SERVER_ERROR`, and the log says, as an
//! error, that the database's disk failed the work (a file past its cap fails SQLite's
//! write as an I/O error).

use std::process::Command;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::http_client;
use crate::support::process::{plain_courier, run_to_end, start_serve, Served, TempDir, COURIER};

/// The largest file the process may write, in KiB: room for a few hundred submissions.
const FILE_CAP_KIB: u32 = 2_048;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_service_unavailable() {
    let dir = TempDir::new();
    let url = format!("sqlite://{}?mode=rwc", dir.0.join("full.db").display());
    let mut create = plain_courier(&url);
    create.args(["api-key", "create", "--name", "full", "--role", "admin"]);
    let created = run_to_end(create);
    assert!(created.status.success(), "{created:?}");
    let token = String::from_utf8_lossy(&created.stdout).trim().to_owned();

    // `serve` is appended to this command's arguments: `$0` is the binary, `$@` is `serve`.
    // Its log is copied to a file as well.
    let log = dir.0.join("serve.log");
    let mut capped = Command::new("bash");
    capped
        .args([
            "-c",
            &format!(
                "trap '' XFSZ; ulimit -f {FILE_CAP_KIB}; exec \"$0\" \"$@\" 2> >(tee '{}' >&2)",
                log.display()
            ),
            COURIER,
        ])
        .env("DATABASE_URL", &url)
        .env("COURIER_LOG_FORMAT", "json");
    let (child, addr, _) = start_serve(capped, &[("COURIER_WORKER_CONCURRENCY", "0")]);
    let served = Served::new(child, addr);
    let created = served
        .graphql(
            &token,
            "mutation { createEndpoint(input: {name: \"full\", url: \"https://example.com/full\"}) { endpoint { id } } }",
            json!({}),
        )
        .await;
    let endpoint = created["data"]["createEndpoint"]["endpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();

    let filler = "x".repeat(4_000);
    let mut accepted = 0;
    let refused = loop {
        assert!(accepted < 2_000, "the cap was never reached");
        let answer = http_client()
            .post(format!("http://{}/graphql", served.addr))
            .bearer_auth(&token)
            .json(&json!({
                "query": "mutation($input: SubmitInput!) { submit(input: $input) { submission { id } } }",
                "variables": { "input": { "endpointId": endpoint, "payload": { "filler": filler, "n": accepted } } },
            }))
            .send()
            .await
            .expect("the process answers");
        let status = answer.status();
        let retry_after = answer.headers().get("retry-after").cloned();
        let body: Value = answer.json().await.expect("a JSON body");
        if status == StatusCode::OK && body["errors"].is_null() {
            accepted += 1;
            continue;
        }
        break (status, retry_after, body);
    };
    assert!(accepted > 0, "nothing was accepted before the disk filled");
    let (status, retry_after, body) = refused;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(retry_after.is_some(), "a Retry-After header: {body}");
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "SERVICE_UNAVAILABLE",
        "{body}"
    );
    // An operator has something to mend: an error, saying what.
    let said = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .any(|entry| {
                entry["level"] == "ERROR"
                    && entry["message"]
                        .as_str()
                        .is_some_and(|message| message.contains("disk"))
            })
    };
    crate::support::fixtures::eventually(
        "an error logged: the disk failed the work",
        std::time::Duration::from_secs(10),
        || async { said() },
    )
    .await;
}
