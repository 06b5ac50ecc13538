//! The endpoint rows a recording writes, locked once, in id order, before any is touched:
//! recorders in several processes then never hold one endpoint each while waiting for the
//! other's.
//!
//! Without it, a recording share-locked the endpoints of its retries (the parking rule) and
//! later updated the endpoints of its failures (their run of failures) or pauses: two
//! recorders share-locking one endpoint and then both updating it, or updating two
//! endpoints in the order their outcomes came, deadlocked, and PostgreSQL broke the tie by
//! failing one after a second, so outcomes were recorded late (and sent again when leases
//! ran out meanwhile).
//!
//! A recording that may announce something (a failed delivery, a pause, a disable) also
//! fans an operational event out to the endpoints listening for it, share-locking them: so
//! it locks the listeners in the same pass. Taken later, after its own endpoints, that
//! share lock waited for a recording that held the listener (settling the listener's own
//! deliveries) and waited in turn for one of this recording's endpoints.

use std::collections::{BTreeSet, HashSet};

use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

use super::FinishedAttempt;
use crate::db::sql::fill;
use crate::service::operational;
use crate::worker::health;

/// Locks, in id order, the endpoints `$2` a recording will write or share-lock, and those of
/// `$1` whose run of failures a success would end (a healthy endpoint's row stays unlocked
/// by its successes). `FOR NO KEY UPDATE`: the lock an update takes, which also holds off a
/// disable (`FOR UPDATE`) as the parking rule's share lock does.
const LOCK_ENDPOINTS: &str = "\
SELECT id FROM endpoints
WHERE id = ANY($1::uuid[]) AND (id = ANY($2::uuid[]) OR consecutive_failures <> 0)
ORDER BY id
FOR NO KEY UPDATE";

/// [`LOCK_ENDPOINTS`] with the enabled listeners of operational events that may hear about
/// the endpoints `$1` (`{listeners}`: [`operational::listeners_of`]).
const LOCK_ENDPOINTS_AND_LISTENERS: &str = "\
SELECT id FROM endpoints
WHERE (id = ANY($1::uuid[]) AND (id = ANY($2::uuid[]) OR consecutive_failures <> 0))
   OR id = ANY(ARRAY({listeners}))
ORDER BY id
FOR NO KEY UPDATE";

/// The endpoints of a recording's outcomes: those it settles (delivered, failed) and those
/// it certainly writes or share-locks (a retry's parking rule, a failure, a pause, a
/// `410 Gone`, a keyed delivery's hand-on of its line).
#[derive(Debug, Default)]
pub(super) struct EndpointLocks {
    settled: BTreeSet<Uuid>,
    written: BTreeSet<Uuid>,
    /// Whether an outcome may be announced (see [`EndpointLocks::may_announce`]).
    announcing: bool,
}

impl EndpointLocks {
    /// The locks a recording of `attempts` takes, before any of its deliveries is touched:
    /// a keyed delivery that settles hands its line on (updating other deliveries of the
    /// line, which a replay rejoining the line updates too), so whoever holds a line's
    /// endpoint holds its rows. Locked after its own deliveries, a recording held the head
    /// of a line while it waited for the endpoint, held by a replay that waited for that
    /// head. The hand-on also share-locks the line's endpoint (the parking rule). One that
    /// may be announced (a delivery failed, which may also disable its endpoint; a `410
    /// Gone`; a pause) locks the listeners of operational events too. (An attempt recorded
    /// before, by a try of the batch that did not commit, counts too: its endpoint is
    /// locked for nothing, rarely.)
    pub(super) fn of(attempts: &[FinishedAttempt]) -> Self {
        let mut locks = EndpointLocks::default();
        for attempt in attempts {
            let (state, _) = attempt.transition();
            let announcing = state == DeliveryState::Failed
                || health::is_gone(&attempt.outcome)
                || attempt.outcome.retry_after.is_some();
            if announcing {
                locks.may_announce();
            }
            let written = announcing
                || state != DeliveryState::Delivered
                || attempt.claim.ordering_key.is_some();
            locks.note(attempt.claim.endpoint_id, written);
        }
        locks
    }

    /// Notes an outcome for `endpoint_id`: one it certainly writes (`written`), or a success
    /// that may end a run of failures.
    fn note(&mut self, endpoint_id: Uuid, written: bool) {
        if written {
            self.written.insert(endpoint_id);
        } else {
            self.settled.insert(endpoint_id);
        }
    }

    /// Notes an outcome that may be announced by an operational event (a failed delivery,
    /// which may also disable its endpoint; a pause; a `410 Gone`): the listeners are
    /// locked too.
    fn may_announce(&mut self) {
        self.announcing = true;
    }

    /// Takes the locks, and returns the endpoints locked (PostgreSQL), or `None` when none
    /// needed taking: the transaction already excludes every other writer (SQLite). A
    /// recording of successes alone locks only the endpoints whose run of failures it ends
    /// (a healthy drain's statement locks nothing), before its deliveries like every other:
    /// taken after, a success held its delivery while it waited for the endpoint, held by a
    /// late outcome of that delivery (or a replay) waiting for the delivery. An endpoint
    /// left unlocked had no run of failures when looked at: a run another recorder starts
    /// meanwhile is ordered after this recording, whose successes then end nothing.
    pub(super) async fn lock(
        self,
        txn: &DatabaseTransaction,
        backend: DbBackend,
    ) -> Result<Option<HashSet<Uuid>>, DbErr> {
        if backend != DbBackend::Postgres || (self.written.is_empty() && self.settled.is_empty()) {
            return Ok(None);
        }
        let all: Vec<Uuid> = self.settled.union(&self.written).copied().collect();
        let written: Vec<Uuid> = self.written.into_iter().collect();
        static WITH_LISTENERS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            let listeners = operational::listeners_of("$1::uuid[]");
            fill(LOCK_ENDPOINTS_AND_LISTENERS, &[("listeners", &listeners)])
        });
        let sql = match self.announcing {
            true => WITH_LISTENERS.as_str(),
            false => LOCK_ENDPOINTS,
        };
        txn.query_all_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [Value::from(all), Value::from(written)],
        ))
        .await?
        .iter()
        .map(|row| row.try_get::<Uuid>("", "id"))
        .collect::<Result<HashSet<_>, _>>()
        .map(Some)
    }
}
