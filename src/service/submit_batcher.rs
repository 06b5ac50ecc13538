//! Group commit for submissions on PostgreSQL. Each stored submission publishes its
//! creation with a `NOTIFY` in the same commit (so events keep commit order), and
//! PostgreSQL serialises the commits of notifying transactions. Writing the submissions
//! that arrive together in one statement makes that one commit for many: the same
//! guarantees per submission, far fewer serialised commits under load, and no waiting
//! when the service is quiet (a batch is whatever is queued, never a timer).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Value};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::db::{is_unavailable, Db};
use crate::error::Error;
use crate::events::{Events, EVENTS_CHANNEL};
use crate::service::parking::with_parking;
use crate::service::submission_store::{prepare, stamp, store, NewRows, Prepared, Stored};

/// Most submissions written in one statement.
const MAX_BATCH: usize = 64;

/// Many submissions, their deliveries and their `NOTIFY`s in one statement. Rows for
/// unknown or disabled endpoints are skipped (the endpoints read under the parking rule's
/// share lock, as for one submission); a row whose idempotency key is already taken (by an
/// earlier submission, or by another row of the batch) is skipped too, and its caller then
/// reads the winner. Every valid row comes back, saying whether it was stored and when, on
/// the database's clock.
const STORE_MANY: &str = "\
WITH input (submission_id, delivery_id, endpoint_id, idempotency_key, payload, payload_hash,
            submitted_by, event) AS (VALUES {rows}),
valid AS (
    SELECT input.* FROM input WHERE {parked(input.endpoint_id)} = false
), stored_submissions AS (
    INSERT INTO submissions (id, endpoint_id, idempotency_key, payload, payload_hash, submitted_by, created_at)
    SELECT submission_id, endpoint_id, idempotency_key, payload, payload_hash, submitted_by, {now}
    FROM valid
    ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
    RETURNING id, created_at
), stored_deliveries AS (
    INSERT INTO webhook_deliveries
        (id, submission_id, endpoint_id, state, cycle_attempts, next_attempt_at, created_at, updated_at)
    SELECT valid.delivery_id, valid.submission_id, valid.endpoint_id, 'pending', 0,
           s.created_at, s.created_at, s.created_at
    FROM valid JOIN stored_submissions s ON s.id = valid.submission_id
    RETURNING id, created_at
)
SELECT valid.delivery_id AS id,
       stored_deliveries.id IS NOT NULL AS stored,
       stored_deliveries.created_at,
       CASE WHEN stored_deliveries.id IS NOT NULL
            THEN pg_notify($1, jsonb_set(valid.event::jsonb, '{t}',
                                         to_jsonb(stored_deliveries.created_at))::text)
       END AS notified
FROM valid LEFT JOIN stored_deliveries ON stored_deliveries.id = valid.delivery_id";

struct Job {
    rows: NewRows,
    reply: oneshot::Sender<Result<Stored, Error>>,
}

/// Hands submissions to the group-commit task (PostgreSQL), or stores them directly.
#[derive(Clone, Debug)]
pub struct SubmitBatcher {
    db: Db,
    events: Events,
    jobs: Option<mpsc::Sender<Job>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").finish_non_exhaustive()
    }
}

impl SubmitBatcher {
    /// On PostgreSQL, starts the group-commit task (it ends when the last handle is dropped).
    pub fn start(db: Db, events: Events) -> Self {
        let jobs = (db.backend() == DbBackend::Postgres).then(|| {
            let (jobs, inbox) = mpsc::channel(MAX_BATCH * 4);
            tokio::spawn(run(db.clone(), events.clone(), inbox));
            jobs
        });
        SubmitBatcher { db, events, jobs }
    }

    /// Stores one submission (see [`store`]), possibly in a statement with others. A taken
    /// idempotency key is [`Error::UniqueViolation`].
    pub async fn store(&self, rows: NewRows) -> Result<Stored, Error> {
        let Some(jobs) = &self.jobs else {
            return Ok(store(&self.db, &self.events, rows).await?);
        };
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError(job)) = jobs.send(Job { rows, reply }).await {
            return Ok(store(&self.db, &self.events, job.rows).await?);
        }
        answer
            .await
            .map_err(|_| Error::Database(DbErr::Custom("the submission writer stopped".into())))?
    }
}

/// Writes what arrives until every handle is gone. Each statement runs within the database
/// deadline: one writer stuck on a silent connection would otherwise hold every submission.
async fn run(db: Db, events: Events, mut inbox: mpsc::Receiver<Job>) {
    let mut jobs = Vec::with_capacity(MAX_BATCH);
    while inbox.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        if jobs.len() == 1 {
            if let Some(job) = jobs.pop() {
                let stored = db.within_deadline(store(&db, &events, job.rows)).await;
                let _ = job.reply.send(stored.map_err(Error::from));
            }
            continue;
        }
        let batch: Vec<Job> = std::mem::take(&mut jobs);
        let prepared: Vec<Prepared> = batch.iter().map(|job| prepare(job.rows.clone())).collect();
        match db.within_deadline(store_many(&db, &prepared)).await {
            Ok(valid) => {
                for (job, mut rows) in batch.into_iter().zip(prepared) {
                    let result = match valid.get(&rows.delivery.id) {
                        Some(Some(at)) => {
                            rows.submission.created_at = *at;
                            stamp(&mut rows.delivery, *at);
                            Ok(Some((rows.submission, rows.delivery)))
                        }
                        Some(None) => Err(Error::UniqueViolation(
                            "idempotency key already taken".into(),
                        )),
                        None => Ok(None),
                    };
                    let _ = job.reply.send(result);
                }
            }
            Err(err) if is_unavailable(&err) => {
                // Whether the statement committed is unknown, and trying each submission on
                // its own would only make every caller wait longer: they all retry.
                tracing::warn!(error = %err, size = batch.len(), "group write got no answer");
                for job in batch {
                    let _ = job.reply.send(Err(Error::from(err.clone())));
                }
            }
            Err(err) => {
                // Nothing of the statement was written: write each submission on its own,
                // so each caller gets its own answer.
                tracing::warn!(error = %err, size = batch.len(), "group write failed; writing one by one");
                for job in batch {
                    let stored = db.within_deadline(store(&db, &events, job.rows)).await;
                    let _ = job.reply.send(stored.map_err(Error::from));
                }
            }
        }
    }
}

/// Writes `prepared` in one statement, in one transaction under the race policy. Returns,
/// for each submission whose endpoint is valid, when it was stored (`None`: its
/// idempotency key was taken), by delivery id.
async fn store_many(
    db: &Db,
    prepared: &[Prepared],
) -> Result<HashMap<Uuid, Option<DateTime<Utc>>>, DbErr> {
    let mut values: Vec<Value> = Vec::with_capacity(1 + prepared.len() * 8);
    values.push(EVENTS_CHANNEL.into());
    let mut rows = Vec::with_capacity(prepared.len());
    for (n, p) in prepared.iter().enumerate() {
        let s = &p.submission;
        values.extend([
            Value::from(s.id),
            Value::from(p.delivery.id),
            Value::from(s.endpoint_id),
            Value::from(s.idempotency_key.clone()),
            Value::from(s.payload.clone()),
            Value::from(s.payload_hash.clone()),
            Value::from(s.submitted_by),
            Value::from(p.created.to_wire()?),
        ]);
        rows.push(format!("({})", Db::placeholders(2 + n * 8, 8)));
    }
    let sql = with_parking(DbBackend::Postgres, STORE_MANY).replace("{rows}", &rows.join(", "));
    let (sql, values) = (&sql, &values);
    let stored = db
        .transaction(|txn| async move {
            txn.query_all_raw(db.clock().statement(sql, values.iter().cloned()))
                .await
        })
        .await?;
    stored
        .iter()
        .map(|row| {
            let stored: bool = row.try_get("", "stored")?;
            let at: Option<DateTime<Utc>> = row.try_get("", "created_at")?;
            Ok((
                row.try_get::<Uuid>("", "id")?,
                if stored { at } else { None },
            ))
        })
        .collect()
}
