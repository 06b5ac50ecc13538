//! The notification bus: delivery state changes staged in the transaction that makes them
//! and published once it commits, the `LISTEN` connection that brings every process's
//! notifications to this one, and the in-process hints that wake the worker and the
//! revocation watcher. Every `NOTIFY` is spelled here ([`notify`]).

mod changes;
pub mod listener;
mod wake;

use std::sync::Arc;

use tokio::sync::Notify;

pub use self::changes::{ChangeBus, ChangeMessage, Staged, StateChange, CHANGE_BUFFER};
pub use self::wake::Wakeup;

/// The PostgreSQL channel delivery state changes travel on (payload: their wire form, see
/// [`StateChange::to_wire`]).
pub const CHANGES_CHANNEL: &str = "courier_events";

/// The PostgreSQL channel on which a revocation is announced (payload: the key's id).
pub const KEYS_CHANNEL: &str = "courier_keys";

/// The PostgreSQL channel on which a change that made deliveries due without changing
/// their state (an endpoint re-enabled, its cap or rate limit changed) wakes every
/// process's worker (payload: the endpoint's id, for the log's sake).
pub const DUE_CHANNEL: &str = "courier_due";

/// Inside the transaction that made `endpoint_id`'s deliveries due without a state change
/// to announce them: every process's worker is woken once it commits (PostgreSQL; SQLite
/// has one process, whose worker the caller wakes).
pub async fn announce_due(
    txn: &impl sea_orm::ConnectionTrait,
    backend: sea_orm::DbBackend,
    endpoint_id: uuid::Uuid,
) -> Result<(), sea_orm::DbErr> {
    if backend == sea_orm::DbBackend::Postgres {
        txn.execute_raw(sea_orm::Statement::from_sql_and_values(
            backend,
            format!("SELECT {}", notify(DUE_CHANNEL, "$1")),
            [endpoint_id.to_string().into()],
        ))
        .await?;
    }
    Ok(())
}

/// SQL that queues a `NOTIFY` on `channel` carrying the text `payload` (an SQL expression),
/// delivered only if and when the transaction commits. The one spelling of a notification.
pub fn notify(channel: &'static str, payload: &str) -> String {
    format!("pg_notify('{channel}', {payload})")
}

/// The statement of [`ChangeBus::stage_alongside`]: `write`, then a notification for each
/// payload of the text array `$payloads`.
pub fn notifying_after(write: &str, payloads: usize) -> String {
    format!(
        "WITH written AS ({write} RETURNING 1) SELECT {} FROM unnest(${payloads}::text[]) AS payload",
        notify(CHANGES_CHANNEL, "payload")
    )
}

/// Most creation events one `NOTIFY` carries from [`notify_created`]: a change's wire form
/// is at most about 200 bytes, so this many stay well under PostgreSQL's 8000-byte limit.
pub const CREATED_PER_NOTIFY: usize = 24;

/// SQL (a query, for a CTE of the statement that stores new deliveries) that publishes their
/// creation: `stored` is a query of `wire` (a change's wire form, see
/// [`StateChange::to_wire`]) and `at` (the time the statement stored it with, which the
/// event is stamped with). The changes travel as JSON arrays of up to
/// [`CREATED_PER_NOTIFY`], so a statement that stores many queues few notifications.
pub fn notify_created(stored: &str) -> String {
    let send = notify(CHANGES_CHANNEL, "jsonb_agg(change ORDER BY n)::text");
    format!(
        "SELECT count(*) AS notifications FROM (
        SELECT {send} FROM (
            SELECT jsonb_set(stored.wire::jsonb, '{{t}}', to_jsonb(stored.at)) AS change,
                   row_number() OVER () AS n
            FROM ({stored}) AS stored
        ) AS changes
        GROUP BY (n - 1) / {CREATED_PER_NOTIFY}
    ) AS sent"
    )
}

/// A coalescing hint to a task of this process: hints that arrive while it is busy become
/// one. Only ever a hint: every task woken this way also polls.
#[derive(Clone, Debug, Default)]
pub struct Hint(Arc<Notify>);

impl Hint {
    /// Wakes the task (or its next wait, if it is not waiting).
    pub fn give(&self) {
        self.0.notify_one();
    }

    /// Resolves at the next hint (or at once if one arrived since the last wait).
    pub async fn taken(&self) {
        self.0.notified().await;
    }

    /// Takes a hint that arrived since the last wait, if one did, without waiting.
    pub fn take_pending(&self) -> bool {
        futures_util::FutureExt::now_or_never(self.0.notified()).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_hint_is_taken_once_without_waiting() {
        let hint = Hint::default();
        assert!(!hint.take_pending());
        hint.give();
        hint.give();
        assert!(hint.take_pending());
        assert!(!hint.take_pending());
    }

    #[test]
    fn notifications_name_their_channel_literally() {
        assert_eq!(notify(KEYS_CHANNEL, "$1"), "pg_notify('courier_keys', $1)");
        let created = notify_created("SELECT e AS wire, t AS at FROM x");
        assert!(created.contains("pg_notify('courier_events', jsonb_agg(change ORDER BY n)::text)"));
        assert!(created.contains(&format!("GROUP BY (n - 1) / {CREATED_PER_NOTIFY}")));
    }
}
