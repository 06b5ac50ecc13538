//! `publish`: one typed event, fanned out in one transaction to a submission and a
//! `pending` delivery for every enabled endpoint subscribed to its type (and in the
//! publisher's scope). Idempotency rests on `UNIQUE (published_by, idempotency_key)`.

use entity::{event, submission};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, IntoActiveModel, QueryFilter, Statement,
    Value,
};
use uuid::Uuid;

use crate::auth::Identity;
use crate::bus::ChangeBus;
use crate::db::{self, Db};
use crate::error::{Error, Result};
use crate::metrics::SubmissionOutcome;
use crate::service::access::{Access, Visible};
use crate::service::submissions::intake::{Intake, PayloadFrom};
use crate::service::submissions::store::{prepare, NewRows, Prepared};
use crate::service::{event_types, flow, lines, operational};
use crate::telemetry;

/// Refused: an event none of whose deliveries is in the key's scope, or no event at all.
const EVENT_OUTSIDE: Error = Error::Forbidden("this event is outside the API key's scope");

/// Race 3 for events: the unique index decides who created the event. A loser waits for
/// the winner's commit and then inserts nothing, so losing is an outcome, not an error.
const INSERT_EVENT: &str = "\
INSERT INTO events (id, event_type, idempotency_key, payload, payload_hash, published_by, created_at,
                    ordering_key, trace_context)
VALUES ($1, $2, $3, $4, $5, $6, {now}, $7, $8)
ON CONFLICT (published_by, idempotency_key) DO NOTHING
RETURNING id, created_at";

/// The endpoints an event reaches, share-locked until the fan-out commits: a concurrent
/// disable or change of event types (which locks the row `FOR UPDATE`) waits for the fan-out,
/// or the fan-out waits for it and then reads the endpoint as it committed. Either way no
/// due delivery is left on a disabled endpoint. `$2` is a partner's scope (NULL: everything).
const TARGETS_POSTGRES: &str = "\
SELECT id, tenant_id FROM endpoints
WHERE NOT disabled
  AND (event_types = '[]'::jsonb OR event_types @> jsonb_build_array($1::text))
  AND ($2::uuid[] IS NULL OR id = ANY($2))
  AND ($3::uuid IS NULL OR tenant_id = $3)
ORDER BY id
FOR SHARE";

/// SQLite: the write transaction (`BEGIN IMMEDIATE`) already excludes every other writer.
const TARGETS_SQLITE: &str = "\
SELECT id, tenant_id FROM endpoints
WHERE NOT disabled
  AND (json_array_length(event_types) = 0
       OR EXISTS (SELECT 1 FROM json_each(endpoints.event_types) WHERE json_each.value = $1))
ORDER BY id";

/// Every submission and delivery of a fan-out in one statement, whatever the number of
/// endpoints: the ids travel as arrays, so the statement is prepared once. With an ordering
/// key (`$10`), each delivery then enters its endpoint's line ([`lines::enter`]).
const FAN_OUT_POSTGRES: &str = "\
WITH targets AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[]) AS t(submission_id, delivery_id, endpoint_id)
), stored AS (
    INSERT INTO submissions
        (id, endpoint_id, idempotency_key, payload, payload_hash, submitted_by, created_at, event_id, event_type,
         ordering_key, trace_context)
    SELECT submission_id, endpoint_id, NULL, $4, $5, $6, $7, $8, $9, $10, $11 FROM targets
)
INSERT INTO webhook_deliveries
    (id, submission_id, endpoint_id, state, cycle_attempts, next_attempt_at, created_at, updated_at,
     event_type, ordering_key)
SELECT delivery_id, submission_id, endpoint_id, 'pending', 0, $7, $7, $7, $9, $10 FROM targets";

/// Rows per statement when fanning out on SQLite (its limit on bound parameters).
const SQLITE_CHUNK: usize = 500;

/// What a sender publishes.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// The type endpoints subscribe to.
    pub event_type: String,
    /// Any JSON value; each webhook's body.
    pub payload: serde_json::Value,
    /// Makes retries safe, per API key.
    pub idempotency_key: Option<String>,
    /// Lines each delivery up behind the endpoint's earlier ones with the same key.
    pub ordering_key: Option<String>,
}

/// The answer to `publish`.
#[derive(Debug, Clone)]
pub struct PublishOutcome {
    /// False when an earlier event with the same key and content was returned.
    pub created: bool,
    /// The event (new, or the earlier one).
    pub event: event::Model,
    /// Deliveries this call created (none when `created` is false).
    pub deliveries: usize,
}

/// Event operations.
#[derive(Clone, Debug)]
pub struct Fanout {
    db: Db,
    access: Access,
    bus: ChangeBus,
    intake: Intake,
}

impl Fanout {
    /// Event operations on `db`, through `intake`; `bus` carries the deliveries' creation.
    pub fn new(db: Db, access: Access, bus: ChangeBus, intake: Intake) -> Self {
        Fanout {
            db,
            access,
            bus,
            intake,
        }
    }

    /// Publishes an event: stores it and fans it out to every matching endpoint in one
    /// transaction (all of it or none of it), or answers with the earlier event that holds
    /// the same idempotency key. Counts once against the caller's rate limit.
    #[tracing::instrument(level = "debug", skip_all, fields(event_type = %input.event_type))]
    pub async fn publish(&self, caller: &Identity, input: NewEvent) -> Result<PublishOutcome> {
        let event_type = event_types::validate(&input.event_type)?;
        if operational::is_reserved(&event_type) {
            return Err(Error::bad_input(format!(
                "event types beginning with `{}` are Courier's own operational events",
                operational::RESERVED_PREFIX
            )));
        }
        let ordering_key = input
            .ordering_key
            .as_deref()
            .map(lines::validate)
            .transpose()?;
        let accepted = self
            .intake
            .accept(
                caller,
                input.idempotency_key,
                input.payload,
                PayloadFrom::Caller,
            )
            .await?;
        let (key, payload, hash) = (accepted.key, accepted.payload, accepted.hash);
        if let Some(key) = &key {
            if let Some(existing) = self.find_by_key(caller.key_id, key).await? {
                return self.answer_existing(existing, &event_type, &hash, &ordering_key);
            }
        }
        lines::refuse_reserved(ordering_key.as_deref())?;

        let event = event::Model {
            id: crate::db::ids::new_id(),
            event_type,
            idempotency_key: key.clone(),
            payload,
            payload_hash: hash,
            published_by: caller.key_id,
            created_at: db::now(),
            ordering_key,
            trace_context: telemetry::context::current_trace_context(),
        };
        match self.fan_out(caller, &event).await? {
            Some((event, deliveries)) => {
                self.intake.stored(SubmissionOutcome::Published, deliveries);
                tracing::info!(event_id = %event.id, event_type = %event.event_type, deliveries, "event published");
                Ok(PublishOutcome {
                    created: true,
                    event,
                    deliveries,
                })
            }
            None => {
                // The key was taken by a publish that committed first: read it afresh.
                let key = key.unwrap_or_default();
                let winner =
                    self.find_by_key(caller.key_id, &key)
                        .await?
                        .ok_or(Error::Database(sea_orm::DbErr::RecordNotFound(
                            "the event that won the idempotency race".into(),
                        )))?;
                self.answer_existing(
                    winner,
                    &event.event_type,
                    &event.payload_hash,
                    &event.ordering_key,
                )
            }
        }
    }

    /// Writes the event and its fan-out in one transaction (under the race policy, so it may
    /// run again after a serialization failure). `None`: the idempotency key was taken, and
    /// nothing was written. Returns the event as stored (with the database's time) and how
    /// many deliveries it made.
    async fn fan_out(
        &self,
        caller: &Identity,
        event: &event::Model,
    ) -> Result<Option<(event::Model, usize)>> {
        let db = &self.db;
        let stored = db
            .transaction(|txn| async move {
                let inserted = txn
                    .query_one_raw(db.clock().statement(
                        INSERT_EVENT,
                        [
                            event.id.into(),
                            event.event_type.clone().into(),
                            event.idempotency_key.clone().into(),
                            event.payload.clone().into(),
                            event.payload_hash.clone().into(),
                            event.published_by.into(),
                            event.ordering_key.clone().into(),
                            event.trace_context.clone().into(),
                        ],
                    ))
                    .await?;
                let Some(inserted) = inserted else {
                    return Ok(None);
                };
                let mut event = event.clone();
                event.created_at = inserted.try_get("", "created_at")?;
                let targets = self.targets(&*txn, caller, &event.event_type).await?;
                let rows = fan_out_rows(&event, targets);
                insert_fan_out(&*txn, db.backend(), &event, &rows).await?;
                let created = rows.iter().map(|row| row.created.clone()).collect();
                let staged = self.bus.stage(&*txn, created).await?;
                Ok(Some((event, rows.len(), staged)))
            })
            .await?;
        Ok(stored.map(|(event, deliveries, staged)| {
            staged.committed();
            (event, deliveries)
        }))
    }

    /// The enabled endpoints subscribed to `event_type` that the caller may publish to.
    async fn targets<C: ConnectionTrait>(
        &self,
        txn: &C,
        caller: &Identity,
        event_type: &str,
    ) -> std::result::Result<Vec<Uuid>, sea_orm::DbErr> {
        let backend = self.db.backend();
        let statement = match backend {
            DbBackend::Postgres => {
                let (listed, tenant) = match caller.visible() {
                    Visible::Everything => (None, None),
                    Visible::Endpoints(scope) => (Some(scope), None),
                    Visible::Tenant(tenant) => (None, Some(tenant)),
                };
                let scope = Value::Array(
                    sea_orm::sea_query::ArrayType::Uuid,
                    listed.map(|scope| Box::new(scope.iter().map(|id| Value::from(*id)).collect())),
                );
                Statement::from_sql_and_values(
                    backend,
                    TARGETS_POSTGRES,
                    [event_type.into(), scope, tenant.into()],
                )
            }
            _ => Statement::from_sql_and_values(backend, TARGETS_SQLITE, [event_type.into()]),
        };
        let rows = txn.query_all_raw(statement).await?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: Uuid = row.try_get("", "id")?;
            let tenant: Option<Uuid> = row.try_get("", "tenant_id")?;
            // SQLite has no array parameter; the scope is applied to the few rows read.
            if self.access.allows_known(caller, id, tenant) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    async fn find_by_key(&self, publisher: Uuid, key: &str) -> Result<Option<event::Model>> {
        Ok(event::Entity::find()
            .filter(event::Column::PublishedBy.eq(publisher))
            .filter(event::Column::IdempotencyKey.eq(key))
            .one(self.db.conn())
            .await?)
    }

    /// Same type, content and ordering key: the earlier event, `created: false`. Otherwise
    /// a conflict.
    fn answer_existing(
        &self,
        existing: event::Model,
        event_type: &str,
        hash: &str,
        ordering_key: &Option<String>,
    ) -> Result<PublishOutcome> {
        self.intake.repeat(
            existing.event_type == event_type
                && existing.payload_hash == hash
                && existing.ordering_key == *ordering_key,
        )?;
        Ok(PublishOutcome {
            created: false,
            event: existing,
            deliveries: 0,
        })
    }

    /// One event, if it exists and the caller may see it: admins see every event, a
    /// partner the events it published and those delivered to an endpoint in its scope.
    /// A partner makes the same reads whether or not the event exists, so that the
    /// refusal's time does not tell that it does.
    pub async fn get(&self, caller: &Identity, id: Uuid) -> Result<Option<event::Model>> {
        let found = self.load(id).await?;
        let Some(in_scope) = Access::endpoint_condition(caller, submission::Column::EndpointId)
        else {
            return Ok(found);
        };
        if found
            .as_ref()
            .is_some_and(|found| found.published_by == caller.key_id)
        {
            return Ok(found);
        }
        let reached = submission::Entity::find()
            .filter(submission::Column::EventId.eq(id))
            .filter(in_scope)
            .one(self.db.conn())
            .await?;
        match (found, reached) {
            (Some(found), Some(_)) => Ok(Some(found)),
            _ => Err(EVENT_OUTSIDE),
        }
    }

    /// One event by id, with no scope check: for fields of rows already checked.
    pub async fn load(&self, id: Uuid) -> Result<Option<event::Model>> {
        Ok(event::Entity::find_by_id(id).one(self.db.conn()).await?)
    }

    /// The events with these ids, with no scope check.
    pub async fn load_many(&self, ids: &[Uuid]) -> Result<Vec<event::Model>> {
        use sea_orm::{ColumnTrait, QueryFilter};
        Ok(event::Entity::find()
            .filter(event::Column::Id.is_in(ids.iter().copied()))
            .all(self.db.conn())
            .await?)
    }
}

/// One submission, its `pending` delivery (due when the event was stored) and its creation
/// event per endpoint the event reaches: the rows `submit` would write, built the same way.
pub fn fan_out_rows(event: &event::Model, targets: Vec<Uuid>) -> Vec<Prepared> {
    targets
        .into_iter()
        .map(|endpoint_id| {
            prepare(NewRows {
                submission: submission::Model {
                    id: crate::db::ids::new_id(),
                    endpoint_id,
                    idempotency_key: None,
                    // The event holds the payload, once however many endpoints it
                    // reaches; its submissions keep a JSON null in its place.
                    payload: serde_json::Value::Null,
                    payload_hash: event.payload_hash.clone(),
                    submitted_by: Some(event.published_by),
                    created_at: event.created_at,
                    event_id: Some(event.id),
                    event_type: Some(event.event_type.clone()),
                    ordering_key: event.ordering_key.clone(),
                    trace_context: event.trace_context.clone(),
                },
                delivery_id: crate::db::ids::new_id(),
            })
        })
        .collect()
}

/// Inserts every submission and its `pending` delivery, due now (each with an ordering
/// key entering its line), and wakes the endpoints: the fan-out of `publish` and of
/// Courier's operational events.
pub async fn insert_fan_out<C: ConnectionTrait>(
    txn: &C,
    backend: DbBackend,
    event: &event::Model,
    rows: &[Prepared],
) -> std::result::Result<(), sea_orm::DbErr> {
    if rows.is_empty() {
        return Ok(());
    }
    match backend {
        DbBackend::Postgres => {
            let submission_ids: Vec<Uuid> = rows.iter().map(|row| row.submission.id).collect();
            let delivery_ids: Vec<Uuid> = rows.iter().map(|row| row.delivery.id).collect();
            let endpoint_ids: Vec<Uuid> =
                rows.iter().map(|row| row.submission.endpoint_id).collect();
            txn.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                FAN_OUT_POSTGRES,
                [
                    Value::from(submission_ids),
                    Value::from(delivery_ids),
                    Value::from(endpoint_ids),
                    serde_json::Value::Null.into(),
                    event.payload_hash.clone().into(),
                    event.published_by.into(),
                    event.created_at.into(),
                    event.id.into(),
                    event.event_type.clone().into(),
                    event.ordering_key.clone().into(),
                    event.trace_context.clone().into(),
                ],
            ))
            .await?;
        }
        _ => {
            for chunk in rows.chunks(SQLITE_CHUNK) {
                submission::Entity::insert_many(
                    chunk
                        .iter()
                        .map(|row| row.submission.clone().into_active_model()),
                )
                .exec(txn)
                .await?;
                entity::webhook_delivery::Entity::insert_many(
                    chunk
                        .iter()
                        .map(|row| row.delivery.clone().into_active_model()),
                )
                .exec(txn)
                .await?;
            }
        }
    }
    if event.ordering_key.is_some() {
        let ids: Vec<Uuid> = rows.iter().map(|row| row.delivery.id).collect();
        lines::enter(txn, backend, &ids).await?;
    }
    let endpoints: Vec<Uuid> = rows.iter().map(|row| row.submission.endpoint_id).collect();
    flow::wake_endpoints(txn, backend, &endpoints).await
}
