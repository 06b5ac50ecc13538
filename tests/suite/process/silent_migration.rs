//! `courier migrate` on a database that goes silent while it runs gives up, saying so,
//! instead of waiting for ever (no keepalive notices a connection gone silent).

use std::process::Stdio;
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait as _, DbBackend, Statement, TransactionTrait as _};

use crate::support::fixtures::until_one_waits_on_a_lock;
use crate::support::gatekeeper::Gatekeeper;
use crate::support::process::courier_command;
use crate::support::{Backend, PartitionProxy, TestDb};

/// A transaction on `holder` holding the migration lock: a migration waits for its turn.
async fn hold_the_migration_lock(holder: &courier::db::Db) -> sea_orm::DatabaseTransaction {
    let hold = holder.conn().begin().await.expect("begin");
    hold.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT pg_advisory_xact_lock($1)",
        [courier::db::MIGRATION_LOCK_KEY.into()],
    ))
    .await
    .expect("the migration lock");
    hold
}

/// `courier migrate` on `url`, with a 500 ms acquire timeout, its stderr kept.
fn spawn_migrate(url: &str) -> std::process::Child {
    courier_command(url)
        .arg("migrate")
        .env("COURIER_DB_ACQUIRE_TIMEOUT_MS", "500")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn courier migrate")
}

/// A migration waiting its turn (another holds the migration lock) when its network goes
/// silent: with a 500 ms acquire timeout it gives up 5 s after the database was last
/// found out of reach, exits 1 and names what happened. Before, it waited as long as the
/// test did, printing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_whose_database_goes_silent_gives_up_saying_so() {
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    let holder = db.connect(2).await;
    let hold = hold_the_migration_lock(&holder).await;

    let mut child = spawn_migrate(&proxy.url_for(&db.url));
    until_one_waits_on_a_lock(&holder, "the migration waits for its turn").await;
    proxy.partition();
    let cut = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if cut.elapsed() > Duration::from_secs(40) {
            let _ = child.kill();
            panic!("courier migrate was still waiting 40 s after its database went silent");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    hold.rollback().await.expect("released");
    let output = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the database stopped answering while migrations ran"),
        "{stderr}"
    );
    assert!(
        cut.elapsed() >= Duration::from_secs(5),
        "it gave the database its time: {:?}",
        cut.elapsed()
    );
}

/// A database that answers new connections with an error (out of connection slots, say)
/// while a migration waits its turn is not out of reach: the migration's own connection is
/// fine, and it waits on and completes once its turn comes. Before, its watch counted the
/// refusals as silence and ended it after ten acquire timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_outlasts_a_database_refusing_new_connections() {
    let db = TestDb::new(Backend::Postgres).await;
    let gatekeeper = Gatekeeper::of(&db).await;
    let holder = db.connect(2).await;
    let hold = hold_the_migration_lock(&holder).await;

    let mut child = spawn_migrate(&db.url);
    until_one_waits_on_a_lock(&holder, "the migration waits for its turn").await;
    // Its watch's own connection is idle, so it goes, and every new one is refused.
    gatekeeper.refuse_new().await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let still_running = child.try_wait().expect("wait").is_none();
    gatekeeper.allow().await;
    hold.rollback().await.expect("released");
    if !still_running {
        let output = child.wait_with_output().expect("output");
        panic!(
            "the migration gave up while the database answered: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the migration did not finish once its turn came"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let output = child.wait_with_output().expect("output");
    assert!(
        status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
