//! Migrations beside live traffic and beside other applications' tables: a table change
//! waiting for a lock never holds up the traffic queued behind it for long, and a database
//! that already holds a table of Courier's name is told as another application's.

use std::process::Stdio;
use std::time::Duration;

use migration::MigratorTrait as _;
use sea_orm::{ConnectionTrait as _, TransactionTrait as _};

use crate::support::fixtures::count;
use crate::support::process::courier_command;
use crate::support::{Backend, TestDb};

/// Whether `webhook_deliveries` has the column the last migration adds.
async fn has_resume_at(db: &courier::db::Db) -> bool {
    count(
        db,
        "SELECT count(*) AS n FROM information_schema.columns \
         WHERE table_name = 'webhook_deliveries' AND column_name = 'resume_at'",
        vec![],
    )
    .await
        == 1
}

/// A migration that changes `webhook_deliveries` while another session's long transaction
/// uses the table (a report, a backup): its lock request would queue every later statement
/// on the table behind it for as long as that transaction runs. Each try now gives up its
/// wait after a second and rolls back, so reads of the table go on meanwhile; the
/// migration completes once the long transaction ends. Before, every read below waited
/// behind it until the test gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_waiting_for_a_table_does_not_hold_up_its_traffic() {
    let db = TestDb::new(Backend::Postgres).await;
    let migrator = db.connect(2).await;
    migration::Migrator::down(migrator.conn(), Some(1))
        .await
        .expect("undo the last migration");
    let traffic = db.connect(1).await;
    assert!(!has_resume_at(&traffic).await, "the column went with it");

    let holder = db.connect(1).await;
    let long_transaction = holder.conn().begin().await.expect("begin");
    // Courier's connections end a transaction left idle; this one is a report's, kept open.
    long_transaction
        .execute_unprepared("SET LOCAL idle_in_transaction_session_timeout = 0")
        .await
        .expect("kept open");
    long_transaction
        .execute_unprepared("SELECT count(*) FROM webhook_deliveries")
        .await
        .expect("the table in use");

    let migrating = tokio::spawn(async move { migrator.migrate().await });
    // Reads of the table for about four seconds, four tries of the migration: each is
    // answered while the long transaction still runs.
    for read in 0..20 {
        tokio::time::timeout(
            Duration::from_secs(10),
            count(
                &traffic,
                "SELECT count(*) AS n FROM webhook_deliveries",
                vec![],
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("read {read} waited behind the migration's lock request"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if migrating.is_finished() {
        let ended = migrating.await.expect("the migration task");
        panic!("the migration ended while the table was in use: {ended:?}");
    }

    long_transaction.rollback().await.expect("ended");
    tokio::time::timeout(Duration::from_secs(20), migrating)
        .await
        .expect("the migration finished once the table was free")
        .expect("the migration task")
        .expect("the migration");
    assert!(has_resume_at(&traffic).await, "the migration was applied");
}

/// `courier migrate` on a database where another application keeps a table named
/// `endpoints` exits 1 saying so, where it used to say only "relation "endpoints" already
/// exists" (or SQLite's "table endpoints already exists").
async fn another_applications_table_is_told_as_such(backend: Backend) {
    let db = TestDb::new_unmigrated(backend).await;
    let other = db.connect(1).await;
    other
        .conn()
        .execute_unprepared("CREATE TABLE endpoints (id INTEGER PRIMARY KEY, label TEXT)")
        .await
        .expect("another application's table");
    other.close().await.expect("closed");

    let output = courier_command(&db.url)
        .arg("migrate")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run courier migrate");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("it looks like another application's database"),
        "{stderr}"
    );
    assert!(stderr.contains("endpoints"), "names the table: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_applications_table_is_told_as_such_sqlite() {
    another_applications_table_is_told_as_such(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_applications_table_is_told_as_such_postgres() {
    another_applications_table_is_told_as_such(Backend::Postgres).await;
}
