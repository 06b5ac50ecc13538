//! The one `LISTEN` connection of a process (PostgreSQL only): state changes from every
//! process feed this process's subscribers, and new due work wakes its worker.

use std::time::Duration;

use entity::webhook_delivery::DeliveryState;
use tokio_util::sync::CancellationToken;

use crate::db::Db;
use crate::events::{EventMessage, Events, StateChange, EVENTS_CHANNEL};
use crate::wake::Wakeup;

/// Listens until `shutdown`, reconnecting after a lost connection. After a reconnect,
/// subscribers are told they may have missed events.
pub async fn run(db: Db, events: Events, wakeup: Wakeup, shutdown: CancellationToken) {
    let Some(pool) = db.pg_listen_pool().cloned() else {
        return;
    };
    let listen = async {
        let mut connected_before = false;
        loop {
            match sqlx::postgres::PgListener::connect_with(&pool).await {
                Ok(mut listener) => match listener.listen(EVENTS_CHANNEL).await {
                    Ok(()) => {
                        if connected_before {
                            events.deliver(EventMessage::Gap);
                        }
                        connected_before = true;
                        loop {
                            match listener.try_recv().await {
                                Ok(Some(notification)) => {
                                    match StateChange::from_wire(notification.payload()) {
                                        Some(change) => {
                                            if change.state == DeliveryState::Pending {
                                                wakeup.hint();
                                            }
                                            events.deliver(EventMessage::Change(change.into()));
                                        }
                                        None => tracing::warn!(
                                            payload = notification.payload(),
                                            "ignoring a malformed event"
                                        ),
                                    }
                                }
                                Ok(None) => {
                                    tracing::warn!("event listener connection lost; reconnecting");
                                    break;
                                }
                                Err(err) => {
                                    tracing::warn!(error = %err, "event listener failed; reconnecting");
                                    break;
                                }
                            }
                        }
                    }
                    Err(err) => tracing::warn!(error = %err, "LISTEN failed; retrying"),
                },
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
