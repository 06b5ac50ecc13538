//! The log lines an operator reads, through the built binary: plain `courier` with flags,
//! a refused collector, which database each command used, and one line per outcome and per
//! WebSocket.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::fixtures::submit;
use crate::support::fixtures::{endpoint_on, quick_worker};
use crate::support::process::{plain_courier, run_to_end, TempDir};
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// A running `courier` child whose JSON log lines are collected as they arrive.
struct Running {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Running {
    /// Starts `command` (JSON logs) and waits for it to listen.
    fn start(mut command: Command) -> Running {
        let mut child = command
            .env("COURIER_LOG_FORMAT", "json")
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn courier");
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let entry = serde_json::from_str(&line).unwrap_or(Value::String(line));
                collected.lock().expect("lines").push(entry);
            }
        });
        let running = Running { child, lines };
        running.wait_for(|line| line["message"] == "listening");
        running
    }

    /// The first log line matching `matches`, waiting up to 30 s for it.
    fn wait_for(&self, matches: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(line) = self
                .lines
                .lock()
                .expect("lines")
                .iter()
                .find(|l| matches(l))
            {
                return line.clone();
            }
            assert!(Instant::now() < deadline, "no such log line");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn addr(&self) -> String {
        let listening = self.wait_for(|line| line["message"] == "listening");
        listening["addr"].as_str().expect("addr").to_owned()
    }

    fn lines(&self) -> Vec<Value> {
        self.lines.lock().expect("lines").clone()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Plain `courier --bind ...` serves like `courier serve --bind ...`; `yes` and `1` are true,
/// and allowing private destinations is warned about; a relative SQLite default is logged
/// by its absolute path. So are settings at odds: a payload limit above the body limit, and
/// a bind on every interface with no public URL for portal links.
#[test]
fn plain_courier_serves_with_flags_and_boolean_words() {
    let dir = TempDir::new();
    for (value, warned) in [("yes", true), ("1", true), ("no", false)] {
        let mut command = plain_courier("sqlite://courier.db?mode=rwc");
        let (bind, payload) = match warned {
            true => ("0.0.0.0:0", "2000000"),
            false => ("127.0.0.1:0", "262144"),
        };
        command
            .current_dir(&dir.0)
            .args(["--bind", bind])
            .env("COURIER_ALLOW_PRIVATE_DESTINATIONS", value)
            .env("COURIER_MAX_PAYLOAD_BYTES", payload)
            .env("COURIER_WORKER_CONCURRENCY", "0");
        let running = Running::start(command);
        let lines = running.lines();
        let starting = lines
            .iter()
            .find(|line| line["message"] == "starting")
            .expect("a start-up line");
        assert_eq!(
            starting["database"],
            format!("sqlite://{}", dir.0.join("courier.db").display()),
            "the absolute path of the database"
        );
        let warned_of = |setting: &str| {
            lines.iter().any(|line| {
                line["level"] == "WARN"
                    && line["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with(setting))
            })
        };
        for setting in [
            "COURIER_ALLOW_PRIVATE_DESTINATIONS",
            "COURIER_MAX_PAYLOAD_BYTES",
            "COURIER_PUBLIC_URL",
        ] {
            assert_eq!(warned_of(setting), warned, "{setting}, given {value}");
        }
    }
}

/// A soft open-file limit below the connection cap (the usual default, 1,024, is below the
/// default cap of 4,096) is raised to the hard limit at start-up, so the cap, not the
/// limit, decides when a connection is refused; nothing is warned about then.
#[test]
fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
    let dir = TempDir::new();
    let courier = plain_courier("sqlite://courier.db?mode=rwc");
    let mut command = Command::new("sh");
    command
        .args(["-c", r#"ulimit -S -n 256 && exec "$0" "$@""#])
        .arg(courier.get_program())
        .args(["--bind", "127.0.0.1:0"])
        .envs(courier.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env("COURIER_WORKER_CONCURRENCY", "0")
        .current_dir(&dir.0);
    let running = Running::start(command);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", running.child.id()))
        .expect("the child's limits");
    let open_files: Vec<&str> = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("an open files line")
        .split_whitespace()
        .collect();
    let (soft, hard) = (open_files[3], open_files[4]);
    assert_ne!(soft, "256", "raised");
    assert_eq!(soft, hard, "to the hard limit");
    let warned = running.lines().iter().any(|line| {
        line["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("COURIER_MAX_CONNECTIONS"))
    });
    let enough = hard == "unlimited" || hard.parse::<u64>().is_ok_and(|n| n >= 4_096 + 64 + 64);
    assert_eq!(
        warned, !enough,
        "warned only if even the hard limit is too low"
    );
}

/// An `OTEL_RESOURCE_ATTRIBUTES` that cannot be decoded is told, and none of it is used
/// (the service is `courier`, not the undecoded name), as the specification asks; so is an
/// `OTEL_EXPORTER_OTLP_HEADERS` entry that the exporter would leave out.
#[test]
fn unreadable_resource_attributes_are_told_and_left_out() {
    let dir = TempDir::new();
    let mut command = plain_courier("sqlite://courier.db?mode=rwc");
    command
        .current_dir(&dir.0)
        .args(["--bind", "127.0.0.1:0"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .env("OTEL_SERVICE_NAME", "")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.name=hooks%ZZ,team=payments",
        )
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-team=payments,Bearer hunter2",
        )
        .env("COURIER_WORKER_CONCURRENCY", "0");
    let running = Running::start(command);
    let on = running.wait_for(|line| line["message"] == "exporting traces over OTLP/HTTP");
    assert_eq!(on["service_name"], "courier", "{on}");
    let told = running.wait_for(|line| {
        line["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("OTEL_RESOURCE_ATTRIBUTES cannot be read"))
    });
    assert_eq!(told["level"], "WARN", "{told}");
    // A header entry the exporter would drop is told too, never with what it holds.
    let header = running.wait_for(|line| {
        line["message"] == "an entry of OTEL_EXPORTER_OTLP_HEADERS is not sent with exports"
    });
    assert_eq!(header["reason"], "an entry is not key=value", "{header}");
    assert!(!header.to_string().contains("hunter2"), "{header}");
}

/// Tracing being on is told at start-up (where spans go, under which service name: here
/// the `service.name` of `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME` being empty), a
/// collector that refuses every export is told in the log (once, not per export), and a
/// `RUST_LOG` that cannot be read is told and replaced by the default filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_collector_and_an_unreadable_rust_log_are_told() {
    let db = TestDb::new(Backend::Sqlite).await;
    let token = crate::support::process::admin_token(&db).await;
    // A port nothing listens on: bound, then let go.
    let refused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let collector = format!("http://{}", refused.local_addr().expect("addr"));
    drop(refused);
    let mut command = plain_courier(&db.url);
    command
        .args(["serve", "--bind", "127.0.0.1:0"])
        .env("RUST_LOG", "courier=loud")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector)
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .env("OTEL_SERVICE_NAME", "")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.name=hooks%2Deu,team=payments",
        )
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
        .env("COURIER_WORKER_CONCURRENCY", "0");
    let running = Running::start(command);
    let on = running.wait_for(|line| line["message"] == "exporting traces over OTLP/HTTP");
    assert_eq!(on["url"], format!("{collector}/v1/traces"), "{on}");
    assert_eq!(on["service_name"], "hooks-eu", "{on}");
    let told = running.wait_for(|line| {
        line["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("RUST_LOG cannot be read"))
    });
    assert_eq!(told["level"], "WARN", "{told}");
    let url = format!("http://{}/graphql", running.addr());
    for _ in 0..5 {
        let answer = crate::support::http_client()
            .post(&url)
            .bearer_auth(&token)
            .json(&json!({ "query": "{ currentKey { role } }" }))
            .send()
            .await
            .expect("answered");
        assert!(answer.status().is_success());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let failed = running.wait_for(|line| {
        line["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("exporting spans failed"))
    });
    assert_eq!(failed["level"], "WARN", "{failed}");
    let times = running
        .lines()
        .iter()
        .filter(|line| line["message"] == failed["message"])
        .count();
    assert_eq!(times, 1, "told once a minute, not per export");
}

/// Every command that uses the database says which, by absolute path (`api-key create`
/// beside the key it made), and plain-text logs written to a pipe carry no colour codes.
#[test]
fn every_command_names_the_database_it_used() {
    let dir = TempDir::new();
    let path = dir.0.join("keys.db");
    let named = format!("sqlite://{}", path.display());
    let in_dir = |args: &[&str]| {
        let mut command = plain_courier("sqlite://keys.db?mode=rwc");
        command.current_dir(&dir.0).args(args);
        let output = run_to_end(command);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(!stderr.contains('\u{1b}'), "no ANSI colours in a pipe");
        (output, stderr)
    };

    let (output, stderr) = in_dir(&["api-key", "create", "--name", "ops", "--role", "admin"]);
    assert!(output.status.success(), "{stderr}");
    let created = stderr
        .lines()
        .find(|line| line.contains("API key created"))
        .expect("a line about the key");
    assert!(created.contains(&named), "{created}");
    let listed = |stdout: &[u8]| String::from_utf8_lossy(stdout).into_owned();
    let (output, _) = in_dir(&["api-key", "list"]);
    let keys = listed(&output.stdout);
    let id = keys
        .lines()
        .nth(1)
        .and_then(|line| line.split('\t').next())
        .unwrap_or_else(|| panic!("the key is listed: {keys}"))
        .to_owned();

    for args in [
        vec!["api-key", "list"],
        vec!["api-key", "revoke", &id],
        vec!["api-key", "revoke", "00000000-0000-0000-0000-000000000000"],
        vec!["tenant", "create", "--name", "Acme"],
        vec!["tenant", "list"],
        vec!["migrate"],
    ] {
        let (_, stderr) = in_dir(&args);
        let line = stderr
            .lines()
            .find(|line| line.contains("database open"))
            .unwrap_or_else(|| panic!("{args:?} names its database: {stderr}"));
        assert!(line.contains(&named), "{args:?}: {line}");
    }
}

/// One INFO line per delivery outcome and per WebSocket opened or closed, none of them
/// with `Some(...)` debug formatting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_and_websockets_are_logged_one_line_each() {
    let db = TestDb::new(Backend::Sqlite).await;
    // Path "flaky": 500 then 200; path "down": always 500.
    let receiver = Receiver::start(|n| Reply::status(if n == 1 { 500 } else { 200 })).await;
    let down = Receiver::start(|_| Reply::status(500)).await;
    let api = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.worker_concurrency = 0;
    })
    .await;
    let admin = api.admin_token().await;
    let flaky = endpoint_on(&api, &admin, &receiver, "flaky").await;
    let failing = endpoint_on(&api, &admin, &down, "down").await;

    let mut command = plain_courier(&db.url);
    command.arg("serve").envs([
        ("COURIER_BIND", "127.0.0.1:0"),
        ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("COURIER_POLL_INTERVAL_MS", "50"),
        ("COURIER_RETRY_BASE_MS", "50"),
        ("COURIER_MAX_ATTEMPTS", "2"),
    ]);
    let running = tokio::task::spawn_blocking(move || Running::start(command))
        .await
        .expect("start");
    let retried = submit(&api, &admin, &flaky, json!({ "n": 1 }), None).await;
    let retried = retried["data"]["submit"]["delivery"]["id"].clone();
    let failed = submit(&api, &admin, &failing, json!({ "n": 2 }), None).await;
    let failed = failed["data"]["submit"]["delivery"]["id"].clone();

    let (running, lines) = tokio::task::spawn_blocking(move || {
        let lines = [
            (&retried, "attempt failed; retry scheduled"),
            (&retried, "delivered"),
            (&failed, "attempt failed; retry scheduled"),
        ]
        .map(|(id, message)| {
            running.wait_for(|line| {
                line["delivery_id"] == *id && line["level"] == "INFO" && line["message"] == message
            })
        });
        let gave_up = running.wait_for(|line| {
            line["delivery_id"] == failed
                && line["level"] == "INFO"
                && line["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("delivery failed"))
        });
        (running, (lines, gave_up))
    })
    .await
    .expect("logs");
    let ([retry, delivered, _], gave_up) = lines;
    // Numbers as JSON numbers.
    assert_eq!(retry["status"], 500, "{retry}");
    assert!(retry["duration_ms"].is_u64(), "{retry}");
    assert!(retry["retry_in_ms"].is_u64(), "{retry}");
    assert_eq!(delivered["status"], 200, "{delivered}");
    assert!(
        retry["next_attempt_at"]
            .as_str()
            .is_some_and(|at| !at.is_empty()),
        "{retry}"
    );
    assert_eq!(delivered["attempt"], 2, "{delivered}");
    assert_eq!(gave_up["attempt"], 2, "{gave_up}");

    // A WebSocket with a wrong key: opened, then closed with 4403.
    let ws_url = format!("ws://{}/graphql/ws", running.addr());
    let connect = || async {
        let mut request =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                ws_url.as_str(),
            )
            .expect("request");
        request.headers_mut().insert(
            "sec-websocket-protocol",
            "graphql-transport-ws".parse().expect("header"),
        );
        tokio_tungstenite::connect_async(request)
            .await
            .expect("upgrade")
            .0
    };
    let mut socket = connect().await;
    crate::support::websocket::send(
        &mut socket,
        json!({ "type": "connection_init", "payload": { "Authorization": "Bearer wrong" } }),
    )
    .await;
    while crate::support::websocket::next(&mut socket).await.is_some() {}
    let running = tokio::task::spawn_blocking(move || {
        running.wait_for(|line| line["message"] == "WebSocket opened");
        let closed = running.wait_for(|line| line["message"] == "WebSocket closed");
        assert_eq!(closed["code"], 4403, "{closed}");
        running
    })
    .await
    .expect("logs");

    // Closed by the client with its own code, and dropped without a close frame: each is
    // told as it happened, not as a normal closure.
    let mut closing = connect().await;
    use futures_util::SinkExt as _;
    let frame = tokio_tungstenite::tungstenite::protocol::CloseFrame {
        code: 4002.into(),
        reason: "raw-reason".into(),
    };
    let _ = closing
        .send(tokio_tungstenite::tungstenite::Message::Close(Some(frame)))
        .await;
    while crate::support::websocket::next(&mut closing)
        .await
        .is_some()
    {}
    let dropped = connect().await;
    drop(dropped);
    let running = tokio::task::spawn_blocking(move || {
        let closed = running.wait_for(|line| line["code"] == 4002);
        assert_eq!(closed["reason"], "raw-reason", "{closed}");
        assert_eq!(closed["by"], "client", "{closed}");
        let broken = running.wait_for(|line| line["code"] == 1006);
        assert_eq!(broken["message"], "WebSocket closed", "{broken}");
        running
    })
    .await
    .expect("logs");

    for line in running.lines() {
        assert!(
            !line.to_string().contains("Some("),
            "no debug formatting: {line}"
        );
    }
}
