//! A process cut off by the network in the middle of a transaction never sends its
//! `COMMIT` or `ROLLBACK`: the server ends the session after twice the work deadline, so the
//! locks it held do not stop every other process until TCP gives up, hours later.

use std::time::{Duration, Instant};

use courier::db::Db;
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};

use crate::support::{Backend, PartitionProxy, TestDb};

/// Whether `db` can take the transaction-scoped advisory lock `key` now.
async fn takes(db: &Db, key: i64) -> bool {
    let txn = db.conn().begin().await.expect("begin");
    let row = txn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT pg_try_advisory_xact_lock($1) AS taken",
            [key.into()],
        ))
        .await
        .expect("tried")
        .expect("a row");
    let taken: bool = row.try_get("", "taken").expect("taken");
    txn.rollback().await.expect("rolled back");
    taken
}

/// A transaction holding a lock (an advisory one here; a claim's flow row in the probe that
/// found this) loses its network for good (its connection stays open, nothing moves): another
/// connection takes the lock within the server's idle-in-transaction timeout of 10 s (twice
/// the 5 s work deadline). Before, it stayed held for as long as the test waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_cut_off_mid_way_releases_its_locks() {
    const KEY: i64 = 0x6f72_7068;
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = PartitionProxy::start(&db.url).await;
    let cut_off = Db::connect(&proxy.url_for(&db.url), 1)
        .await
        .expect("connect through the proxy");
    let other = db.connect(1).await;

    let txn = cut_off.conn().begin().await.expect("begin");
    txn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT pg_advisory_xact_lock($1)",
        [KEY.into()],
    ))
    .await
    .expect("locked");
    assert!(!takes(&other, KEY).await, "held by the transaction");
    proxy.fail_over();
    let cut_at = Instant::now();
    loop {
        if takes(&other, KEY).await {
            break;
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(20),
            "the lock is still held {:?} after the network was cut",
            cut_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        cut_at.elapsed() >= Duration::from_secs(8),
        "the session lived out its idle time, not less: {:?}",
        cut_at.elapsed()
    );
    // The cut-off transaction is abandoned, as its process would.
    std::mem::forget(txn);
}
