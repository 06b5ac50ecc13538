//! Bringing every stored signing secret under the first key of `COURIER_ENCRYPTION_KEY`,
//! at start-up, before serving (the cipher itself is [`crate::crypto::sealing`]).

use entity::endpoint;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use uuid::Uuid;

use crate::crypto::sealing::SecretKeys;
use crate::db::Db;
use crate::error::{Error, Result};

/// Endpoints read per page while sealing at start-up.
const SEAL_PAGE: u64 = 500;

/// Names the advisory lock a process holds while it checks and seals the stored secrets.
/// An arbitrary constant, unlike the migrations' own.
pub const SEALING_LOCK_KEY: i64 = 0x0073_6561_6c69_6e67; // "sealing" in ASCII

/// What [`seal_at_rest`] changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Resealed {
    /// Secrets (current or previous) written again, under the first key.
    pub secrets: u64,
}

/// Run at start-up, before serving: checks that every stored secret opens with `keys` and
/// stores each one that is plaintext, or sealed under an older key, sealed under the first.
/// Any secret that cannot be opened is an error naming `COURIER_ENCRYPTION_KEY`: a process
/// that could not sign correctly must not start. Each write is conditional on the value
/// read, so a rotation at the same moment is never undone; processes starting at once take
/// their turns (a PostgreSQL advisory lock).
pub async fn seal_at_rest(db: &Db, keys: &SecretKeys) -> Result<Resealed> {
    // One process at a time: one starting beside another that seals under a different key
    // reads what the other sealed, and refuses, rather than each sealing half the table.
    let _sealing = db.session_lock(SEALING_LOCK_KEY).await?;
    let mut resealed = Resealed::default();
    let mut after: Option<Uuid> = None;
    loop {
        let mut query = endpoint::Entity::find()
            .select_only()
            .columns([
                endpoint::Column::Id,
                endpoint::Column::SigningSecret,
                endpoint::Column::PreviousSigningSecret,
            ])
            .order_by_asc(endpoint::Column::Id)
            .limit(SEAL_PAGE);
        if let Some(after) = after {
            query = query.filter(endpoint::Column::Id.gt(after));
        }
        let rows: Vec<(Uuid, String, Option<String>)> = query.into_tuple().all(db.conn()).await?;
        let Some(last) = rows.last() else {
            break;
        };
        after = Some(last.0);
        for (id, current, previous) in &rows {
            for (column, stored) in [
                (endpoint::Column::SigningSecret, Some(current)),
                (endpoint::Column::PreviousSigningSecret, previous.as_ref()),
            ] {
                let Some(stored) = stored else { continue };
                let plain = keys.open(*id, stored).map_err(|err| {
                    // Which row, for the operator: the error itself names the setting.
                    tracing::error!(endpoint_id = %id, column = ?column, error = %err,
                        "an endpoint's signing secret cannot be opened");
                    Error::Secret(err)
                })?;
                if !keys.needs_resealing(stored) {
                    continue;
                }
                let sealed = keys.seal(*id, &plain).map_err(Error::Secret)?;
                let written = endpoint::Entity::update_many()
                    .col_expr(column, Expr::value(sealed))
                    .filter(endpoint::Column::Id.eq(*id))
                    .filter(column.eq(stored.as_str()))
                    .exec(db.conn())
                    .await?;
                resealed.secrets += written.rows_affected;
            }
        }
    }
    if resealed.secrets > 0 {
        // What the secrets were before must not stay readable in the file (SQLite).
        if let Err(err) = db.scrub_freed_space().await {
            tracing::warn!(error = %err,
                "the signing secrets are sealed, but their earlier form may remain in the \
                 SQLite file's free space: with Courier stopped, run \
                 `sqlite3 <file> 'VACUUM; PRAGMA wal_checkpoint(TRUNCATE);'`");
        }
    }
    Ok(resealed)
}
