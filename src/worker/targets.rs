//! Loading what to send for a batch of claims: payload, URL and secrets, read (and opened)
//! just before sending.

use std::collections::{HashMap, HashSet};

use sea_orm::{ConnectionTrait, DbErr, QueryResult};
use uuid::Uuid;

use super::claim::Claim;
use crate::crypto::sealing::SecretKeys;
use crate::db::sql::fill;
use crate::db::Db;

/// Everything needed to send the claimed deliveries, in one query per batch. The previous
/// secret comes only while its stored expiry is ahead of the database's clock, so every
/// process stops signing with it at the same moment, whatever its own clock says.
const LOAD_TARGETS: &str = "\
SELECT d.id, {target_columns}
FROM webhook_deliveries d
JOIN submissions s ON s.id = d.submission_id
JOIN endpoints e ON e.id = d.endpoint_id
WHERE d.id {ids}";

/// The columns a target is read from, given `s` (the submission) and `e` (the endpoint):
/// one definition for [`LOAD_TARGETS`] and the PostgreSQL claim, which returns them. A
/// published event's payload is stored once, on the event, and read from there.
const TARGET_COLUMNS: &str = "CASE WHEN s.event_id IS NULL THEN s.payload
            ELSE (SELECT ev.payload FROM events ev WHERE ev.id = s.event_id) END AS payload,
       s.trace_context, e.url, e.signing_secret,
       CASE WHEN e.previous_secret_expires_at > {now} THEN e.previous_signing_secret END AS previous_secret";

/// `template` with its `{target_columns}` slot filled with the columns a target is read
/// from, and its `{ids}` slot with `ids`.
pub fn with_columns(template: &str, ids: &str) -> String {
    fill(
        template,
        &[("target_columns", TARGET_COLUMNS), ("ids", ids)],
    )
}

/// Where and what to send for one claimed delivery.
#[derive(Debug, Clone)]
pub struct Target {
    /// The endpoint URL.
    pub url: String,
    /// The endpoint's signing secret, as stored right now.
    pub secret: String,
    /// The secret a rotation replaced, while its grace period lasts.
    pub previous_secret: Option<String>,
    /// The JSON body.
    pub body: Vec<u8>,
    /// The `traceparent` of the request that submitted it, if it was traced.
    pub trace_context: Option<String>,
}

/// What to send for a batch of claims: a target for each claim whose row was read and whose
/// endpoint's secrets opened.
#[derive(Debug, Default)]
pub struct Targets {
    ready: HashMap<Uuid, Target>,
    /// Claims whose endpoint's secret this process's keys could not open.
    unopened: HashSet<Uuid>,
}

/// What [`Targets::take`] found for one claim.
#[derive(Debug)]
pub enum Found {
    /// What to send.
    Ready(Target),
    /// Its endpoint's secret could not be opened with this process's keys (a process that
    /// does not know a newer `COURIER_ENCRYPTION_KEY`): it is never signed with anything
    /// else; the claim is handed back for a process that holds the key.
    Unopened,
    /// Its row could not be read.
    Missing,
}

impl Targets {
    /// What to send for `delivery_id`, if it was found and its secrets opened.
    pub fn get(&self, delivery_id: &Uuid) -> Option<&Target> {
        self.ready.get(delivery_id)
    }

    /// Takes what was found for `delivery_id`.
    pub fn take(&mut self, delivery_id: Uuid) -> Found {
        match self.ready.remove(&delivery_id) {
            Some(target) => Found::Ready(target),
            None if self.unopened.remove(&delivery_id) => Found::Unopened,
            None => Found::Missing,
        }
    }
}

/// Reads the payload, URL and secrets of each claimed delivery in one query. A delivery
/// whose secret cannot be opened with `keys` is marked so (and logged): it is never signed
/// with anything else.
pub async fn load_targets(db: &Db, keys: &SecretKeys, claims: &[Claim]) -> Result<Targets, DbErr> {
    if claims.is_empty() {
        return Ok(Targets::default());
    }
    let ids: Vec<Uuid> = claims.iter().map(|claim| claim.delivery_id).collect();
    let (list, values) = Db::id_list(db.backend(), 1, &ids, false);
    let sql = with_columns(LOAD_TARGETS, &list);
    let rows = db
        .conn()
        .query_all_raw(db.clock().statement(&sql, values))
        .await?;
    from_rows(keys, claims, &rows)
}

/// Targets from rows holding `id` and the target columns (for claims of `claims`).
pub fn from_rows(
    keys: &SecretKeys,
    claims: &[Claim],
    rows: &[QueryResult],
) -> Result<Targets, DbErr> {
    let mut targets = Targets {
        ready: HashMap::with_capacity(rows.len()),
        unopened: HashSet::new(),
    };
    for row in rows {
        let id: Uuid = row.try_get("", "id")?;
        // A row parked rather than claimed needs nothing.
        let Some(endpoint_id) = claims
            .iter()
            .find(|claim| claim.delivery_id == id)
            .map(|claim| claim.endpoint_id)
        else {
            continue;
        };
        let payload: serde_json::Value = row.try_get("", "payload")?;
        let body = serde_json::to_vec(&payload).map_err(|err| DbErr::Json(err.to_string()))?;
        let sealed: String = row.try_get("", "signing_secret")?;
        let sealed_previous: Option<String> = row.try_get("", "previous_secret")?;
        let opened = keys.open(endpoint_id, &sealed).and_then(|secret| {
            let previous = sealed_previous
                .map(|sealed| keys.open(endpoint_id, &sealed))
                .transpose()?;
            Ok((secret, previous))
        });
        let (secret, previous_secret) = match opened {
            Ok(secrets) => secrets,
            Err(err) => {
                tracing::error!(delivery_id = %id, %endpoint_id, error = %err,
                    "cannot open the endpoint's signing secret with COURIER_ENCRYPTION_KEY; \
                     not sending, handing the delivery back for a process that holds the key");
                targets.unopened.insert(id);
                continue;
            }
        };
        targets.ready.insert(
            id,
            Target {
                url: row.try_get("", "url")?,
                secret,
                previous_secret,
                body,
                trace_context: row.try_get("", "trace_context")?,
            },
        );
    }
    Ok(targets)
}
