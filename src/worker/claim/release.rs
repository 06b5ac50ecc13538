//! Giving claims back at once, fenced by their tokens, when they are not to be sent here
//! (what to send could not be read, a secret did not open, the endpoint asked to wait): the
//! deliveries are due again (or parked, if their endpoint was disabled meanwhile).

use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};
use uuid::Uuid;

use super::Claim;
use crate::bus::{ChangeBus, StateChange};
use crate::db::parking::{with_parking, SHARE_ENDPOINTS};
use crate::db::Db;
use crate::error::error_chain;
use crate::service::flow;

/// Gives a claim back at once (when its delivery cannot be sent), fenced by its token:
/// due now, or parked if its endpoint was disabled meanwhile.
const RELEASE: &str = "\
UPDATE webhook_deliveries
SET state = 'pending', claim_token = NULL, claim_expires_at = NULL, updated_at = {now},
    next_attempt_at = CASE WHEN {parked(webhook_deliveries.endpoint_id)} THEN NULL ELSE {now} END
WHERE id = $1 AND claim_token = $2
RETURNING updated_at";

/// Returns claims to `pending`, due now, so any worker may take them again without
/// waiting for their lease (parked instead if the endpoint was disabled meanwhile), and
/// wakes their endpoints. Claims that were meanwhile superseded are left alone.
pub async fn release(db: &Db, bus: &ChangeBus, claims: &[Claim]) -> Result<(), DbErr> {
    let staged = db
        .transaction(|txn| async move {
            if db.backend() == DbBackend::Postgres {
                let mut ids: Vec<Uuid> = claims.iter().map(|claim| claim.endpoint_id).collect();
                ids.sort();
                ids.dedup();
                txn.execute_raw(Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    SHARE_ENDPOINTS,
                    [ids.into()],
                ))
                .await?;
            }
            let sql = with_parking(db.backend(), RELEASE);
            let mut changes = Vec::new();
            let mut endpoints = Vec::new();
            for claim in claims {
                let released = txn
                    .query_one_raw(
                        db.clock()
                            .statement(&sql, [claim.delivery_id.into(), claim.claim_token.into()]),
                    )
                    .await?;
                if let Some(row) = released {
                    endpoints.push(claim.endpoint_id);
                    changes.push(StateChange {
                        delivery_id: claim.delivery_id,
                        endpoint_id: claim.endpoint_id,
                        previous_state: Some(DeliveryState::Processing),
                        state: DeliveryState::Pending,
                        at: row.try_get("", "updated_at")?,
                    });
                }
            }
            flow::wake_endpoints(&*txn, db.backend(), &endpoints).await?;
            bus.stage(&*txn, changes).await
        })
        .await?;
    staged.committed();
    Ok(())
}

/// [`release`] in a task of its own, within the database's deadline; `why` says in the log
/// why they were handed back, should that fail (they stay `processing` and are retaken
/// after their lease, as lost requests are).
pub fn release_in_background(db: Db, bus: ChangeBus, claims: Vec<Claim>, why: &'static str) {
    tokio::spawn(async move {
        if let Err(err) = db.within_deadline(release(&db, &bus, &claims)).await {
            tracing::warn!(error = %error_chain(&err), claims = claims.len(), why,
                "handing claims back failed; they are retaken after their lease");
        }
    });
}
