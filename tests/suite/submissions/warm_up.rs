//! Start-up prepares the statements of submitting and claiming on every connection, and a
//! failure there is only logged (start-up goes on without it): each form must prepare.

use sea_orm::TransactionTrait;

use crate::support::fixtures::count;
use crate::support::{Backend, TestDb};

/// Every form of the store statement (the group's, the one whose claim is staged, the one
/// that claims) and the claim's statements prepare on PostgreSQL, writing nothing.
#[tokio::test]
async fn every_form_of_the_store_and_claim_statements_prepares() {
    let db = TestDb::new(Backend::Postgres).await;
    let pool = db.connect(1).await;
    let txn = pool.conn().begin().await.expect("begin");
    courier::service::submissions::store::warm_statements(&txn, &pool)
        .await
        .expect("the store statements prepare");
    courier::worker::claim::warm_statements(&txn, &pool)
        .await
        .expect("the claim statements prepare");
    txn.commit().await.expect("commit");
    let written = count(
        &pool,
        "SELECT (SELECT COUNT(*) FROM submissions) + (SELECT COUNT(*) FROM webhook_deliveries) AS n",
        vec![],
    )
    .await;
    assert_eq!(written, 0, "warming wrote nothing");
}
