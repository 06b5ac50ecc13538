//! Bringing every stored signing secret under the first key of `COURIER_ENCRYPTION_KEY`,
//! at start-up, before serving (the cipher itself is [`crate::crypto::sealing`]).

use entity::endpoint;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use uuid::Uuid;

use crate::crypto::sealing::{SecretError, SecretKeys};
use crate::db::Db;
use crate::error::Error;

/// Endpoints read per page while sealing at start-up.
const SEAL_PAGE: u64 = 500;

/// Names the advisory lock a process holds while it checks and seals the stored secrets.
/// An arbitrary constant, unlike the migrations' own.
pub const SEALING_LOCK_KEY: i64 = 0x0073_6561_6c69_6e67; // "sealing" in ASCII

/// Why the stored secrets could not be brought under the keys.
#[derive(Debug, thiserror::Error)]
pub enum SealingError {
    /// A stored secret no key opens: the process must not start (it would not sign that
    /// endpoint's webhooks correctly). Says what to change.
    #[error("endpoint {endpoint_id}'s {which} signing secret cannot be used: {reason}; {}{}",
        remedy(*.endpoint_id, .reason), more(*.others))]
    Unopened {
        /// The first endpoint whose secret does not open.
        endpoint_id: Uuid,
        /// `current` or `previous` (the one still signing during a rotation's grace).
        which: &'static str,
        /// Why it does not open.
        reason: SecretError,
        /// How many other secrets do not open either (each logged).
        others: usize,
    },
    /// Reading or writing the secrets failed.
    #[error(transparent)]
    Service(#[from] Error),
}

/// What to change when endpoint `id`'s secret does not open for `reason`.
fn remedy(id: Uuid, reason: &SecretError) -> String {
    let rotate = format!(
        "give the endpoint a new secret with `courier endpoint rotate-secret {id} \
         --grace-seconds 0` (its receiver then needs the new one)"
    );
    match reason {
        SecretError::NoKey => format!(
            "set COURIER_ENCRYPTION_KEY to the key it was sealed with, or, if that key is lost, \
             {rotate}"
        ),
        SecretError::Undecryptable(_) => format!(
            "add the key that sealed it to COURIER_ENCRYPTION_KEY, or, if that key is lost, \
             {rotate}"
        ),
        _ => rotate,
    }
}

/// The others' count, told after the first's remedy.
fn more(others: usize) -> String {
    match others {
        0 => String::new(),
        1 => " (one more secret does not open either: see the log)".to_owned(),
        n => format!(" ({n} more secrets do not open either: see the log)"),
    }
}

/// What [`seal_at_rest`] changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Resealed {
    /// Secrets (current or previous) written again, under the first key.
    pub secrets: u64,
}

/// Run at start-up, before serving: checks that every stored secret opens with `keys` and
/// stores each one that is plaintext, or sealed under an older key, sealed under the first.
/// Any secret that cannot be opened is an error naming its endpoint and what to change
/// (`COURIER_ENCRYPTION_KEY`, or the endpoint's secret): a process that could not sign
/// correctly must not start. Each write is conditional on the value
/// read, so a rotation at the same moment is never undone; processes starting at once take
/// their turns (a PostgreSQL advisory lock).
pub async fn seal_at_rest(db: &Db, keys: &SecretKeys) -> Result<Resealed, SealingError> {
    // One process at a time: one starting beside another that seals under a different key
    // reads what the other sealed, and refuses, rather than each sealing half the table.
    let _sealing = db
        .session_lock(SEALING_LOCK_KEY)
        .await
        .map_err(Error::from)?;
    // Every secret checked before any is written: a process that must not start (its
    // keys not the fleet's) changes nothing on its way out.
    pass(db, keys, false).await?;
    let resealed = pass(db, keys, true).await?;
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

/// One pass over every stored secret: each must open with `keys` (else the error names the
/// first that does not, and counts the rest); with `reseal`, each plaintext or under an
/// older key is written again under the first key.
async fn pass(db: &Db, keys: &SecretKeys, reseal: bool) -> Result<Resealed, SealingError> {
    let mut resealed = Resealed::default();
    // The first secret that does not open, and how many others do not.
    let mut unopened: Option<(Uuid, &'static str, SecretError)> = None;
    let mut others = 0;
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
        let rows: Vec<(Uuid, String, Option<String>)> = query
            .into_tuple()
            .all(db.conn())
            .await
            .map_err(Error::from)?;
        let Some(last) = rows.last() else {
            break;
        };
        after = Some(last.0);
        for (id, current, previous) in &rows {
            for (column, which, stored) in [
                (endpoint::Column::SigningSecret, "current", Some(current)),
                (
                    endpoint::Column::PreviousSigningSecret,
                    "previous",
                    previous.as_ref(),
                ),
            ] {
                let Some(stored) = stored else { continue };
                let plain = match keys.open(*id, stored) {
                    Ok(plain) => plain,
                    Err(reason) => {
                        // Each one, for the operator; the first is the error.
                        tracing::error!(endpoint_id = %id, secret = which, error = %reason,
                            "an endpoint's signing secret cannot be opened");
                        match unopened {
                            None => unopened = Some((*id, which, reason)),
                            Some(_) => others += 1,
                        }
                        continue;
                    }
                };
                if !reseal || !keys.needs_resealing(stored) {
                    continue;
                }
                let sealed = keys.seal(*id, &plain).map_err(Error::Secret)?;
                let written = endpoint::Entity::update_many()
                    .col_expr(column, Expr::value(sealed))
                    .filter(endpoint::Column::Id.eq(*id))
                    .filter(column.eq(stored.as_str()))
                    .exec(db.conn())
                    .await
                    .map_err(Error::from)?;
                resealed.secrets += written.rows_affected;
            }
        }
    }
    if let Some((endpoint_id, which, reason)) = unopened {
        return Err(SealingError::Unopened {
            endpoint_id,
            which,
            reason,
            others,
        });
    }
    Ok(resealed)
}
