//! Previous signing secrets forgotten once their grace period is over: nothing signs with
//! them any more, so none is kept for good (in clear, without `COURIER_ENCRYPTION_KEY`).

use sea_orm::{ConnectionTrait as _, DbErr};

use crate::db::Db;

/// Clears every previous secret whose grace period has ended, by the deciding clock (the
/// one signing stops by). One conditional statement: a rotation at the same moment, which
/// sets a new previous secret with an expiry ahead, is never undone.
const FORGET: &str = "UPDATE endpoints SET previous_signing_secret = NULL, \
                      previous_secret_expires_at = NULL \
                      WHERE previous_secret_expires_at <= {now}";

/// Forgets the previous secrets whose grace period is over; how many.
pub async fn forget(db: &Db) -> Result<u64, DbErr> {
    let statement = db.clock().statement(FORGET, []);
    Ok(db.conn().execute_raw(statement).await?.rows_affected())
}
