//! The built `courier` binary run as a child process, as users run it (optionally with its
//! wall clock shifted by libfaketime).

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use courier::auth::{self, Role};
use serde_json::{json, Value};

use super::{http_client, Receiver, TestDb};

pub const COURIER: &str = env!("CARGO_BIN_EXE_courier");

/// `courier` on `database_url`, logging JSON.
pub fn courier_command(database_url: &str) -> Command {
    let mut command = Command::new(COURIER);
    command
        .env("DATABASE_URL", database_url)
        .env("COURIER_LOG_FORMAT", "json");
    command
}

/// Starts `courier serve` on port 0 with extra settings; returns it and its address.
pub fn spawn_serve(database_url: &str, settings: &[(&str, &str)]) -> (Child, String) {
    let (child, addr, _) = start_serve(courier_command(database_url), settings);
    (child, addr)
}

/// Starts `courier serve` like [`spawn_serve`], with its wall clock shifted by `offset`
/// (libfaketime syntax, e.g. `+120s`) while its monotonic clock, which drives timers, stays
/// true. Checks from the process's own log that the shift took.
pub fn spawn_serve_skewed(
    database_url: &str,
    settings: &[(&str, &str)],
    offset_secs: i64,
) -> (Child, String) {
    // Preloaded directly (not through the `faketime` wrapper, which would stand between
    // this test and the process it has to stop).
    let mut command = courier_command(database_url);
    command
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", format!("{offset_secs:+}s"))
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    let (child, addr, logged_at) = start_serve(command, settings);
    let skew = logged_at.map(|at| (at - chrono::Utc::now()).num_seconds());
    assert!(
        skew.is_some_and(|skew| (skew - offset_secs).abs() <= 15),
        "the process should log times {offset_secs:+}s off, but its skew is {skew:?}"
    );
    (child, addr)
}

/// libfaketime's preload library (Debian package `faketime`). These tests need it and
/// never skip without it.
pub fn libfaketime() -> std::path::PathBuf {
    let candidates = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|dir| dir.path().join("faketime/libfaketimeMT.so.1"))
        .chain([
            "/usr/lib/faketime/libfaketimeMT.so.1".into(),
            "/usr/local/lib/faketime/libfaketimeMT.so.1".into(),
        ]);
    let found = candidates.into_iter().find(|path| path.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "libfaketime is missing: install the `faketime` package (apt-get install faketime; .ci/run does)"
        )
    })
}

/// Runs `command serve` on port 0; returns the process, its address and the time it logged
/// when it started listening.
pub fn start_serve(
    mut command: Command,
    settings: &[(&str, &str)],
) -> (Child, String, Option<chrono::DateTime<chrono::Utc>>) {
    command
        .arg("serve")
        .env("COURIER_BIND", "127.0.0.1:0")
        .stderr(Stdio::piped());
    for (name, value) in settings {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawn serve");
    let stderr = child.stderr.take().expect("stderr");
    let (found, rest) = std::sync::mpsc::channel();
    // Keep reading stderr for the life of the process, so its logging never blocks.
    std::thread::spawn(move || {
        let mut found = Some(found);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let entry: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if entry["message"] == "listening" {
                if let (Some(found), Some(addr)) = (found.take(), entry["addr"].as_str()) {
                    let at = entry["timestamp"]
                        .as_str()
                        .and_then(|at| at.parse::<chrono::DateTime<chrono::Utc>>().ok());
                    let _ = found.send((addr.to_owned(), at));
                }
            }
        }
    });
    let (addr, at) = rest
        .recv_timeout(Duration::from_secs(30))
        .expect("serve logs the address it listens on");
    (child, addr, at)
}

/// A `courier serve` child process, killed when dropped.
pub struct Served {
    child: Child,
    /// Where it listens.
    pub addr: String,
}

impl Served {
    /// `courier serve` on `database_url` with `settings` (see [`spawn_serve`]).
    pub fn start(database_url: &str, settings: &[(&str, &str)]) -> Served {
        let (child, addr) = spawn_serve(database_url, settings);
        Served::new(child, addr)
    }

    /// Takes charge of a process started otherwise.
    pub fn new(child: Child, addr: String) -> Served {
        Served { child, addr }
    }

    /// POSTs a GraphQL request to this process and returns the JSON body.
    pub async fn graphql(&self, token: &str, query: &str, variables: Value) -> Value {
        self.graphql_with_headers(token, query, variables, &[])
            .await
    }

    /// Creates an endpoint on `receiver` at `path`, subscribed to `event_types` (none: every
    /// type), and gives the receiver its secret; returns its id.
    pub async fn create_endpoint(
        &self,
        token: &str,
        receiver: &Receiver,
        path: &str,
        event_types: &[&str],
    ) -> String {
        let body = self
            .graphql(
                token,
                "mutation($url: String!, $types: [String!]) { createEndpoint(input: \
                 {name: \"served\", url: $url, eventTypes: $types}) { endpoint { id } secret } }",
                json!({ "url": receiver.url(path), "types": event_types }),
            )
            .await;
        let created = &body["data"]["createEndpoint"];
        receiver.set_secret(path, created["secret"].as_str().expect("secret"));
        created["endpoint"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("endpoint: {body}"))
            .to_owned()
    }

    /// Like [`Served::graphql`], with extra request headers.
    pub async fn graphql_with_headers(
        &self,
        token: &str,
        query: &str,
        variables: Value,
        headers: &[(&str, &str)],
    ) -> Value {
        let mut request = http_client()
            .post(format!("http://{}/graphql", self.addr))
            .bearer_auth(token)
            .json(&json!({ "query": query, "variables": variables }));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
            .send()
            .await
            .expect("the process answers")
            .json()
            .await
            .expect("a JSON body")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An admin token, made directly in the database.
pub async fn admin_token(db: &TestDb) -> String {
    let pool = db.connect(1).await;
    let token = auth::create_api_key(&pool, "admin", Role::Admin, Default::default())
        .await
        .expect("create an API key")
        .token;
    pool.close().await.expect("close");
    token
}

/// `courier` with plain-text logs (as a newcomer sees them) on `database_url`.
pub fn plain_courier(database_url: &str) -> Command {
    let mut command = Command::new(COURIER);
    command
        .env("DATABASE_URL", database_url)
        .env("COURIER_LOG_FORMAT", "text")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

/// Runs a command expected to stop by itself, killing it if it does not within 30 s.
pub fn run_to_end(mut command: Command) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn courier");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// The single line of stderr that reports the failure; fails unless the command failed and
/// said so exactly once, on one line, with no PostgreSQL source-line noise.
pub fn fatal_line(output: &Output) -> String {
    assert!(!output.status.success(), "the command failed");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("error:") || line.contains("ERROR"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    assert!(
        !stderr.contains(" at line "),
        "no server source lines: {stderr}"
    );
    errors[0].to_owned()
}

/// A directory of its own under the system temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new, empty one.
    pub fn new() -> TempDir {
        let path = std::env::temp_dir().join(format!("courier-first-run-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
