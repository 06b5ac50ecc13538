//! Planning the claims' statements on a connection before the first claim needs them
//! (PostgreSQL): each is run once, asking for nothing, so nothing is locked or written.

use sea_orm::{DatabaseTransaction, DbErr};
use uuid::Uuid;

use super::{postgres, DEFAULT_MAX_IN_FLIGHT};
use crate::db::Db;
use crate::worker::turns::{self, Commit, Turns};

/// Prepares and plans, on `txn`'s connection, the statements of a claim at submit
/// (PostgreSQL), each asked for nothing: nothing is locked or written.
pub async fn warm_statements(txn: &DatabaseTransaction, db: &Db) -> Result<(), DbErr> {
    turns::lock_turns(
        txn,
        db,
        1,
        Turns::Of(Uuid::nil()),
        DEFAULT_MAX_IN_FLIGHT,
        Commit::AsConfigured,
    )
    .await?;
    postgres::warm(txn, db).await?;
    turns::warm_set_turns(txn).await
}

/// Prepares and plans, on `txn`'s connection, the statements of the claiming loop's claims
/// (PostgreSQL), each asked for nothing: nothing is locked or written.
pub async fn warm_claiming_loop(txn: &DatabaseTransaction, db: &Db) -> Result<(), DbErr> {
    // With and without full endpoints to look at again: two statements.
    for revisit in [&[][..], &[Uuid::nil()][..]] {
        turns::lock_turns(
            txn,
            db,
            1,
            Turns::Ready {
                revisit,
                except: &[],
                among: None,
            },
            DEFAULT_MAX_IN_FLIGHT,
            Commit::Relaxed,
        )
        .await?;
    }
    postgres::warm(txn, db).await?;
    turns::warm_set_turns(txn).await
}
