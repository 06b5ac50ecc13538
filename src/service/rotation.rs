//! Rotating an endpoint's signing secret: a new one minted and returned once, the replaced
//! one signing beside it for a grace period, unless it cannot be opened (its key lost, or
//! its value damaged), when it goes at once: a secret no process can sign with is worth
//! nothing to keep, and one kept would stop every process from starting (each refuses a
//! stored secret it cannot open). So a rotation is how an endpoint whose secret was lost
//! is recovered, from the API or, when no process starts, `courier endpoint rotate-secret`.

use entity::endpoint;
use sea_orm::{ConnectionTrait as _, EntityTrait as _, QuerySelect as _};
use uuid::Uuid;

use crate::crypto::sealing::SecretKeys;
use crate::crypto::signing;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::service::endpoints::EndpointWithSecret;

/// A rotation: the new sealed secret, the replaced one while its grace lasts (`$3`, NULL for
/// none) and when that ends (`$4`, after the database's now).
const ROTATE: &str = "UPDATE endpoints \
     SET signing_secret = $2, previous_signing_secret = $3, \
         previous_secret_expires_at = {after($4)}, updated_at = {now} \
     WHERE id = $1";

/// Grace period of a rotation when none is given: a day, as receivers expect.
pub const DEFAULT_ROTATION_GRACE_SECS: i64 = 86_400;

/// Longest grace period a rotation accepts: 30 days.
pub const MAX_ROTATION_GRACE_SECS: i64 = 30 * 86_400;

/// Gives endpoint `id` a new signing secret, sealed with `keys`, returned once. For
/// `grace_secs` (default a day; 0 for none) the replaced secret keeps signing beside the new
/// one, so receivers can switch at their pace; its expiry is stored, so every process stops
/// using it at the same moment. A rotation during a grace period replaces the older secret.
/// A replaced secret that `keys` cannot open is not kept (see the module docs). With no
/// access check: callers check it.
pub async fn rotate(
    db: &Db,
    keys: &SecretKeys,
    id: Uuid,
    grace_secs: Option<i64>,
) -> Result<EndpointWithSecret> {
    let grace_secs = grace_secs.unwrap_or(DEFAULT_ROTATION_GRACE_SECS);
    if !(0..=MAX_ROTATION_GRACE_SECS).contains(&grace_secs) {
        return Err(Error::bad_input(format!(
            "graceSeconds must be 0 to {MAX_ROTATION_GRACE_SECS}"
        )));
    }
    let minted = signing::mint_secret();
    let sealed = keys.seal(id, &minted).map_err(Error::Secret)?;
    let sealed = &sealed;
    let endpoint = db
        .transaction(|txn| async move {
            // The row locked: the secret read is the one replaced.
            let Some(current) = endpoint::Entity::find_by_id(id)
                .lock_exclusive()
                .one(&*txn)
                .await?
            else {
                return Ok(None);
            };
            let kept = if grace_secs == 0 {
                None
            } else if let Err(err) = keys.open(id, &current.signing_secret) {
                tracing::warn!(endpoint_id = %id, error = %err,
                    "the replaced signing secret cannot be opened, so it does not sign beside \
                     the new one during the grace period");
                None
            } else {
                Some(current.signing_secret)
            };
            let clock = db.clock();
            // The replaced secret's expiry is the database's time plus the grace, so every
            // process agrees when it stops signing.
            let expires = match kept {
                Some(_) => clock.after(std::time::Duration::from_secs(grace_secs.unsigned_abs())),
                None => clock.after_opt(None),
            };
            txn.execute_raw(clock.statement(
                ROTATE,
                [id.into(), sealed.clone().into(), kept.into(), expires],
            ))
            .await?;
            endpoint::Entity::find_by_id(id).one(&*txn).await
        })
        .await?
        .ok_or(Error::NotFound("endpoint"))?;
    tracing::info!(endpoint_id = %id, grace_secs, "endpoint signing secret rotated");
    Ok(EndpointWithSecret {
        endpoint,
        secret: Some(minted),
    })
}
