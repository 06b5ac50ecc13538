//! An endpoint whose signing secret no key opens (the key that sealed it lost, or the value
//! damaged) is recovered by giving it a new secret: `courier endpoint rotate-secret` when no
//! process starts (each refuses such a secret, naming the endpoint and the command), or
//! `rotateEndpointSecret`, which never keeps a replaced secret it cannot open. Before, no
//! command could rotate a secret, and a rotation kept the unreadable secret signing for the
//! grace period, so every process refused to start until it expired.

use std::process::{Command, Stdio};
use std::time::Duration;

use courier::crypto::sealing::SecretKeys;
use serde_json::json;

use crate::support::endpoints::new_encryption_key;
use crate::support::fixtures::{delivery_id, rows, submit, wait_for_state};
use crate::support::process::{courier_command, spawn_serve, Served};
use crate::support::{Backend, Receiver, TestApp, TestDb};

/// `courier serve` on `db` with `key`: its exit status and stderr, once it has exited
/// (within 20 s), or `None` while it serves (then it is stopped).
fn serve_until_exit(db: &TestDb, key: &str) -> Option<(std::process::ExitStatus, String)> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_courier"))
        .arg("serve")
        .env("DATABASE_URL", &db.url)
        .env("COURIER_BIND", "127.0.0.1:0")
        .env("COURIER_WORKER_CONCURRENCY", "0")
        .env("COURIER_ENCRYPTION_KEY", key)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn courier serve");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait") {
            let output = child.wait_with_output().expect("output");
            return Some((status, String::from_utf8_lossy(&output.stderr).into_owned()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The key that sealed two endpoints' secrets is lost: `courier serve` with a new key
/// refuses, naming the first endpoint, the command that recovers it, and that one more
/// secret does not open, having written nothing; `courier endpoint rotate-secret` refuses
/// to keep the unreadable secret signing for a grace, and with `--grace-seconds 0` gives
/// each a new secret; then the process starts and its webhooks verify with the new secret.
#[tokio::test]
async fn an_endpoint_whose_key_is_lost_is_recovered_with_the_cli() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (lost, new) = (new_encryption_key(), new_encryption_key());
    let app = TestApp::spawn_with(&db, |config| {
        config.encryption_key = Some(SecretKeys::parse(&lost).expect("a key"));
    })
    .await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let mut endpoints = vec![
        app.create_endpoint(&admin, &receiver.url("a")).await.0,
        app.create_endpoint(&admin, &receiver.url("b")).await.0,
    ];
    endpoints.sort();
    // A third endpoint's secret in clear (as before encryption was turned on): it opens
    // with any key, and a process that refuses to start must leave it as it is.
    let (clear, _) = app.create_endpoint(&admin, &receiver.url("c")).await;
    let clear = sea_orm::Value::from(uuid::Uuid::parse_str(&clear).expect("a uuid"));
    let in_clear =
        "SELECT signing_secret FROM endpoints WHERE id = $1 AND signing_secret LIKE 'whsec_%'";
    rows(
        &app.state.db,
        "UPDATE endpoints SET signing_secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' WHERE id = $1",
        vec![clear.clone()],
    )
    .await;
    app.stop().await;

    let (status, stderr) = serve_until_exit(&db, &new).expect("serve refuses to start");
    assert_eq!(status.code(), Some(1), "{stderr}");
    let pool = db.connect(1).await;
    assert_eq!(
        rows(&pool, in_clear, vec![clear]).await.len(),
        1,
        "a process that refused to start wrote nothing"
    );
    pool.close().await.expect("closed");
    let first = &endpoints[0];
    assert!(
        stderr.contains(&format!(
            "endpoint {first}'s current signing secret cannot be used"
        )) && stderr.contains(&format!("courier endpoint rotate-secret {first}"))
            && stderr.contains("COURIER_ENCRYPTION_KEY")
            && stderr.contains("one more secret does not open either"),
        "{stderr}"
    );

    // With a grace the unreadable secret would sign on: refused, saying what to do.
    let output = courier_command(&db.url)
        .args(["endpoint", "rotate-secret", first])
        .env("COURIER_ENCRYPTION_KEY", &new)
        .output()
        .expect("run courier endpoint rotate-secret");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("rotate with a grace of 0"),
        "{stderr}"
    );
    let mut secrets = Vec::new();
    for endpoint in &endpoints {
        let output = courier_command(&db.url)
            .args([
                "endpoint",
                "rotate-secret",
                endpoint,
                "--grace-seconds",
                "0",
            ])
            .env("COURIER_ENCRYPTION_KEY", &new)
            .stderr(Stdio::piped())
            .output()
            .expect("run courier endpoint rotate-secret");
        let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        assert!(
            output.status.success() && stdout.starts_with("whsec_"),
            "{stdout} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        secrets.push(stdout);
    }
    let pool = db.connect(1).await;
    let kept = rows(
        &pool,
        "SELECT id FROM endpoints WHERE previous_signing_secret IS NOT NULL",
        vec![],
    )
    .await;
    assert!(kept.is_empty(), "an unreadable secret is not kept signing");
    pool.close().await.expect("closed");

    let (child, addr) = spawn_serve(
        &db.url,
        &[
            ("COURIER_ENCRYPTION_KEY", new.as_str()),
            ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true"),
            ("COURIER_POLL_INTERVAL_MS", "100"),
        ],
    );
    let served = Served::new(child, addr);
    let token = crate::support::process::admin_token(&db).await;
    served
        .graphql(
            &token,
            "mutation($id: ID!) { submit(input: {endpointId: $id, payload: {}}) { created } }",
            json!({ "id": first }),
        )
        .await;
    let received = receiver.wait_for(1, Duration::from_secs(20)).await;
    assert!(
        received[0].verifies_with(&secrets[0]),
        "signed with the new secret"
    );
}

/// `rotateEndpointSecret` on an endpoint whose secret was damaged (copied from another
/// endpoint's row): refused with a grace (the damaged secret would sign on), done without
/// one; deliveries go out signed with the new secret, and a process starting next starts.
#[tokio::test]
async fn a_rotation_does_not_keep_a_secret_it_cannot_open() {
    let db = TestDb::new(Backend::Sqlite).await;
    let key = new_encryption_key();
    let with_key = |config: &mut courier::config::ServeArgs| {
        crate::support::fixtures::quick_worker(config);
        config.encryption_key = Some(SecretKeys::parse(&key).expect("a key"));
    };
    let app = TestApp::spawn_with(&db, with_key).await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (damaged, _) = app.create_endpoint(&admin, &receiver.url("a")).await;
    let (other, _) = app.create_endpoint(&admin, &receiver.url("b")).await;
    let id = |id: &str| sea_orm::Value::from(uuid::Uuid::parse_str(id).expect("a uuid"));
    let copied = rows(
        &app.state.db,
        "UPDATE endpoints SET signing_secret = \
         (SELECT signing_secret FROM endpoints WHERE id = $1) WHERE id = $2 RETURNING id",
        vec![id(&other), id(&damaged)],
    )
    .await;
    assert_eq!(copied.len(), 1, "the secret was damaged");

    let rotate =
        "mutation($id: ID!, $grace: Int) { rotateEndpointSecret(id: $id, graceSeconds: $grace) \
                  { secret endpoint { previousSecretExpiresAt } } }";
    let refused = app.graphql(&admin, rotate, json!({ "id": damaged })).await;
    assert_eq!(
        refused["errors"][0]["extensions"]["code"], "BAD_USER_INPUT",
        "with a grace the damaged secret would sign on: {refused}"
    );
    assert!(
        refused["errors"][0]["message"]
            .as_str()
            .is_some_and(|message| message.contains("rotate with a grace of 0")),
        "{refused}"
    );
    let rotated = app
        .graphql(&admin, rotate, json!({ "id": damaged, "grace": 0 }))
        .await;
    let rotation = &rotated["data"]["rotateEndpointSecret"];
    assert!(rotation["secret"].is_string(), "{rotated}");
    assert!(
        rotation["endpoint"]["previousSecretExpiresAt"].is_null(),
        "no replaced secret signs on: {rotated}"
    );
    let secret = rotation["secret"].as_str().unwrap_or_default().to_owned();
    let delivery = delivery_id(&submit(&app, &admin, &damaged, json!({}), None).await);
    wait_for_state(
        &app,
        &admin,
        &delivery,
        "DELIVERED",
        Duration::from_secs(10),
    )
    .await;
    assert!(receiver.received()[0].verifies_with(&secret));
    app.stop().await;

    // Every stored secret opens: the next process starts.
    let next = TestApp::spawn_with(&db, with_key).await;
    next.stop().await;
}
