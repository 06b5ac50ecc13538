//! `courier migrate` on a database that goes silent while it runs gives up, saying so,
//! instead of waiting for ever (no keepalive notices a connection gone silent).

use std::process::Stdio;
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait as _, DbBackend, Statement, TransactionTrait as _};

use crate::support::fixtures::until_one_waits_on_a_lock;
use crate::support::process::courier_command;
use crate::support::{Backend, PartitionProxy, TestDb};

/// A migration waiting its turn (another holds the migration lock) when its network goes
/// silent: with a 500 ms acquire timeout it gives up 5 s after the database was last
/// found out of reach, exits 1 and names what happened. Before, it waited as long as the
/// test did, printing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_whose_database_goes_silent_gives_up_saying_so() {
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    let holder = db.connect(2).await;
    let hold = holder.conn().begin().await.expect("begin");
    hold.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT pg_advisory_xact_lock($1)",
        [courier::db::MIGRATION_LOCK_KEY.into()],
    ))
    .await
    .expect("the migration lock");

    let mut migrate = courier_command(&proxy.url_for(&db.url));
    let mut child = migrate
        .arg("migrate")
        .env("COURIER_DB_ACQUIRE_TIMEOUT_MS", "500")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn courier migrate");
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
