//! Rotating an endpoint's signing secret: a new one minted and returned once, the replaced
//! one signing beside it for a grace period. A replaced secret that cannot be opened (its
//! key lost, or its value damaged) cannot sign on: a rotation with a grace is refused,
//! saying so, and one with no grace replaces it at once. That is how an endpoint whose
//! secret was lost is recovered, from the API or, when no process starts (each refuses a
//! stored secret it cannot open), `courier endpoint rotate-secret --grace-seconds 0`.

use entity::endpoint;
use sea_orm::{ConnectionTrait as _, EntityTrait as _, QuerySelect as _};
use uuid::Uuid;

use crate::crypto::sealing::{SecretError, SecretKeys};
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

/// The refusal of a rotation whose replaced secret `err` kept from opening, with `advice`.
fn unopened(err: SecretError, advice: &str) -> Error {
    Error::bad_input(format!(
        "the endpoint's current signing secret cannot be opened: {err}{advice}"
    ))
}

/// Gives endpoint `id` a new signing secret, sealed with `keys`, returned once. For
/// `grace_secs` (default a day; 0 for none) the replaced secret keeps signing beside the new
/// one, so receivers can switch at their pace; its expiry is stored, so every process stops
/// using it at the same moment. A rotation during a grace period replaces the older secret.
/// A replaced secret that `keys` cannot open is refused with a grace, dropped without one
/// (see the module docs); with no key at all, a sealed one is refused either way. With no
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
                return Ok(Ok(None));
            };
            // A replaced secret that does not open is dropped only when asked for no grace
            // (its key lost, or its value damaged: the caller knows); with a grace it would
            // sign on, so the rotation is refused, saying so. With no key at all, a sealed
            // secret means the key was left out of this command: refused whatever the grace,
            // so as not to store the new secret in clear beside sealed ones.
            let kept = match keys.open(id, &current.signing_secret) {
                Ok(_) if grace_secs > 0 => Some(current.signing_secret),
                Ok(_) => None,
                Err(err @ SecretError::NoKey) => return Ok(Err(unopened(err, ""))),
                Err(err) if grace_secs > 0 => {
                    return Ok(Err(unopened(
                        err,
                        "; if its key is lost or the value damaged, rotate with a grace of 0 \
                         to replace it at once",
                    )))
                }
                Err(err) => {
                    tracing::warn!(endpoint_id = %id, error = %err,
                        "the replaced signing secret could not be opened; it is dropped");
                    None
                }
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
            endpoint::Entity::find_by_id(id).one(&*txn).await.map(Ok)
        })
        .await??
        .ok_or(Error::NotFound("endpoint"))?;
    tracing::info!(endpoint_id = %id, grace_secs, "endpoint signing secret rotated");
    Ok(EndpointWithSecret {
        endpoint,
        secret: Some(minted),
    })
}
