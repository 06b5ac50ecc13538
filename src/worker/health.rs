//! Endpoint health, settled in the transaction that records outcomes: a `410 Gone` fails its
//! delivery at once and disables the endpoint (`GONE`); a run of
//! `COURIER_DISABLE_AFTER_FAILURES` deliveries ending `failed` with no success between
//! disables it (`FAILING`). Disabling parks the endpoint's waiting deliveries; nothing is lost.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use entity::webhook_delivery::DeliveryState;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, Statement};
use uuid::Uuid;

use super::dispatch::AttemptOutcome;
use crate::bus::StateChange;
use crate::service::switch::{self, DisabledReason};

/// A success ends the run of failures: the counter becomes the failures recorded after it.
/// Written only when it changes, so a healthy endpoint's row is not locked by every success.
const RESET_FAILURES: &str = "UPDATE endpoints SET consecutive_failures = $2 \
     WHERE id = $1 AND consecutive_failures <> $2 RETURNING consecutive_failures, disabled";

/// Failures extend the run; the database adds, so concurrent recorders lose no increment.
/// The count stops at the largest `Int` (an endpoint never disabled for its failures can
/// fail for years) rather than overflow and fail the recording.
const ADD_FAILURES: &str = "UPDATE endpoints SET consecutive_failures = \
     CASE WHEN consecutive_failures > 2147483647 - $2 THEN 2147483647 \
          ELSE consecutive_failures + $2 END \
     WHERE id = $1 RETURNING consecutive_failures, disabled";

/// When endpoints are disabled for their health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HealthPolicy {
    /// Consecutive failed deliveries that disable an endpoint; 0 never does.
    pub disable_after_failures: u32,
}

/// Whether the endpoint answered `410 Gone`: it asks never to be called again.
pub fn is_gone(outcome: &AttemptOutcome) -> bool {
    outcome.status == Some(410)
}

/// How one delivery ended, for its endpoint's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The delivery's endpoint.
    pub endpoint_id: Uuid,
    /// `delivered` or `failed` (other states do not count).
    pub state: DeliveryState,
    /// Whether the attempt that ended it was answered `410 Gone`.
    pub gone: bool,
    /// When the outcome was known, to order outcomes of one endpoint.
    pub at: DateTime<Utc>,
}

/// An endpoint this transaction disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disabled {
    /// The endpoint.
    pub endpoint_id: Uuid,
    /// Why.
    pub reason: DisabledReason,
    /// Its run of failed deliveries at that moment.
    pub consecutive_failures: i32,
}

/// Applies the outcomes' effect on their endpoints inside the recording transaction `txn`,
/// one endpoint at a time in id order, and returns the endpoints it disabled (log them with
/// [`log_disabled`] once the transaction commits) and the creation of their operational
/// events' deliveries. When the recording locked endpoints beforehand (see
/// `record::endpoint_locks`), `locked` holds every endpoint whose row this may write. Of
/// the others, none had a run of failures when looked at, so their successes are left to
/// end nothing rather than take a lock out of order.
pub async fn settle(
    txn: &DatabaseTransaction,
    backend: DbBackend,
    policy: HealthPolicy,
    outcomes: &[Settled],
    locked: Option<&HashSet<Uuid>>,
) -> Result<(Vec<Disabled>, Vec<StateChange>), DbErr> {
    let mut announced = Vec::new();
    let mut by_endpoint: BTreeMap<Uuid, Vec<&Settled>> = BTreeMap::new();
    for outcome in outcomes {
        if matches!(
            outcome.state,
            DeliveryState::Delivered | DeliveryState::Failed
        ) {
            by_endpoint
                .entry(outcome.endpoint_id)
                .or_default()
                .push(outcome);
        }
    }
    let mut disabled = Vec::new();
    for (endpoint_id, mut settled) in by_endpoint {
        settled.sort_by_key(|outcome| outcome.at);
        let last_success = settled
            .iter()
            .rposition(|outcome| outcome.state == DeliveryState::Delivered);
        let failures_after = settled[last_success.map_or(0, |at| at + 1)..].len();
        let failures_after = i32::try_from(failures_after).unwrap_or(i32::MAX);
        let (sql, counted) = match last_success {
            Some(_) => (RESET_FAILURES, failures_after),
            None => (ADD_FAILURES, failures_after),
        };
        if locked.is_some_and(|locked| !locked.contains(&endpoint_id)) {
            continue;
        }
        let row = txn
            .query_one_raw(Statement::from_sql_and_values(
                backend,
                sql,
                [endpoint_id.into(), counted.into()],
            ))
            .await?;
        let (count, already_disabled) = match &row {
            Some(row) => (
                row.try_get::<i32>("", "consecutive_failures")?,
                row.try_get::<bool>("", "disabled")?,
            ),
            None => (counted, false),
        };
        // A `410` asks never to be called again, whatever other requests in flight to the
        // endpoint answered before or after it: a success does not undo it.
        let gone = settled.iter().any(|outcome| outcome.gone);
        let reason = if gone {
            DisabledReason::Gone
        } else if policy.disable_after_failures > 0
            && i64::from(count) >= i64::from(policy.disable_after_failures)
            && !already_disabled
        {
            DisabledReason::Failing
        } else {
            continue;
        };
        if let Some(created) = switch::disable(txn, backend, endpoint_id, reason).await? {
            announced.extend(created);
            disabled.push(Disabled {
                endpoint_id,
                reason,
                consecutive_failures: count,
            });
        }
    }
    Ok((disabled, announced))
}

/// Logs each disabled endpoint with its reason (after the commit that disabled it).
pub fn log_disabled(disabled: &[Disabled]) {
    for endpoint in disabled {
        switch::log_disabled(
            endpoint.endpoint_id,
            endpoint.reason,
            endpoint.consecutive_failures,
        );
    }
}
