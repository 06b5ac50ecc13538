//! The notification bus: delivery state changes staged in the transaction that makes them
//! and published once it commits, the `LISTEN` connection that brings every process's
//! notifications to this one, and the in-process hints that wake the worker and the
//! revocation watcher. Every `NOTIFY` is spelled here ([`notify`]).

mod changes;
pub mod listener;
mod wake;

use std::sync::Arc;

use tokio::sync::Notify;

pub use self::changes::{ChangeBus, ChangeMessage, Staged, StateChange};
pub use self::wake::Wakeup;

/// The PostgreSQL channel delivery state changes travel on (payload: their wire form, see
/// [`StateChange::to_wire`]).
pub const CHANGES_CHANNEL: &str = "courier_events";

/// The PostgreSQL channel on which a revocation is announced (payload: the key's id).
pub const KEYS_CHANNEL: &str = "courier_keys";

/// SQL that queues a `NOTIFY` on `channel` carrying the text `payload` (an SQL expression),
/// delivered only if and when the transaction commits. The one spelling of a notification.
pub fn notify(channel: &'static str, payload: &str) -> String {
    format!("pg_notify('{channel}', {payload})")
}

/// SQL that publishes a new delivery's creation from inside the statement that stores it:
/// `wire` (an SQL expression) is the change's wire form, stamped here with `at`, the time
/// the statement stored the delivery with, so the event tells the stored time.
pub fn notify_created(wire: &str, at: &str) -> String {
    notify(
        CHANGES_CHANNEL,
        &format!("jsonb_set({wire}::jsonb, '{{t}}', to_jsonb({at}))::text"),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_name_their_channel_literally() {
        assert_eq!(notify(KEYS_CHANNEL, "$1"), "pg_notify('courier_keys', $1)");
        assert_eq!(
            notify_created("v.event", "d.created_at"),
            "pg_notify('courier_events', jsonb_set(v.event::jsonb, '{t}', to_jsonb(d.created_at))::text)"
        );
    }
}
