//! Disabling and re-enabling an endpoint, written once for the operator's `updateEndpoint`
//! and the worker's health rules: each is one conditional UPDATE of the endpoint row (so
//! of two racing switches one wins and the other changes nothing), then its waiting
//! deliveries parked or made due again, on the database's clock, and the operational event
//! published in the same transaction.

use sea_orm::{ConnectionTrait, DbBackend, DbErr};
use uuid::Uuid;

use crate::bus::StateChange;
use crate::db::Clock;
use crate::service::flow;
use crate::service::operational::{self, Operational};

/// Disables an enabled endpoint for a reason (`$2`); one already disabled keeps its first
/// reason and time.
const DISABLE: &str = "UPDATE endpoints \
     SET disabled = TRUE, disabled_reason = $2, disabled_at = {now}, updated_at = {now} \
     WHERE id = $1 AND NOT disabled";

/// Re-enables a disabled endpoint; its run of failures starts again from nothing.
const ENABLE: &str = "UPDATE endpoints \
     SET disabled = FALSE, disabled_reason = NULL, disabled_at = NULL, consecutive_failures = 0, \
         paused_until = NULL, updated_at = {now} \
     WHERE id = $1 AND disabled";

/// Disabling an endpoint parks its pending deliveries: no due time, so they leave the
/// claim index instead of being scanned past by every claim until the endpoint returns.
/// Runs while the endpoint row is locked (by [`DISABLE`]), so no submission can add a due
/// row meanwhile (see [`crate::db::parking`]).
const PARK: &str = "UPDATE webhook_deliveries SET next_attempt_at = NULL, updated_at = {now} \
     WHERE endpoint_id = $1 AND state = 'pending'";

/// Re-enabling makes parked deliveries due at once, except those waiting in an ordering
/// line, which have no due time until their line is handed to them (see
/// [`crate::service::lines`]).
const UNPARK: &str = "UPDATE webhook_deliveries SET next_attempt_at = {now}, updated_at = {now} \
     WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at IS NULL AND NOT waiting";

/// PostgreSQL: the endpoint `$1` and the listeners that hear of its switch, locked in one
/// id order (`{listeners}`: [`operational::listeners_of`]), all `FOR UPDATE` as an update
/// of the endpoint locks it.
const LOCK_FOR_SWITCH: &str = "\
SELECT id FROM endpoints
WHERE id = $1 OR id = ANY(ARRAY({listeners}))
ORDER BY id
FOR UPDATE";

/// Why an endpoint is disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisabledReason {
    /// An operator disabled it.
    Manual,
    /// It answered `410 Gone`.
    Gone,
    /// Too many consecutive deliveries failed.
    Failing,
}

impl DisabledReason {
    /// The value stored in `endpoints.disabled_reason` and shown as `disabledReason`.
    pub fn as_str(self) -> &'static str {
        match self {
            DisabledReason::Manual => "MANUAL",
            DisabledReason::Gone => "GONE",
            DisabledReason::Failing => "FAILING",
        }
    }
}

/// What a switch did: `None` when the endpoint already stood that way (nothing written);
/// otherwise the creation of every delivery of its operational event, to stage with the
/// transaction's other changes.
pub type Switched = Option<Vec<StateChange>>;

/// Locks, inside `txn` and before anything else of the endpoint is locked, the endpoint an
/// operator is about to switch and the listeners that will hear of it, in one id order
/// (PostgreSQL; SQLite's write transaction excludes every other writer). Locked one by one
/// (the endpoint for the update, then the listeners as the event is published), they
/// could deadlock with a recording that holds a listener and waits for that endpoint (see
/// `worker::record::endpoint_locks`).
pub async fn lock_for_switch(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    endpoint_id: Uuid,
) -> Result<(), DbErr> {
    if backend != DbBackend::Postgres {
        return Ok(());
    }
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let listeners = operational::listeners_of("ARRAY[$1::uuid]");
        crate::db::sql::fill(LOCK_FOR_SWITCH, &[("listeners", &listeners)])
    });
    txn.query_all_raw(sea_orm::Statement::from_sql_and_values(
        backend,
        SQL.as_str(),
        [endpoint_id.into()],
    ))
    .await?;
    Ok(())
}

/// Disables the endpoint for `reason` inside `txn`, parks its waiting deliveries and
/// publishes `courier.endpoint.disabled`. Log it with [`log_disabled`] once `txn` commits.
pub async fn disable(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    endpoint_id: Uuid,
    reason: DisabledReason,
) -> Result<Switched, DbErr> {
    let clock = Clock::new(backend);
    let changed = txn
        .execute_raw(clock.statement(DISABLE, [endpoint_id.into(), reason.as_str().into()]))
        .await?
        .rows_affected()
        == 1;
    if !changed {
        return Ok(None);
    }
    txn.execute_raw(clock.statement(PARK, [endpoint_id.into()]))
        .await?;
    let event = Operational::Disabled {
        endpoint_id,
        reason,
    };
    Ok(Some(operational::publish(txn, backend, &[event]).await?))
}

/// Re-enables the endpoint inside `txn`, makes its parked deliveries due, wakes its turn
/// and publishes `courier.endpoint.enabled`. Log it with [`log_enabled`] once `txn` commits.
pub async fn enable(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    endpoint_id: Uuid,
) -> Result<Switched, DbErr> {
    let clock = Clock::new(backend);
    let changed = txn
        .execute_raw(clock.statement(ENABLE, [endpoint_id.into()]))
        .await?
        .rows_affected()
        == 1;
    if !changed {
        return Ok(None);
    }
    txn.execute_raw(clock.statement(UNPARK, [endpoint_id.into()]))
        .await?;
    // Re-enabling is an operator's "go": a `Retry-After` pause (lifted above) and any turn
    // held back for it end too.
    txn.execute_raw(clock.statement(flow::FLOW_RESTARTED, [endpoint_id.into()]))
        .await?;
    flow::wake_endpoints(txn, backend, &[endpoint_id]).await?;
    let event = Operational::Enabled { endpoint_id };
    Ok(Some(operational::publish(txn, backend, &[event]).await?))
}

/// Tells that an endpoint was disabled (after the commit that disabled it).
pub fn log_disabled(endpoint_id: Uuid, reason: DisabledReason, consecutive_failures: i32) {
    tracing::warn!(
        %endpoint_id,
        reason = reason.as_str(),
        consecutive_failures,
        "endpoint disabled; its waiting deliveries are parked until it is re-enabled"
    );
}

/// Tells that an endpoint was re-enabled (after the commit that re-enabled it).
pub fn log_enabled(endpoint_id: Uuid) {
    tracing::info!(%endpoint_id, "endpoint re-enabled; its waiting deliveries resume");
}
