//! The one `LISTEN` connection of a process (PostgreSQL only): state changes from every
//! process feed this process's subscribers, new due work (announced by its state change
//! or on [`DUE_CHANNEL`]) wakes its worker, and a revoked API key wakes its revocation
//! watcher.

use std::time::Duration;

use entity::webhook_delivery::DeliveryState;
use tokio_util::sync::CancellationToken;

use super::{
    ChangeBus, ChangeMessage, Hint, StateChange, Wakeup, CHANGES_CHANNEL, DUE_CHANNEL, KEYS_CHANNEL,
};
use crate::db::Db;

/// Listens until `shutdown`, reconnecting after a lost connection. After a reconnect,
/// subscribers are told they may have missed events (a missed revocation needs no such
/// notice: the revocation watcher polls anyway).
pub async fn run(
    db: Db,
    bus: ChangeBus,
    wakeup: Wakeup,
    revocations: Hint,
    shutdown: CancellationToken,
) {
    if db.new_listen_pool().is_none() {
        return;
    }
    let deadline = db.timeouts().work;
    let listen = async {
        // A pool of its own for each session (see `Db::new_listen_pool`).
        while let Some(pool) = db.new_listen_pool() {
            // Connecting is bounded by the pool's acquire timeout; `LISTEN` by the work deadline.
            match sqlx::postgres::PgListener::connect_with(&pool).await {
                Ok(mut listener) => {
                    // A lost connection is reported at once, never re-established out of
                    // sight (by the liveness ping, say): what it missed must be told.
                    listener.eager_reconnect(false);
                    let listening =
                        listener.listen_all([CHANGES_CHANNEL, KEYS_CHANNEL, DUE_CHANNEL]);
                    match tokio::time::timeout(deadline, listening).await {
                        Ok(Ok(())) => {
                            bus.set_live(true);
                            receive(&mut listener, &bus, &wakeup, &revocations, deadline).await;
                            // Whatever was published while reconnecting is lost to this process.
                            bus.set_live(false);
                            bus.deliver(ChangeMessage::Gap);
                        }
                        Ok(Err(err)) => tracing::warn!(error = %err, "LISTEN failed; retrying"),
                        Err(_) => tracing::warn!("LISTEN got no answer; retrying"),
                    }
                }
                Err(err) => tracing::warn!(error = %err, "event listener cannot connect; retrying"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = listen => {}
    }
}

/// Hands every notification to subscribers (or, for a revoked key, to the revocation
/// watcher) until the connection is lost. A quiet connection is checked every
/// [`LIVENESS_CHECK`] and must answer within `deadline`, so one silently dropped by the
/// network is noticed and replaced.
async fn receive(
    listener: &mut sqlx::postgres::PgListener,
    bus: &ChangeBus,
    wakeup: &Wakeup,
    revocations: &Hint,
    deadline: Duration,
) {
    loop {
        match tokio::time::timeout(LIVENESS_CHECK, listener.try_recv()).await {
            Ok(Ok(Some(notification))) if notification.channel() == KEYS_CHANNEL => {
                revocations.give();
            }
            Ok(Ok(Some(notification))) if notification.channel() == DUE_CHANNEL => {
                wakeup.hint();
            }
            Ok(Ok(Some(notification))) => match StateChange::from_wire(notification.payload()) {
                Some(changes) => {
                    if waits_for_a_claim(&changes) {
                        wakeup.hint();
                    }
                    for change in changes {
                        bus.deliver(ChangeMessage::Change(change.into()));
                    }
                }
                // Changes this process cannot read (another version's, say) are missed:
                // subscribers are told so, as after a lost connection.
                None => {
                    tracing::warn!(
                        payload = notification.payload(),
                        "a malformed event; subscribers are told they missed events"
                    );
                    bus.deliver(ChangeMessage::Gap);
                }
            },
            Ok(Ok(None)) => {
                tracing::warn!("event listener connection lost; reconnecting");
                return;
            }
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "event listener failed; reconnecting");
                return;
            }
            Err(_quiet) => {
                let ping =
                    tokio::time::timeout(deadline, sqlx::query("SELECT 1").execute(&mut *listener))
                        .await;
                if !matches!(ping, Ok(Ok(_))) {
                    tracing::warn!("event listener stopped answering; reconnecting");
                    return;
                }
            }
        }
    }
}

/// Whether `changes` (one notification) make a delivery due that no claim took in the same
/// transaction: a submission that claimed its own delivery publishes both together, and
/// wakes no worker.
fn waits_for_a_claim(changes: &[StateChange]) -> bool {
    changes.iter().any(|change| {
        change.state == DeliveryState::Pending
            && !changes.iter().any(|later| {
                later.delivery_id == change.delivery_id && later.state == DeliveryState::Processing
            })
    })
}

/// How long the listener may stay quiet before its connection is checked.
const LIVENESS_CHECK: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn change(delivery_id: Uuid, state: DeliveryState) -> StateChange {
        StateChange {
            delivery_id,
            endpoint_id: Uuid::nil(),
            previous_state: None,
            state,
            at: crate::db::now(),
        }
    }

    #[test]
    fn a_creation_claimed_in_the_same_transaction_wakes_no_worker() {
        let (claimed, waiting) = (Uuid::now_v7(), Uuid::now_v7());
        let together = [
            change(claimed, DeliveryState::Pending),
            change(claimed, DeliveryState::Processing),
        ];
        assert!(!waits_for_a_claim(&together));
        assert!(waits_for_a_claim(&[change(
            waiting,
            DeliveryState::Pending
        )]));
        let mixed = [
            change(claimed, DeliveryState::Pending),
            change(waiting, DeliveryState::Pending),
            change(claimed, DeliveryState::Processing),
        ];
        assert!(waits_for_a_claim(&mixed));
        assert!(!waits_for_a_claim(&[change(
            waiting,
            DeliveryState::Delivered
        )]));
    }
}
