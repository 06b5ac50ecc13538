//! A claim that is a transaction of its own commits without waiting for its WAL flush; a
//! claim that shares a submission's transaction leaves the commit as the server is set, so
//! the submission is as durable as ever (PostgreSQL).

use courier::db::Db;
use courier::worker::claim::DEFAULT_MAX_IN_FLIGHT;
use courier::worker::turns::{lock_turns, Commit, Turns};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, Statement, TransactionTrait};
use uuid::Uuid;

use crate::support::{Backend, TestDb};

/// An endpoint whose turn has come, written directly (nothing else claims in this test).
async fn ready_endpoint(db: &Db) -> Uuid {
    let id = Uuid::now_v7();
    for sql in [
        "INSERT INTO endpoints (id, name, url, signing_secret, created_at, updated_at) \
         VALUES ($1, 'relaxed', 'https://example.com/hook', 'sealed', now(), now())",
        "INSERT INTO endpoint_flow (endpoint_id, turn_at) VALUES ($1, now() - interval '1 second')",
    ] {
        db.conn()
            .execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                sql,
                [id.into()],
            ))
            .await
            .expect("write the endpoint");
    }
    id
}

/// `synchronous_commit` as the transaction sees it.
async fn synchronous_commit(txn: &DatabaseTransaction) -> String {
    let row = txn
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SHOW synchronous_commit",
        ))
        .await
        .expect("show the setting")
        .expect("a row");
    row.try_get_by_index(0).expect("the setting")
}

/// The turn lock of a claim of its own turns the flush wait off for its transaction only;
/// the same lock in a transaction that must be durable leaves it on, and so does the next
/// transaction on the same connection.
#[tokio::test]
async fn only_a_claim_of_its_own_commits_without_waiting_for_the_disk() {
    let test_db = TestDb::new(Backend::Postgres).await;
    let db = test_db.connect(1).await;
    let endpoint = ready_endpoint(&db).await;

    for (commit, expected) in [(Commit::AsConfigured, "on"), (Commit::Relaxed, "off")] {
        let txn = db.conn().begin().await.expect("begin");
        let (standings, _) = lock_turns(
            &txn,
            &db,
            1,
            Turns::Of(endpoint),
            DEFAULT_MAX_IN_FLIGHT,
            commit,
        )
        .await
        .expect("lock the turn");
        assert_eq!(standings.len(), 1, "the turn was taken");
        assert_eq!(synchronous_commit(&txn).await, expected, "{commit:?}");
        txn.commit().await.expect("commit");
    }

    // The pool has one connection: the relaxed claim's setting ended with its transaction.
    let txn = db.conn().begin().await.expect("begin");
    assert_eq!(synchronous_commit(&txn).await, "on");
    txn.rollback().await.expect("rollback");
}
