//! Operational events, one rule in one place: Courier tells operators about trouble by
//! publishing `courier.*` events itself, through the same fan-out as `publish`, inside the
//! transaction that makes the change (a disable that commits always has its event; one that
//! rolls back never does).
//!
//! Who receives them: enabled endpoints that list the type explicitly in `eventTypes` (an
//! empty list means every type but these), never the endpoint the event is about, and only
//! about endpoints of their own tenant (an endpoint without a tenant hears about every
//! endpoint). The events about one endpoint share an ordering key (`endpoint:<id>`), so each
//! listener hears them in the order they happened. No storms: one event per change, and a
//! delivery of an operational event that fails or is asked to wait is not itself announced,
//! so two operational endpoints that both fail cannot feed each other events for ever.

use std::collections::hash_map::{Entry, HashMap};

use chrono::{DateTime, SecondsFormat, Utc};
use entity::event;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};
use serde_json::json;
use uuid::Uuid;

use crate::bus::StateChange;
use crate::db::Clock;
use crate::service::payload::canonical::payload_hash;
use crate::service::submissions::publish::{fan_out_rows, insert_fan_out};
use crate::service::switch::DisabledReason;

/// The prefix reserved for operational events: `publish` refuses it.
pub const RESERVED_PREFIX: &str = "courier.";

/// `courier.endpoint.disabled`.
pub const ENDPOINT_DISABLED: &str = "courier.endpoint.disabled";
/// `courier.endpoint.enabled`.
pub const ENDPOINT_ENABLED: &str = "courier.endpoint.enabled";
/// `courier.endpoint.paused`.
pub const ENDPOINT_PAUSED: &str = "courier.endpoint.paused";
/// `courier.delivery.failed`.
pub const DELIVERY_FAILED: &str = "courier.delivery.failed";

/// The event row of an operational event. The publisher is Courier itself, the nil id (no
/// API key has it); no idempotency key.
const INSERT_EVENT: &str = "\
INSERT INTO events (id, event_type, idempotency_key, payload, payload_hash, published_by, created_at)
VALUES ($1, $2, NULL, $3, $4, '00000000-0000-0000-0000-000000000000', {now})
RETURNING created_at";

/// PostgreSQL: the endpoints that hear about endpoint `$2` for type `$1`, share-locked like
/// `publish`'s targets (a concurrent disable or change of types waits, or is waited for).
const TARGETS_POSTGRES: &str = "\
SELECT t.id FROM endpoints t
WHERE NOT t.disabled AND t.id <> $2
  AND t.event_types @> jsonb_build_array($1::text)
  AND (t.tenant_id IS NULL OR t.tenant_id = (SELECT a.tenant_id FROM endpoints a WHERE a.id = $2))
ORDER BY t.id
FOR SHARE OF t";

/// SQLite (the write transaction excludes every other writer).
const TARGETS_SQLITE: &str = "\
SELECT t.id FROM endpoints t
WHERE NOT t.disabled AND t.id <> $2
  AND EXISTS (SELECT 1 FROM json_each(t.event_types) WHERE json_each.value = $1)
  AND (t.tenant_id IS NULL OR t.tenant_id = (SELECT a.tenant_id FROM endpoints a WHERE a.id = $2))
ORDER BY t.id";

/// One change worth telling operators about.
#[derive(Debug, Clone, PartialEq)]
pub enum Operational {
    /// An endpoint was disabled, for this reason.
    Disabled {
        /// The endpoint.
        endpoint_id: Uuid,
        /// Why.
        reason: DisabledReason,
    },
    /// An endpoint was re-enabled.
    Enabled {
        /// The endpoint.
        endpoint_id: Uuid,
    },
    /// An endpoint asked to be left alone (`Retry-After`) until `until`.
    Paused {
        /// The endpoint.
        endpoint_id: Uuid,
        /// When its deliveries resume.
        until: DateTime<Utc>,
    },
    /// A delivery ended its cycle `FAILED`.
    DeliveryFailed {
        /// The delivery.
        delivery_id: Uuid,
        /// Its endpoint.
        endpoint_id: Uuid,
    },
}

impl Operational {
    /// The event type.
    pub fn event_type(&self) -> &'static str {
        match self {
            Operational::Disabled { .. } => ENDPOINT_DISABLED,
            Operational::Enabled { .. } => ENDPOINT_ENABLED,
            Operational::Paused { .. } => ENDPOINT_PAUSED,
            Operational::DeliveryFailed { .. } => DELIVERY_FAILED,
        }
    }

    /// The endpoint the event is about.
    pub fn endpoint_id(&self) -> Uuid {
        match self {
            Operational::Disabled { endpoint_id, .. }
            | Operational::Enabled { endpoint_id }
            | Operational::Paused { endpoint_id, .. }
            | Operational::DeliveryFailed { endpoint_id, .. } => *endpoint_id,
        }
    }

    /// The webhook body, stamped `at`.
    pub fn payload(&self, at: DateTime<Utc>) -> serde_json::Value {
        let stamp = |at: DateTime<Utc>| at.to_rfc3339_opts(SecondsFormat::Millis, true);
        let mut payload = json!({
            "type": self.event_type(),
            "endpointId": self.endpoint_id(),
            "at": stamp(at),
        });
        match self {
            Operational::Disabled { reason, .. } => {
                payload["reason"] = json!(reason.as_str());
            }
            Operational::Paused { until, .. } => payload["until"] = json!(stamp(*until)),
            Operational::DeliveryFailed { delivery_id, .. } => {
                payload["deliveryId"] = json!(delivery_id);
            }
            Operational::Enabled { .. } => {}
        }
        payload
    }
}

/// Whether `event_type` is reserved for Courier (`publish` and `submit` refuse it): it
/// begins with `courier.`, or with anything a reader would take for it (another case,
/// fullwidth letters, a Cyrillic `с`, a one-dot leader for the dot).
pub fn is_reserved(event_type: &str) -> bool {
    static RESERVED: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| crate::service::event_types::skeleton(RESERVED_PREFIX));
    event_type.starts_with(RESERVED_PREFIX)
        || crate::service::event_types::skeleton(event_type).starts_with(RESERVED.as_str())
}

/// Every operational event type.
pub const OPERATIONAL_TYPES: [&str; 4] = [
    ENDPOINT_DISABLED,
    ENDPOINT_ENABLED,
    ENDPOINT_PAUSED,
    DELIVERY_FAILED,
];

/// PostgreSQL: whether an endpoint row lists any of [`OPERATIONAL_TYPES`] in `eventTypes`
/// (a listener), spelled as the partial index of listeners is (so statements asking it
/// read that index rather than every endpoint).
pub use migration::LISTENS;

/// PostgreSQL: the ids of the enabled listeners that may hear about the endpoints whose ids
/// the SQL array `subjects` holds (listeners of their tenants, and those without one). A
/// transaction that may announce locks these with its own endpoints, in one id order,
/// before [`publish`] share-locks them: taken after its own, that share lock could wait for
/// a transaction holding a listener and waiting in turn for one of its endpoints.
pub fn listeners_of(subjects: &str) -> String {
    format!(
        "SELECT l.id FROM endpoints l \
         WHERE l.{LISTENS} AND NOT l.disabled \
           AND (l.tenant_id IS NULL \
                OR l.tenant_id IN (SELECT s.tenant_id FROM endpoints s WHERE s.id = ANY({subjects})))"
    )
}

/// Whether `event_type` is one of the operational events: a delivery of one that fails, or
/// is asked to wait, is not announced again.
pub fn is_operational(event_type: &str) -> bool {
    OPERATIONAL_TYPES.contains(&event_type)
}

/// The ordering key of the events about `endpoint_id`: they line up per listener. It
/// begins with [`RESERVED_PREFIX`], which callers' keys may not (see
/// [`crate::service::lines::validate`]), so no caller's delivery can join the line and
/// hold these events back.
pub fn about_key(endpoint_id: Uuid) -> String {
    format!("{RESERVED_PREFIX}endpoint.{endpoint_id}")
}

/// Publishes each of `changes` inside `txn` to the endpoints that hear about it, and
/// returns the creation of every delivery made, to stage with the transaction's other
/// changes. Each is one event, stamped with the database's time.
pub async fn publish(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    changes: &[Operational],
) -> Result<Vec<StateChange>, DbErr> {
    let mut created = Vec::new();
    // Who hears about an endpoint is asked once per type and endpoint (many deliveries of
    // one endpoint may fail in one recording).
    let mut listeners: HashMap<(&'static str, Uuid), Vec<Uuid>> = HashMap::new();
    // The database's time, read once the first event has listeners.
    let mut at = None;
    for change in changes {
        let key = (change.event_type(), change.endpoint_id());
        let targets = match listeners.entry(key) {
            Entry::Occupied(known) => known.get().clone(),
            Entry::Vacant(unknown) => unknown
                .insert(targets(txn, backend, key.0, key.1).await?)
                .clone(),
        };
        if !targets.is_empty() {
            let at = match at {
                Some(at) => at,
                None => *at.insert(database_now(txn, backend).await?),
            };
            created.extend(publish_one(txn, backend, change, targets, at).await?);
        }
    }
    Ok(created)
}

/// The endpoints that hear about `about` for `event_type`.
async fn targets(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    event_type: &str,
    about: Uuid,
) -> Result<Vec<Uuid>, DbErr> {
    let sql = match backend {
        DbBackend::Postgres => TARGETS_POSTGRES,
        _ => TARGETS_SQLITE,
    };
    txn.query_all_raw(Statement::from_sql_and_values(
        backend,
        sql,
        [event_type.into(), about.into()],
    ))
    .await?
    .iter()
    .map(|row| row.try_get::<Uuid>("", "id"))
    .collect()
}

/// The database's time now (on SQLite, which has no server, this process's).
async fn database_now(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
) -> Result<DateTime<Utc>, DbErr> {
    txn.query_one_raw(Clock::new(backend).statement("SELECT {now} AS now", []))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the database's time".into()))?
        .try_get("", "now")
}

/// Stores one event for `change`, stamped `at`, and its deliveries to `targets`.
async fn publish_one(
    txn: &impl ConnectionTrait,
    backend: DbBackend,
    change: &Operational,
    targets: Vec<Uuid>,
    at: DateTime<Utc>,
) -> Result<Vec<StateChange>, DbErr> {
    let clock = Clock::new(backend);
    let payload = change.payload(at);
    // The payload holds only ids, type names and times: no number to fail on.
    let hash = payload_hash(&payload).map_err(|err| DbErr::Custom(err.to_string()))?;
    let id = crate::db::ids::new_id();
    let row = txn
        .query_one_raw(clock.statement(
            INSERT_EVENT,
            [
                id.into(),
                change.event_type().into(),
                payload.clone().into(),
                hash.clone().into(),
            ],
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("an operational event just stored".into()))?;
    let event = event::Model {
        id,
        event_type: change.event_type().to_owned(),
        idempotency_key: None,
        payload,
        payload_hash: hash,
        published_by: Uuid::nil(),
        created_at: row.try_get("", "created_at")?,
        // The events about one endpoint reach each listener in the order they happened.
        ordering_key: Some(about_key(change.endpoint_id())),
        // Made by a recording, not by a request: there is no caller's trace to continue.
        trace_context: None,
    };
    let rows = fan_out_rows(&event, targets);
    insert_fan_out(txn, backend, &event, &rows).await?;
    Ok(rows.into_iter().map(|row| row.created).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listeners_index_names_every_operational_type_and_no_other() {
        for event_type in OPERATIONAL_TYPES {
            assert!(LISTENS.contains(&format!("'{event_type}'")), "{event_type}");
        }
        assert_eq!(
            LISTENS.matches("'courier.").count(),
            OPERATIONAL_TYPES.len()
        );
    }
}
