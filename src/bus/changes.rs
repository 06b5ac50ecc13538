//! Delivery state changes: staged inside the transaction that makes them and published
//! only once it commits. On PostgreSQL they travel as `NOTIFY` (delivered in commit order,
//! to every process); on SQLite through an in-process broadcast.

use sea_orm::ActiveEnum as _;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use uuid::Uuid;

use crate::metrics::Metrics;

/// Changes a slow subscriber may fall behind by before it is told it missed some. Room for
/// bursts: a publish to 2,300 endpoints is 2,300 creations heard at once, and four of them
/// back to back lagged every subscriber when this was 4,096 (none now). Each change kept
/// is an `Arc` of about a hundred bytes, so a full buffer holds under 2 MB (the process's
/// peak RSS in that test went from 38 to 42 MB).
pub const CHANGE_BUFFER: usize = 16_384;

/// One committed change of one delivery's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// The delivery.
    pub delivery_id: Uuid,
    /// Its endpoint (for filtering and scoping).
    pub endpoint_id: Uuid,
    /// The state before; `None` when the delivery was just created.
    pub previous_state: Option<DeliveryState>,
    /// The state after.
    pub state: DeliveryState,
    /// When the change was made.
    pub at: DateTime<Utc>,
}

/// What subscribers receive.
#[derive(Debug, Clone)]
pub enum ChangeMessage {
    /// A state change.
    Change(Arc<StateChange>),
    /// ChangeBus may have been lost (the listener reconnected): subscribers must refetch.
    Gap,
}

/// Compact wire form of a [`StateChange`].
#[derive(Serialize, Deserialize)]
struct Wire {
    d: Uuid,
    e: Uuid,
    p: Option<String>,
    s: String,
    t: DateTime<Utc>,
}

impl From<&StateChange> for Wire {
    fn from(change: &StateChange) -> Self {
        Wire {
            d: change.delivery_id,
            e: change.endpoint_id,
            p: change.previous_state.map(|s| s.to_value()),
            s: change.state.to_value(),
            t: change.at,
        }
    }
}

impl Wire {
    fn change(self) -> Option<StateChange> {
        Some(StateChange {
            delivery_id: self.d,
            endpoint_id: self.e,
            previous_state: match self.p {
                Some(p) => Some(DeliveryState::try_from_value(&p).ok()?),
                None => None,
            },
            state: DeliveryState::try_from_value(&self.s).ok()?,
            at: self.t,
        })
    }
}

/// What one `NOTIFY` carries: one change, or the changes of one transaction in order.
#[derive(Deserialize)]
#[serde(untagged)]
enum Payload {
    Many(Vec<Wire>),
    One(Wire),
}

/// Longest `NOTIFY` payload built here (PostgreSQL refuses 8000 bytes and more).
const MAX_PAYLOAD: usize = 7_900;

impl StateChange {
    /// The `NOTIFY` payload of this change alone.
    pub fn to_wire(&self) -> Result<String, DbErr> {
        serde_json::to_string(&Wire::from(self)).map_err(|err| DbErr::Json(err.to_string()))
    }

    /// The `NOTIFY` payloads of `changes`, in order: each a JSON array of as many changes as
    /// fit in one payload. A transaction's changes travel in as few notifications as
    /// possible: PostgreSQL queues, signals and hands each notification to every listening
    /// process, so one per change would cost every process a message per change.
    pub fn to_wire_batches(changes: &[StateChange]) -> Result<Vec<String>, DbErr> {
        let mut payloads = Vec::new();
        let mut current = String::from("[");
        for change in changes {
            let one = change.to_wire()?;
            if current.len() > 1 && current.len() + one.len() + 2 > MAX_PAYLOAD {
                current.push(']');
                payloads.push(std::mem::replace(&mut current, String::from("[")));
            }
            if current.len() > 1 {
                current.push(',');
            }
            current.push_str(&one);
        }
        if current.len() > 1 {
            current.push(']');
            payloads.push(current);
        }
        Ok(payloads)
    }

    /// Parses a `NOTIFY` payload: one change, or an array of them (all or nothing).
    pub fn from_wire(payload: &str) -> Option<Vec<StateChange>> {
        match serde_json::from_str(payload).ok()? {
            Payload::One(wire) => Some(vec![wire.change()?]),
            Payload::Many(wires) => wires.into_iter().map(Wire::change).collect(),
        }
    }
}

/// The publisher and the in-process broadcast of state changes.
#[derive(Clone, Debug)]
pub struct ChangeBus {
    sender: broadcast::Sender<ChangeMessage>,
    backend: DbBackend,
    metrics: Arc<Metrics>,
    /// SQLite: held from staging until publishing, so this process publishes in commit order.
    order: Arc<tokio::sync::Mutex<()>>,
    /// Whether changes from every process reach this one (PostgreSQL: while `LISTEN` holds).
    live: Arc<tokio::sync::watch::Sender<bool>>,
}

/// Changes staged in a transaction; hand them back with [`Staged::committed`] after the commit.
#[must_use = "call `committed()` after the transaction commits"]
pub struct Staged {
    bus: ChangeBus,
    changes: Vec<StateChange>,
    _in_order: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Staged {
    /// The transaction committed: publish (on SQLite; PostgreSQL's `NOTIFY` already went
    /// with the commit). Dropping a `Staged` without this, after a rollback, publishes nothing.
    pub fn committed(self) {
        if self.bus.backend != DbBackend::Postgres {
            for change in self.changes {
                self.bus.deliver(ChangeMessage::Change(Arc::new(change)));
            }
        }
    }
}

impl ChangeBus {
    /// ChangeBus for a database of `backend`.
    pub fn new(backend: DbBackend, metrics: Arc<Metrics>) -> Self {
        let (sender, _) = broadcast::channel(CHANGE_BUFFER);
        let (live, _) = tokio::sync::watch::channel(backend != DbBackend::Postgres);
        ChangeBus {
            sender,
            backend,
            metrics,
            order: Arc::new(tokio::sync::Mutex::new(())),
            live: Arc::new(live),
        }
    }

    /// A new subscriber's receiver.
    pub fn subscribe(&self) -> broadcast::Receiver<ChangeMessage> {
        self.sender.subscribe()
    }

    /// Stages `changes` inside the transaction `txn`. On PostgreSQL this queues `NOTIFY`s
    /// carrying the changes in order (as few as fit them, see
    /// [`StateChange::to_wire_batches`]), which the server delivers only if and when `txn`
    /// commits, in commit order: the order every subscriber sees.
    ///
    /// On SQLite the in-process publish must follow commit order: the write transaction
    /// (`BEGIN IMMEDIATE`) already serialises writers, and a lock taken here and released
    /// by [`Staged::committed`] keeps their publishing in the same order.
    pub async fn stage<C: ConnectionTrait>(
        &self,
        txn: &C,
        changes: Vec<StateChange>,
    ) -> Result<Staged, DbErr> {
        if self.backend == DbBackend::Postgres && !changes.is_empty() {
            let payloads = StateChange::to_wire_batches(&changes)?;
            let sql = format!(
                "SELECT {} FROM unnest($1::text[]) AS payload",
                super::notify(super::CHANGES_CHANNEL, "payload")
            );
            txn.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                sql,
                [Value::from(payloads)],
            ))
            .await?;
        }
        self.staged(changes).await
    }

    /// [`ChangeBus::stage`] on PostgreSQL in the statement of `write` (an `UPDATE` or
    /// `INSERT` without `RETURNING`, whose values are `values`, `$1`...; SQL as the server
    /// takes it, with no clock tokens to render): the write and the notifications in one
    /// round trip. The write runs even when there is nothing to send.
    pub async fn stage_alongside<C: ConnectionTrait>(
        &self,
        txn: &C,
        changes: Vec<StateChange>,
        write: &str,
        mut values: Vec<Value>,
    ) -> Result<Staged, DbErr> {
        let sql = super::notifying_after(write, values.len() + 1);
        values.push(Value::from(StateChange::to_wire_batches(&changes)?));
        txn.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await?;
        self.staged(changes).await
    }

    /// `changes`, their notifications queued (PostgreSQL), or (SQLite) held in commit order.
    async fn staged(&self, changes: Vec<StateChange>) -> Result<Staged, DbErr> {
        let in_order = match self.backend {
            DbBackend::Postgres => None,
            _ => Some(self.order.clone().lock_owned().await),
        };
        Ok(Staged {
            bus: self.clone(),
            changes,
            _in_order: in_order,
        })
    }

    /// Records whether changes from every process reach this one (the listener's state).
    pub fn set_live(&self, live: bool) {
        self.live.send_replace(live);
    }

    /// Waits until changes from every process reach this one, up to `timeout`.
    pub async fn wait_live(&self, timeout: std::time::Duration) -> bool {
        let mut live = self.live.subscribe();
        tokio::time::timeout(timeout, live.wait_for(|live| *live))
            .await
            .is_ok_and(|waited| waited.is_ok())
    }

    /// Hands a message to every subscriber of this process.
    pub fn deliver(&self, message: ChangeMessage) {
        if matches!(message, ChangeMessage::Change(_)) {
            self.metrics.events_published.inc();
        }
        // No receivers is fine: nobody is watching.
        let _ = self.sender.send(message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_survive_the_wire() {
        let change = StateChange {
            delivery_id: Uuid::now_v7(),
            endpoint_id: Uuid::now_v7(),
            previous_state: Some(DeliveryState::Processing),
            state: DeliveryState::Delivered,
            at: crate::db::now(),
        };
        let wire = change.to_wire().unwrap();
        assert!(wire.len() < 200, "{wire}");
        assert_eq!(StateChange::from_wire(&wire), Some(vec![change]));
        assert_eq!(StateChange::from_wire("garbage"), None);
    }

    fn change(n: u32) -> StateChange {
        StateChange {
            delivery_id: Uuid::now_v7(),
            endpoint_id: Uuid::now_v7(),
            previous_state: n.is_multiple_of(2).then_some(DeliveryState::Pending),
            state: DeliveryState::Processing,
            at: crate::db::now(),
        }
    }

    #[test]
    fn a_transaction_s_changes_travel_together_in_order_within_the_payload_limit() {
        let changes: Vec<StateChange> = (0..200).map(change).collect();
        let payloads = StateChange::to_wire_batches(&changes).unwrap();
        assert!(payloads.len() > 1, "200 changes need more than one payload");
        assert!(
            payloads.len() < 10,
            "{} payloads for 200 changes",
            payloads.len()
        );
        assert!(payloads.iter().all(|p| p.len() <= MAX_PAYLOAD));
        let back: Vec<StateChange> = payloads
            .iter()
            .flat_map(|p| StateChange::from_wire(p).unwrap())
            .collect();
        assert_eq!(back, changes);
        assert!(StateChange::to_wire_batches(&[]).unwrap().is_empty());
    }

    #[test]
    fn a_payload_with_one_bad_change_is_refused_whole() {
        let good = change(1).to_wire().unwrap();
        let bad = good.replace("processing", "exploded");
        assert_eq!(StateChange::from_wire(&format!("[{good},{bad}]")), None);
    }
}
