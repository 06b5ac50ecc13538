//! Secrets encrypted at rest: with `COURIER_ENCRYPTION_KEY` set the database holds no signing
//! secret in clear, webhooks still verify, plaintext secrets are sealed at start-up and moved
//! to a new first key, and a process that cannot open a stored secret refuses to start.

use std::process::{Command, Stdio};
use std::time::Duration;

use courier::crypto::sealing::SecretKeys;
use courier::service::sealing::{seal_at_rest, SEALING_LOCK_KEY};
use serde_json::json;

use crate::on_both_backends;
use crate::support::endpoints::new_encryption_key;
use crate::support::fixtures::delivery_id;
use crate::support::fixtures::rows;
use crate::support::fixtures::submit;
use crate::support::fixtures::{eventually, loop_at_rest, quick_worker, wait_for_state};
use crate::support::{Backend, Receiver, TestApp, TestDb};

/// Every secret column of every endpoint, as stored.
async fn stored_secrets(app: &TestApp) -> Vec<String> {
    rows(
        &app.state.db,
        "SELECT signing_secret, previous_signing_secret FROM endpoints",
        vec![],
    )
    .await
    .iter()
    .flat_map(|row| {
        let current: String = row.try_get("", "signing_secret").unwrap();
        let previous: Option<String> = row.try_get("", "previous_signing_secret").unwrap();
        std::iter::once(current).chain(previous)
    })
    .collect()
}

/// The key material of a `whsec_` secret (what would leak).
fn material(secret: &str) -> &str {
    secret.trim_start_matches("whsec_")
}

async fn no_secret_is_stored_in_clear_and_webhooks_still_verify(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keys = SecretKeys::parse(&new_encryption_key()).unwrap();
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.encryption_key = Some(keys.clone());
    })
    .await;
    let admin = app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (id, old) = app.create_endpoint(&admin, &receiver.url("sealed")).await;
    let rotated = app
        .graphql(
            &admin,
            "mutation($id: ID!) { rotateEndpointSecret(id: $id, graceSeconds: 600) { secret } }",
            json!({ "id": id }),
        )
        .await;
    let new = rotated["data"]["rotateEndpointSecret"]["secret"]
        .as_str()
        .unwrap_or_else(|| panic!("{rotated}"))
        .to_owned();

    let stored = stored_secrets(&app).await;
    assert_eq!(stored.len(), 2, "current and previous");
    for value in &stored {
        assert!(value.starts_with("enc:v1:"), "sealed");
        for secret in [&old, &new] {
            assert!(
                !value.contains(material(secret)),
                "a secret is stored in clear"
            );
        }
    }

    let delivery = delivery_id(&submit(&app, &admin, &id, json!({ "sealed": true }), None).await);
    wait_for_state(
        &app,
        &admin,
        &delivery,
        "DELIVERED",
        Duration::from_secs(10),
    )
    .await;
    let received = receiver.received();
    assert!(received[0].verifies_with(&new) && received[0].verifies_with(&old));
}

async fn start_up_seals_plaintext_and_moves_secrets_to_the_first_key(backend: Backend) {
    let db = TestDb::new(backend).await;
    let plain_app = TestApp::spawn(&db).await;
    let admin = plain_app.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (id, secret) = plain_app.create_endpoint(&admin, &receiver.url("r")).await;
    assert_eq!(
        stored_secrets(&plain_app).await,
        vec![secret.clone()],
        "no key: as is"
    );
    plain_app.stop().await;

    let pool = db.connect(2).await;
    let (first, second) = (new_encryption_key(), new_encryption_key());
    let one = SecretKeys::parse(&first).unwrap();
    assert_eq!(seal_at_rest(&pool, &one).await.unwrap().secrets, 1);
    assert_eq!(
        seal_at_rest(&pool, &one).await.unwrap().secrets,
        0,
        "already sealed"
    );
    let sealed_once = stored_secrets_of(&pool).await;
    assert!(sealed_once.starts_with("enc:v1:") && !sealed_once.contains(material(&secret)));

    // Key rotation: the new key first, the old one still listed.
    let rotated = SecretKeys::parse(&format!("{second},{first}")).unwrap();
    assert_eq!(seal_at_rest(&pool, &rotated).await.unwrap().secrets, 1);
    let sealed_twice = stored_secrets_of(&pool).await;
    assert_ne!(sealed_twice, sealed_once);

    // Only the old key, or none: the process must refuse, naming the setting.
    for keys in [one, SecretKeys::default()] {
        let err = seal_at_rest(&pool, &keys).await.expect_err("refused");
        let text = courier::error::error_chain(&err);
        assert!(text.contains("COURIER_ENCRYPTION_KEY"), "{text}");
    }

    // The new key alone now opens it, and webhooks verify with the secret the caller holds.
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.encryption_key = Some(SecretKeys::parse(&second).unwrap());
    })
    .await;
    let delivery = delivery_id(&submit(&app, &admin, &id, json!({}), None).await);
    wait_for_state(
        &app,
        &admin,
        &delivery,
        "DELIVERED",
        Duration::from_secs(10),
    )
    .await;
    assert!(receiver.received()[0].verifies_with(&secret));
}

async fn stored_secrets_of(pool: &courier::db::Db) -> String {
    rows(pool, "SELECT signing_secret FROM endpoints", vec![]).await[0]
        .try_get("", "signing_secret")
        .unwrap()
}

/// A process that does not know the key an endpoint's secret is sealed under (a rolling key
/// rotation that skipped its first step) hands its claims back with no attempt recorded,
/// leaves the endpoint to other processes, and one that holds the key delivers them.
async fn a_process_without_the_key_hands_its_claims_back(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (old, new) = (new_encryption_key(), new_encryption_key());
    // Its claiming loop makes rounds only when woken (each submission below wakes it), so
    // none meets the claim at submit, which a round holding the free slots would turn away.
    let stale = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.poll_interval_ms = 600_000;
        config.encryption_key = Some(SecretKeys::parse(&old).unwrap());
    })
    .await;
    let both = SecretKeys::parse(&format!("{new},{old}")).unwrap();
    let api = TestApp::spawn_with(&db, |config| config.encryption_key = Some(both.clone())).await;
    let admin = api.admin_token().await;
    let receiver = Receiver::accepting().await;
    let (endpoint, secret) = api.create_endpoint(&admin, &receiver.url("new-key")).await;
    let mut deliveries = Vec::new();
    // The first through the stale process itself: its claim at submit hands it back.
    loop_at_rest(&stale).await;
    let metrics = &stale.state.metrics;
    let submitted = submit(&stale, &admin, &endpoint, json!({ "n": 0 }), None).await;
    deliveries.push(delivery_id(&submitted));
    assert_eq!(
        metrics.claims_at_submit.get(),
        1,
        "claimed at submit (claims {}, failed at submit {}, rounds {})",
        metrics.claims.get(),
        metrics.claims_at_submit_failed.get(),
        metrics.claim_rounds.get()
    );
    assert_eq!(metrics.claims_unopened.get(), 1, "handed back at once");

    // Submissions through another process (which wake the stale one's loop on PostgreSQL)
    // and one through the stale process again (which wakes its loop on either backend,
    // with no claim at submit for an endpoint left alone): its loop looks, and passes the
    // endpoint by.
    let rounds = metrics.claim_rounds.get();
    for n in 1..3 {
        let submitted = submit(&api, &admin, &endpoint, json!({ "n": n }), None).await;
        deliveries.push(delivery_id(&submitted));
    }
    let submitted = submit(&stale, &admin, &endpoint, json!({ "n": 3 }), None).await;
    deliveries.push(delivery_id(&submitted));
    eventually(
        "the stale process looks",
        Duration::from_secs(10),
        || async { metrics.claim_rounds.get() > rounds },
    )
    .await;
    let pending = "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'pending'";
    let count = |sql: &'static str| {
        let pool = api.state.db.clone();
        async move {
            let found = rows(&pool, sql, vec![]).await;
            found[0].try_get::<i64>("", "n").unwrap()
        }
    };
    eventually(
        "its claim is handed back",
        Duration::from_secs(10),
        || async { count(pending).await == 4 },
    )
    .await;
    loop_at_rest(&stale).await;
    assert_eq!(
        metrics.claims_at_submit.get(),
        1,
        "none at submit while left alone"
    );
    assert_eq!(
        metrics.claims_unopened.get(),
        1,
        "it leaves the endpoint alone rather than claiming again"
    );
    let attempts = "SELECT COUNT(*) AS n FROM delivery_attempts";
    assert_eq!(count(attempts).await, 0, "no attempt recorded");
    assert!(
        receiver.received().is_empty(),
        "nothing signed with anything else"
    );

    let _holder = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.encryption_key = Some(both);
    })
    .await;
    for delivery in &deliveries {
        wait_for_state(&api, &admin, delivery, "DELIVERED", Duration::from_secs(10)).await;
    }
    let received = receiver.wait_for(4, Duration::from_secs(5)).await;
    assert!(received
        .iter()
        .all(|webhook| webhook.verifies_with(&secret)));
    assert_eq!(count(attempts).await, 4, "one attempt each");
}

on_both_backends!(
    no_secret_is_stored_in_clear_and_webhooks_still_verify,
    start_up_seals_plaintext_and_moves_secrets_to_the_first_key,
    a_process_without_the_key_hands_its_claims_back,
);

/// Sealing leaves no earlier, plaintext form of a secret in the SQLite file or its
/// write-ahead log: a row rewritten in place leaves its old bytes in the page's free space
/// (and the log keeps old pages) until the file is rebuilt.
#[tokio::test]
async fn sealing_leaves_no_plaintext_in_the_sqlite_files() {
    let db = TestDb::new(Backend::Sqlite).await;
    let plain_app = TestApp::spawn(&db).await;
    let admin = plain_app.admin_token().await;
    let mut secrets = Vec::new();
    for n in 0..20 {
        let url = format!("https://example.com/hook/{n}");
        secrets.push(plain_app.create_endpoint(&admin, &url).await.1);
    }
    plain_app.stop().await;
    let path = db.sqlite_path().expect("an SQLite file").to_owned();
    // How many of the secrets can be read in the database's files, as bytes.
    let readable = |secrets: &[String]| {
        let mut bytes = std::fs::read(&path).expect("the database file");
        bytes.extend(std::fs::read(path.with_extension("db-wal")).unwrap_or_default());
        let text = String::from_utf8_lossy(&bytes);
        secrets
            .iter()
            .filter(|secret| text.contains(material(secret)))
            .count()
    };
    assert_eq!(readable(&secrets), secrets.len(), "in clear, at first");

    let pool = db.connect(2).await;
    let keys = SecretKeys::parse(&new_encryption_key()).unwrap();
    assert_eq!(seal_at_rest(&pool, &keys).await.unwrap().secrets, 20);
    // Read while the pool is open: closing its last connection would empty the log anyway.
    assert_eq!(readable(&secrets), 0, "a secret can still be read in clear");
    pool.close().await.unwrap();
}

/// `courier serve` with a key that cannot open the stored secrets exits at once with an
/// error naming `COURIER_ENCRYPTION_KEY`; with the right key it starts and seals nothing twice.
#[tokio::test]
async fn serve_refuses_to_start_when_a_stored_secret_cannot_be_decrypted() {
    let db = TestDb::new(Backend::Sqlite).await;
    let key = new_encryption_key();
    let app = TestApp::spawn_with(&db, |config| {
        config.encryption_key = Some(SecretKeys::parse(&key).unwrap());
    })
    .await;
    let admin = app.admin_token().await;
    app.create_endpoint(&admin, "http://127.0.0.1:9/hook").await;
    app.stop().await;

    for wrong in [Some(new_encryption_key()), None] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_courier"));
        command
            .arg("serve")
            .env("DATABASE_URL", &db.url)
            .env("COURIER_BIND", "127.0.0.1:0")
            .env("COURIER_WORKER_CONCURRENCY", "0")
            .env_remove("COURIER_ENCRYPTION_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(wrong) = &wrong {
            command.env("COURIER_ENCRYPTION_KEY", wrong);
        }
        let mut child = command.spawn().expect("spawn courier serve");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("courier serve started with an undecryptable secret");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(!status.success());
        assert!(
            stderr.contains("COURIER_ENCRYPTION_KEY"),
            "{wrong:?}: {stderr}"
        );
    }
}

/// Processes starting at once take turns at sealing: one with a different key that starts
/// while another seals waits for it, then reads what it sealed and refuses, rather than
/// each sealing the secrets it read first (which left half the table under each key, and
/// both processes running).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_starting_at_once_take_turns_at_sealing() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (id, secret) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    app.stop().await;
    let (theirs, ours) = (
        SecretKeys::parse(&new_encryption_key()).unwrap(),
        SecretKeys::parse(&new_encryption_key()).unwrap(),
    );

    // Another process is sealing: it holds the lock, and seals under its own key.
    let other = db.connect(2).await;
    let sealing = other
        .session_lock(SEALING_LOCK_KEY)
        .await
        .expect("the lock")
        .expect("PostgreSQL");
    let starting = tokio::spawn({
        let pool = db.connect(2).await;
        async move { seal_at_rest(&pool, &ours).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!starting.is_finished(), "the second process waits its turn");
    let id = uuid::Uuid::parse_str(&id).unwrap();
    let sealed = theirs.seal(id, &secret).unwrap();
    rows(
        &other,
        &format!("UPDATE endpoints SET signing_secret = '{sealed}' WHERE id = '{id}'"),
        vec![],
    )
    .await;
    drop(sealing);

    let refused = tokio::time::timeout(Duration::from_secs(10), starting)
        .await
        .expect("its turn comes")
        .expect("the task ran")
        .expect_err("it cannot open what the other sealed");
    let text = courier::error::error_chain(&refused);
    assert!(text.contains("COURIER_ENCRYPTION_KEY"), "{text}");
    assert_eq!(
        stored_secrets_of(&other).await,
        sealed,
        "nothing was sealed twice"
    );
}
