//! Storing a submission and claiming its delivery at once (a claim at submit, see
//! [`crate::worker::handoff`]): the request leaves after the submission's own commit. On
//! PostgreSQL a submission without an ordering key is claimed by the statement that stores
//! it (see [`super::claim_in_store`]); one with a key, and every one on SQLite, in the
//! transaction that stores it.

use sea_orm::{ConnectionTrait, DbBackend, DbErr};

use super::claim_in_store::{store_and_claim, ClaimInStore};
use super::store::{
    outcome, prepare, reported_by_row, store_prepared, store_sqlite, store_statement, NewRows,
    Notify, Prepared, Reported, Stored,
};
use crate::bus::{ChangeBus, Staged, StateChange};
use crate::db::Db;
use crate::db::{classify, Failure};
use crate::error::error_chain;
use crate::worker::claim::{claim, release, targets_of, ClaimRequest, Claimed};
use crate::worker::handoff::{claim_at_submit, FailedClaim, Reservation};
use crate::worker::targets::Targets;

/// Stores one submission, as [`super::store::store`] does, and claims its endpoint's due
/// work for the local worker's `reservation` as it stores it (the new delivery, unless it
/// waits in its line or older work is due first; see [`crate::worker::handoff`]); once
/// committed, hands the claim over, so the request leaves without another commit. A claim
/// that finds no room leaves the submission to an ordinary claim; one that fails fails the
/// write, and the submission is stored again, with the same ids, without a claim.
pub async fn store_claiming(
    db: &Db,
    bus: &ChangeBus,
    rows: NewRows,
    reservation: Reservation,
) -> Result<Stored, DbErr> {
    let prepared = prepare(rows);
    let request = reservation.request(prepared.submission.endpoint_id);
    if db.backend() == DbBackend::Postgres && prepared.submission.ordering_key.is_none() {
        return store_claiming_in_statement(db, bus, prepared, request, reservation).await;
    }
    let failed = FailedClaim::default();
    let (stored, claimed) = match db.backend() {
        DbBackend::Postgres => {
            match store_and_claim_postgres(db, bus, &prepared, &request, &failed).await {
                Ok((reported, claimed)) => {
                    let mut stored = outcome(prepared, reported);
                    if let (Stored::Created(_, delivery, at_submit), Some((claimed, _))) =
                        (&mut stored, &claimed)
                    {
                        *at_submit = claimed.claims.iter().any(|c| c.delivery_id == delivery.id);
                    }
                    (stored, claimed)
                }
                Err(err) => (
                    without_claim(db, bus, prepared, &reservation, &failed, err).await?,
                    None,
                ),
            }
        }
        _ => match store_sqlite(db, bus, &prepared, Some((&request, &failed))).await {
            Ok(done) => done,
            Err(err) => (
                without_claim(db, bus, prepared, &reservation, &failed, err).await?,
                None,
            ),
        },
    };
    let Some((claimed, staged)) = claimed else {
        look_again_unless_claimed(&stored, &request, reservation);
        return Ok(stored);
    };
    staged.committed();
    hand_over(db, bus, claimed, reservation);
    let_the_request_leave_first().await;
    Ok(stored)
}

/// PostgreSQL, a submission without an ordering key: one statement stores it and, when its
/// endpoint has room, claims it. Without room, a full endpoint is looked at again once
/// enough of its requests end (as a claim that finds it full leaves it), and any other gets
/// an ordinary claim of the endpoint, made in the reserved slot once the submission has
/// committed. A statement the database
/// refuses (nothing of it committed) is tried again without the claim.
async fn store_claiming_in_statement(
    db: &Db,
    bus: &ChangeBus,
    prepared: Prepared,
    request: ClaimRequest,
    reservation: Reservation,
) -> Result<Stored, DbErr> {
    let (reported, in_store) = match store_and_claim(db, &prepared, &request).await {
        Ok(done) => done,
        Err(err) if matches!(classify(&err), Failure::Refused | Failure::Transient) => {
            // Nothing of the statement committed; whether its claim or its store failed, the
            // submission is written again without the claim (a store that fails again
            // fails the submission).
            tracing::warn!(error = %error_chain(&err), "storing a submission with its claim failed; it is stored again to wait for a claim");
            reservation.claim_failed();
            let stored = store_prepared(db, bus, prepared).await?;
            look_again_unless_claimed(&stored, &request, reservation);
            return Ok(stored);
        }
        Err(err) => return Err(err),
    };
    let mut stored = outcome(prepared, reported);
    match in_store {
        ClaimInStore::Claimed(claimed) => {
            if let Stored::Created(_, _, at_submit) = &mut stored {
                *at_submit = true;
            }
            hand_over(db, bus, *claimed, reservation);
            let_the_request_leave_first().await;
        }
        ClaimInStore::Other => {
            let (db, bus) = (db.clone(), bus.clone());
            tokio::spawn(async move {
                match db.within_deadline(claim(&db, &bus, request)).await {
                    Ok(claimed) => start(&db, &bus, claimed, reservation, false).await,
                    Err(err) => {
                        tracing::warn!(error = %error_chain(&err), "claiming a submitted delivery's endpoint failed; the claiming loop takes it");
                    }
                }
            });
        }
        ClaimInStore::Full(left) => reservation.start(*left, Targets::default()),
        ClaimInStore::NotStored => drop(reservation),
    }
    Ok(stored)
}

/// After a submission that claimed nothing: if it is due, a claim elsewhere may have missed
/// it and put its endpoint to sleep, so look again now it has committed; otherwise give the
/// slot back.
fn look_again_unless_claimed(stored: &Stored, request: &ClaimRequest, reservation: Reservation) {
    if let Stored::Created(_, delivery, _) = stored {
        if !delivery.waiting {
            let look_again =
                Claimed::looking_again(delivery.endpoint_id, request.default_max_in_flight);
            reservation.start(look_again, Targets::default());
        }
    }
}

/// Gives way to the task [`hand_over`] just started, so the webhook's request leaves before
/// the submission is answered. The started task waits in this thread's next-to-run slot,
/// where the answer's wake-up of the submitter would displace it: the webhook then left
/// only once the answer was written (0.03 ms after it reached the client, at the median).
/// Given way, it leaves first, and a quiet submission's webhook arrives sooner
/// (`BENCH_ONLY=latency`: a p50 of 2.00 to 2.10 ms against 2.09 to 2.33).
async fn let_the_request_leave_first() {
    tokio::task::yield_now().await;
}

/// Hands a committed claim to the worker, in a task of its own: from here on the claim is
/// the worker's, whatever becomes of the caller (a request given up on must not strand it
/// until its lease runs out).
fn hand_over(db: &Db, bus: &ChangeBus, claimed: Claimed, reservation: Reservation) {
    let (db, bus) = (db.clone(), bus.clone());
    tokio::spawn(async move { start(&db, &bus, claimed, reservation, true).await });
}

/// Starts a committed claim in the reserved slot, with what to send (`at_submit`: the
/// submission's write made it, rather than an ordinary claim right after); a claim whose
/// targets cannot be read is released.
async fn start(
    db: &Db,
    bus: &ChangeBus,
    mut claimed: Claimed,
    reservation: Reservation,
    at_submit: bool,
) {
    match targets_of(db, &reservation.keys(), &mut claimed).await {
        Ok(targets) if at_submit => reservation.start(claimed, targets),
        Ok(targets) => reservation.start_after_submit(claimed, targets),
        Err(err) => {
            tracing::error!(error = %error_chain(&err), "loading a delivery claimed at submit failed; releasing it");
            if let Err(err) = release(db, bus, &claimed.claims).await {
                // It stays `processing` and is reclaimed after its lease.
                tracing::error!(error = %error_chain(&err), "releasing a claim failed");
            }
        }
    }
}

/// PostgreSQL, a submission with an ordering key: the store statement, then (unless the delivery waits in its line) the claim,
/// with the creation staged in the claim's notification. What the row reported, and the
/// claim.
async fn store_and_claim_postgres(
    db: &Db,
    bus: &ChangeBus,
    prepared: &Prepared,
    request: &ClaimRequest,
    failed: &FailedClaim,
) -> Result<(Option<Reported>, Option<(Claimed, Staged)>), DbErr> {
    db.transaction(|txn| async move {
        failed.reset();
        let statement = store_statement(std::slice::from_ref(prepared), Notify::Staged, [])?;
        let rows = txn.query_all_raw(statement).await?;
        let reported = reported_by_row(&rows)?.remove(&prepared.delivery.id);
        let Some(Reported::Created(at, place)) = reported else {
            return Ok((reported, None));
        };
        let created = StateChange {
            at,
            ..prepared.created.clone()
        };
        if place.is_some_and(|p| p.waiting) {
            // Its line's head goes first: nothing to claim. (PostgreSQL sends the
            // notification with the commit; nothing is left to publish after it.)
            drop(bus.stage(&*txn, vec![created]).await?);
            return Ok((reported, None));
        }
        let (claimed, staged) = claim_at_submit(&txn, db, bus, request, failed, created).await?;
        Ok((reported, Some((claimed, staged))))
    })
    .await
}

/// After a try that failed with `err`: if its claim failed it, nothing of it committed, so
/// the submission is stored again, with the same ids, without a claim; otherwise `err`.
async fn without_claim(
    db: &Db,
    bus: &ChangeBus,
    prepared: Prepared,
    reservation: &Reservation,
    failed: &FailedClaim,
    err: DbErr,
) -> Result<Stored, DbErr> {
    if !failed.happened() {
        return Err(err);
    }
    reservation.claim_failed();
    store_prepared(db, bus, prepared).await
}
