//! Group commit for submissions on PostgreSQL. Each stored submission publishes its
//! creation with a `NOTIFY` in the same commit (so events keep commit order), and
//! PostgreSQL serialises the commits of notifying transactions. Writing the submissions
//! that arrive together in one statement makes that one commit for many: the same
//! guarantees per submission, far fewer serialised commits under load, and no waiting
//! when the service is quiet (a batch is whatever is queued, never a timer).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use entity::{submission, webhook_delivery};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, EntityTrait, Statement, Value};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::bus::ChangeBus;
use crate::db::{may_have_committed, Db};
use crate::error::{error_chain, Error};
use crate::metrics::Metrics;
use crate::service::submissions::claiming::store_claiming;
use crate::service::submissions::store::{
    outcome, prepare, store, store_many, NewRows, Prepared, Reported, Stored,
};
use crate::worker::handoff::{Handoff, Reservation};

/// Most submissions written in one statement.
const MAX_BATCH: usize = 64;

/// Which of these deliveries exist. After a write whose answer was lost (its connection
/// dropped after the statement was sent), the ids minted before writing tell whether it
/// committed, so it is never written twice nor reported failed when it was stored.
const EXISTING_DELIVERIES: &str = "SELECT id FROM webhook_deliveries WHERE id = ANY($1::uuid[])";

struct Job {
    rows: NewRows,
    reply: oneshot::Sender<Result<Stored, Error>>,
}

/// Hands submissions to the group-commit task (PostgreSQL), or stores them directly. A
/// submission written alone, while the local worker has a slot to spare, claims its own
/// delivery as it is stored (see [`crate::worker::handoff`]); a group does not (under load
/// the claiming loop takes the backlog in batches, round robin).
#[derive(Clone, Debug)]
pub struct GroupCommit {
    db: Db,
    bus: ChangeBus,
    metrics: Arc<Metrics>,
    handoff: Handoff,
    jobs: Option<mpsc::Sender<Job>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// On PostgreSQL, starts the group-commit task (it ends when the last handle is dropped).
    /// Claims at submit go to the worker attached to `handoff`.
    pub fn start(db: Db, bus: ChangeBus, metrics: Arc<Metrics>, handoff: Handoff) -> Self {
        let jobs = (db.backend() == DbBackend::Postgres).then(|| {
            let (jobs, inbox) = mpsc::channel(MAX_BATCH * 4);
            let committer = Committer {
                db: db.clone(),
                bus: bus.clone(),
                metrics: metrics.clone(),
                handoff: handoff.clone(),
            };
            tokio::spawn(committer.run(inbox));
            jobs
        });
        GroupCommit {
            db,
            bus,
            metrics,
            handoff,
            jobs,
        }
    }

    /// Stores one submission (see [`store`]), possibly in a statement with others. A taken
    /// idempotency key is [`Stored::KeyTaken`].
    pub async fn store(&self, rows: NewRows) -> Result<Stored, Error> {
        let Some(jobs) = &self.jobs else {
            // Boxed: the write's future is large, and unboxed it would sit in every future
            // of the request that awaits it.
            return Ok(match self.handoff.reserve(rows.submission.endpoint_id) {
                Some(reservation) => {
                    Box::pin(store_claiming(&self.db, &self.bus, rows, reservation)).await?
                }
                None => Box::pin(store(&self.db, &self.bus, rows)).await?,
            });
        };
        let (reply, answer) = oneshot::channel();
        let queued = Queued::new(&self.metrics);
        if let Err(mpsc::error::SendError(job)) = jobs.send(Job { rows, reply }).await {
            return Box::pin(store_checked(&self.db, &self.bus, job.rows, None)).await;
        }
        // The group-commit task counts it out when it takes it.
        std::mem::forget(queued);
        answer
            .await
            .map_err(|_| Error::Database(DbErr::Custom("the group-commit task stopped".into())))?
    }
}

/// Counts a submission as queued until it is handed to the group-commit task, or given up on (its
/// caller went away, or the task stopped).
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
struct Committer {
    db: Db,
    bus: ChangeBus,
    metrics: Arc<Metrics>,
    handoff: Handoff,
}

impl Committer {
    /// Writes what arrives until every handle is gone.
    async fn run(self, mut inbox: mpsc::Receiver<Job>) {
        let mut jobs = Vec::with_capacity(MAX_BATCH);
        while inbox.recv_many(&mut jobs, MAX_BATCH).await > 0 {
            self.metrics.submissions_queued.dec_by(jobs.len() as i64);
            if jobs.len() == 1 {
                if let Some(job) = jobs.pop() {
                    let reservation = self.handoff.reserve(job.rows.submission.endpoint_id);
                    let stored = store_checked(&self.db, &self.bus, job.rows, reservation).await;
                    let _ = job.reply.send(stored);
                }
                continue;
            }
            self.write_group(std::mem::take(&mut jobs)).await;
        }
    }

    /// Writes `batch` in one statement, within the database deadline (a task stuck on a
    /// silent connection would otherwise hold every submission), and answers each caller.
    async fn write_group(&self, batch: Vec<Job>) {
        let db = &self.db;
        let prepared: Vec<Prepared> = batch.iter().map(|job| prepare(job.rows.clone())).collect();
        self.metrics.submission_group_writes.inc();
        self.metrics
            .submission_group_rows
            .inc_by(prepared.len() as u64);
        let err = match db.within_deadline(store_many(db, &prepared)).await {
            Ok(reported) => {
                self.count_duplicates(&prepared, &reported);
                for (job, rows) in batch.into_iter().zip(prepared) {
                    let id = rows.delivery.id;
                    let _ = job
                        .reply
                        .send(Ok(outcome(rows, reported.get(&id).copied())));
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
                let _ = job.reply.send(Ok(Stored::Created(
                    Box::new(rows.submission),
                    Box::new(rows.delivery),
                    false,
                )));
            } else if !job.reply.is_closed() {
                // Not written: each on its own, so each caller gets its own answer.
                let stored = store_checked(db, &self.bus, job.rows, None).await;
                let _ = job.reply.send(stored);
            }
        }
    }

    /// Counts the rows of a group whose idempotency key another row of the same group took.
    fn count_duplicates(&self, prepared: &[Prepared], reported: &HashMap<Uuid, Reported>) {
        let stored_keys: HashSet<(Uuid, &str)> = prepared
            .iter()
            .filter(|rows| matches!(reported.get(&rows.delivery.id), Some(Reported::Created(..))))
            .filter_map(|rows| {
                let s = &rows.submission;
                Some((s.endpoint_id, s.idempotency_key.as_deref()?))
            })
            .collect();
        let duplicates = prepared
            .iter()
            .filter(|rows| reported.get(&rows.delivery.id) == Some(&Reported::KeyTaken))
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

/// Stores one submission within the database deadline, claiming its delivery with
/// `reservation` if there is one. If that fails, its delivery is looked up by its
/// pre-minted id: found, the write committed and only its answer was lost (a claim it made
/// then is taken again after its lease).
async fn store_checked(
    db: &Db,
    bus: &ChangeBus,
    rows: NewRows,
    reservation: Option<Reservation>,
) -> Result<Stored, Error> {
    let (submission_id, delivery_id) = (rows.submission.id, rows.delivery_id);
    let stored = async {
        match reservation {
            Some(reservation) => Box::pin(store_claiming(db, bus, rows, reservation)).await,
            None => Box::pin(store(db, bus, rows)).await,
        }
    };
    let err = match db.within_deadline(stored).await {
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
        Ok(Some((submission, delivery))) => {
            tracing::warn!(error = %error_chain(&err), %delivery_id, "submission committed but its answer was lost");
            Ok(Stored::Created(
                Box::new(submission),
                Box::new(delivery),
                false,
            ))
        }
        _ => Err(Error::from(err)),
    }
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
