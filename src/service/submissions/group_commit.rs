//! Group commit for submissions on PostgreSQL. Each stored submission publishes its
//! creation with a `NOTIFY` in the same commit (so events keep commit order), and
//! PostgreSQL serialises the commits of notifying transactions. Writing the submissions
//! that arrive together in one statement makes that one commit for many: the same
//! guarantees per submission, far fewer serialised commits under load, and no waiting
//! when the service is quiet (a batch is whatever is queued, never a timer).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use entity::{submission, webhook_delivery};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, EntityTrait, RuntimeErr, Statement, Value};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::bus::{ChangeBus, CHANGES_CHANNEL};
use crate::db::parking::with_parking;
use crate::db::{is_unavailable, Db};
use crate::error::{error_chain, Error};
use crate::metrics::Metrics;
use crate::service::flow;
use crate::service::submissions::store::{prepare, stamp, store, NewRows, Prepared, Stored};

/// Most submissions written in one statement.
const MAX_BATCH: usize = 64;

/// Many submissions, their deliveries and their `NOTIFY`s in one statement. Rows for
/// unknown or disabled endpoints are skipped (the endpoints read under the parking rule's
/// share lock, as for one submission); a row whose idempotency key is already taken (by an
/// earlier submission, or by another row of the batch) is skipped too, and its caller then
/// reads the winner. Every valid row comes back, saying whether it was stored and when, on
/// the database's clock. The endpoints' turns are woken if they slept (see
/// [`crate::service::flow`]).
const STORE_MANY: &str = "\
WITH input (submission_id, delivery_id, endpoint_id, idempotency_key, payload, payload_hash,
            submitted_by, event, event_type) AS (VALUES {rows}),
valid AS (
    SELECT input.* FROM input {enabled_join(input.endpoint_id)} {lock_enabled}
), stored_submissions AS (
    INSERT INTO submissions
        (id, endpoint_id, idempotency_key, payload, payload_hash, submitted_by, created_at, event_type)
    SELECT submission_id, endpoint_id, idempotency_key, payload, payload_hash, submitted_by,
           {now}, event_type
    FROM valid
    ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
    RETURNING id, created_at
), stored_deliveries AS (
    INSERT INTO webhook_deliveries
        (id, submission_id, endpoint_id, state, cycle_attempts, next_attempt_at, created_at, updated_at)
    SELECT valid.delivery_id, valid.submission_id, valid.endpoint_id, 'pending', 0,
           s.created_at, s.created_at, s.created_at
    FROM valid JOIN stored_submissions s ON s.id = valid.submission_id
    RETURNING id, endpoint_id, created_at
), woken AS (
    {wake}
)
SELECT valid.delivery_id AS id,
       stored_deliveries.id IS NOT NULL AS stored,
       stored_deliveries.created_at,
       CASE WHEN stored_deliveries.id IS NOT NULL
            THEN pg_notify($1, jsonb_set(valid.event::jsonb, '{t}',
                                         to_jsonb(stored_deliveries.created_at))::text)
       END AS notified
FROM valid LEFT JOIN stored_deliveries ON stored_deliveries.id = valid.delivery_id";

/// Which of these deliveries exist. After a write whose answer was lost (its connection
/// dropped after the statement was sent), the ids minted before writing tell whether it
/// committed, so it is never written twice nor reported failed when it was stored.
const EXISTING_DELIVERIES: &str = "SELECT id FROM webhook_deliveries WHERE id = ANY($1::uuid[])";

struct Job {
    rows: NewRows,
    reply: oneshot::Sender<Result<Stored, Error>>,
}

/// Hands submissions to the group-commit task (PostgreSQL), or stores them directly.
#[derive(Clone, Debug)]
pub struct SubmitBatcher {
    db: Db,
    bus: ChangeBus,
    metrics: Arc<Metrics>,
    jobs: Option<mpsc::Sender<Job>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").finish_non_exhaustive()
    }
}

impl SubmitBatcher {
    /// On PostgreSQL, starts the group-commit task (it ends when the last handle is dropped).
    pub fn start(db: Db, bus: ChangeBus, metrics: Arc<Metrics>) -> Self {
        let jobs = (db.backend() == DbBackend::Postgres).then(|| {
            let (jobs, inbox) = mpsc::channel(MAX_BATCH * 4);
            let writer = Writer {
                db: db.clone(),
                bus: bus.clone(),
                metrics: metrics.clone(),
            };
            tokio::spawn(writer.run(inbox));
            jobs
        });
        SubmitBatcher {
            db,
            bus,
            metrics,
            jobs,
        }
    }

    /// Stores one submission (see [`store`]), possibly in a statement with others. A taken
    /// idempotency key is [`Error::UniqueViolation`].
    pub async fn store(&self, rows: NewRows) -> Result<Stored, Error> {
        let Some(jobs) = &self.jobs else {
            return Ok(store(&self.db, &self.bus, rows).await?);
        };
        let (reply, answer) = oneshot::channel();
        let queued = Queued::new(&self.metrics);
        if let Err(mpsc::error::SendError(job)) = jobs.send(Job { rows, reply }).await {
            return store_checked(&self.db, &self.bus, job.rows).await;
        }
        // The writer counts it out when it takes it.
        std::mem::forget(queued);
        answer
            .await
            .map_err(|_| Error::Database(DbErr::Custom("the submission writer stopped".into())))?
    }
}

/// Counts a submission as queued until it is handed to the writer, or given up on (its
/// caller went away, or the writer stopped).
struct Queued<'a>(&'a Metrics);

impl<'a> Queued<'a> {
    fn new(metrics: &'a Metrics) -> Self {
        metrics.submissions_queued.inc();
        Queued(metrics)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.submissions_queued.dec();
    }
}

/// The group-commit task.
struct Writer {
    db: Db,
    bus: ChangeBus,
    metrics: Arc<Metrics>,
}

impl Writer {
    /// Writes what arrives until every handle is gone.
    async fn run(self, mut inbox: mpsc::Receiver<Job>) {
        let mut jobs = Vec::with_capacity(MAX_BATCH);
        while inbox.recv_many(&mut jobs, MAX_BATCH).await > 0 {
            self.metrics.submissions_queued.dec_by(jobs.len() as i64);
            if jobs.len() == 1 {
                if let Some(job) = jobs.pop() {
                    let stored = store_checked(&self.db, &self.bus, job.rows).await;
                    let _ = job.reply.send(stored);
                }
                continue;
            }
            self.write_group(std::mem::take(&mut jobs)).await;
        }
    }

    /// Writes `batch` in one statement, within the database deadline (one writer stuck on a
    /// silent connection would otherwise hold every submission), and answers each caller.
    async fn write_group(&self, batch: Vec<Job>) {
        let db = &self.db;
        let prepared: Vec<Prepared> = batch.iter().map(|job| prepare(job.rows.clone())).collect();
        self.metrics.submission_group_writes.inc();
        self.metrics
            .submission_group_rows
            .inc_by(prepared.len() as u64);
        let err = match db.within_deadline(store_many(db, &prepared)).await {
            Ok(valid) => {
                self.count_duplicates(&prepared, &valid);
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
                return;
            }
            Err(err) => err,
        };
        // Unless the server refused the statement, it may have committed even so (its answer
        // lost with its connection): look for its rows by the ids minted before writing.
        let ids: Vec<Uuid> = prepared.iter().map(|rows| rows.delivery.id).collect();
        let existing = if may_have_committed(&err) {
            db.within_deadline(existing_deliveries(db, &ids)).await
        } else {
            Ok(HashSet::new())
        };
        let existing = match existing {
            Ok(existing) => existing,
            Err(check) => {
                // Unknown whether the statement committed: every caller retries (with its
                // idempotency key, where it has one).
                tracing::warn!(error = %error_chain(&err), check = %error_chain(&check), size = batch.len(),
                    "group write failed and its outcome cannot be read");
                for job in batch {
                    let _ = job.reply.send(Err(Error::from(err.clone())));
                }
                return;
            }
        };
        if existing.is_empty() {
            tracing::warn!(error = %error_chain(&err), size = batch.len(), "group write failed; writing one by one");
        } else {
            tracing::warn!(error = %error_chain(&err), size = batch.len(),
                "group write committed but its answer was lost");
        }
        for (job, rows) in batch.into_iter().zip(prepared) {
            if existing.contains(&rows.delivery.id) {
                let _ = job.reply.send(Ok(Some((rows.submission, rows.delivery))));
            } else if !job.reply.is_closed() {
                // Not written: each on its own, so each caller gets its own answer.
                let stored = store_checked(db, &self.bus, job.rows).await;
                let _ = job.reply.send(stored);
            }
        }
    }

    /// Counts the rows of a group whose idempotency key another row of the same group took.
    fn count_duplicates(
        &self,
        prepared: &[Prepared],
        valid: &HashMap<Uuid, Option<DateTime<Utc>>>,
    ) {
        let stored_keys: HashSet<(Uuid, &str)> = prepared
            .iter()
            .filter(|rows| valid.get(&rows.delivery.id).is_some_and(Option::is_some))
            .filter_map(|rows| {
                let s = &rows.submission;
                Some((s.endpoint_id, s.idempotency_key.as_deref()?))
            })
            .collect();
        let duplicates = prepared
            .iter()
            .filter(|rows| valid.get(&rows.delivery.id) == Some(&None))
            .filter(|rows| {
                let s = &rows.submission;
                s.idempotency_key
                    .as_deref()
                    .is_some_and(|key| stored_keys.contains(&(s.endpoint_id, key)))
            })
            .count();
        self.metrics
            .submission_group_duplicates
            .inc_by(duplicates as u64);
    }
}

/// Stores one submission within the database deadline. If that fails, its delivery is
/// looked up by its pre-minted id: found, the write committed and only its answer was lost.
async fn store_checked(db: &Db, bus: &ChangeBus, rows: NewRows) -> Result<Stored, Error> {
    let (submission_id, delivery_id) = (rows.submission.id, rows.delivery_id);
    let err = match db.within_deadline(store(db, bus, rows)).await {
        Ok(stored) => return Ok(stored),
        Err(err) if !may_have_committed(&err) => return Err(Error::from(err)),
        Err(err) => err,
    };
    let found = db
        .within_deadline(async {
            if !existing_deliveries(db, &[delivery_id]).await?.is_empty() {
                let submission = submission::Entity::find_by_id(submission_id)
                    .one(db.conn())
                    .await?;
                let delivery = webhook_delivery::Entity::find_by_id(delivery_id)
                    .one(db.conn())
                    .await?;
                return Ok(submission.zip(delivery));
            }
            Ok::<_, DbErr>(None)
        })
        .await;
    match found {
        Ok(Some(stored)) => {
            tracing::warn!(error = %error_chain(&err), %delivery_id, "submission committed but its answer was lost");
            Ok(Some(stored))
        }
        _ => Err(Error::from(err)),
    }
}

/// Whether a failed write may have committed anyway: anything but an error the server
/// reported for the statement (which rolled it back), e.g. a connection lost after the
/// statement was sent, a deadline, or an answer that could not be read.
fn may_have_committed(err: &DbErr) -> bool {
    let refused = matches!(
        err,
        DbErr::Exec(RuntimeErr::SqlxError(cause)) | DbErr::Query(RuntimeErr::SqlxError(cause))
            if matches!(cause.as_ref(), sqlx::Error::Database(_))
    );
    let never_sent = matches!(err, DbErr::ConnectionAcquire(_));
    !never_sent && (!refused || is_unavailable(err))
}

/// The ids among `ids` whose deliveries exist.
async fn existing_deliveries(db: &Db, ids: &[Uuid]) -> Result<HashSet<Uuid>, DbErr> {
    db.conn()
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            EXISTING_DELIVERIES,
            [Value::from(ids.to_vec())],
        ))
        .await?
        .iter()
        .map(|row| row.try_get::<Uuid>("", "id"))
        .collect()
}

/// Writes `prepared` in one statement, in one transaction under the race policy. Returns,
/// for each submission whose endpoint is valid, when it was stored (`None`: its
/// idempotency key was taken), by delivery id.
async fn store_many(
    db: &Db,
    prepared: &[Prepared],
) -> Result<HashMap<Uuid, Option<DateTime<Utc>>>, DbErr> {
    const COLUMNS: usize = 9;
    let mut values: Vec<Value> = Vec::with_capacity(1 + prepared.len() * COLUMNS);
    values.push(CHANGES_CHANNEL.into());
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
            Value::from(s.event_type.clone()),
        ]);
        rows.push(format!("({})", Db::placeholders(2 + n * COLUMNS, COLUMNS)));
    }
    let sql = with_parking(DbBackend::Postgres, STORE_MANY)
        .replace("{rows}", &rows.join(", "))
        .replace(
            "{wake}",
            &flow::wake(
                DbBackend::Postgres,
                "SELECT endpoint_id FROM stored_deliveries",
            ),
        );
    let (sql, values) = (&sql, &values);
    // One statement, committed on its own: one round trip for the whole group.
    let stored = db
        .autocommit(|| db.clock().statement(sql, values.iter().cloned()))
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
