//! Fixtures many test files share: GraphQL submissions, quick worker settings, waiting for
//! the workers to settle, the one polling helper, raw counts, and recording outcomes
//! directly for the claim tests.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::config::ServeArgs;
use courier::db::Db;
use courier::worker::claim::Claim;
use courier::worker::dispatch::{AttemptOutcome, OutcomeKind};
use courier::worker::health::HealthPolicy;
use courier::worker::record::{record, FinishedAttempt};
use courier::worker::schedule::NextStep;
use sea_orm::{
    ConnectionTrait, EntityTrait, PaginatorTrait, QueryOrder, QueryResult, Statement,
    TransactionTrait, Value as SqlValue,
};
use serde_json::{json, Value};

use uuid::Uuid;

use super::{Receiver, TestApp, TestDb};

pub const SUBMIT: &str = "mutation($input: SubmitInput!) { submit(input: $input) { created submission { id idempotencyKey payload endpoint { id } delivery { id } } delivery { id state cycleAttempts nextAttemptAt } } }";

/// Submits and returns the whole response body.
pub async fn submit(
    app: &TestApp,
    token: &str,
    endpoint_id: &str,
    payload: Value,
    key: Option<&str>,
) -> Value {
    let input = json!({ "endpointId": endpoint_id, "payload": payload, "idempotencyKey": key });
    app.graphql(token, SUBMIT, json!({ "input": input })).await
}

/// [`quick_worker`], with a delivery failing at its first refused attempt and the endpoint
/// staying enabled however many fail.
pub fn failing_at_once(config: &mut ServeArgs) {
    quick_worker(config);
    config.max_attempts = Some(1);
    config.disable_after_failures = 0;
}

/// Worker settings that make tests quick: fast polling, short backoff, three attempts.
pub fn quick_worker(config: &mut ServeArgs) {
    config.worker_concurrency = 8;
    config.poll_interval_ms = 50;
    config.retry_base_ms = Some(50);
    config.retry_max_ms = 2_000;
    config.max_attempts = Some(3);
    config.request_timeout_ms = 2_000;
    config.lease_secs = 10;
    config.shutdown_grace_secs = 5;
}

/// [`quick_worker`], polling only every ten minutes, with leases as long (a claim that
/// leaves an endpoint asleep looks again when they run out): only wake-ups move its work,
/// for tests that a change wakes the worker at once.
pub fn rarely_polling_worker(config: &mut ServeArgs) {
    quick_worker(config);
    config.poll_interval_ms = 600_000;
    config.lease_secs = 600;
}

/// For "never sent twice" checks, before counting what a receiver got: waits until no
/// delivery is due or held by a claim, gives the workers a few more polls (anything they
/// should not claim, they would claim now), then stops them, which lets every request
/// already on its way arrive. A duplicate can only come later than this from a lease
/// retaken after it expired, and a delivery that is settled holds no lease.
pub async fn settle(apps: impl IntoIterator<Item = TestApp>) {
    let apps: Vec<TestApp> = apps.into_iter().collect();
    let db = &apps[0].state.db;
    poll(
        "every delivery settles",
        Duration::from_secs(20),
        || async {
            let open = count(
                db,
                "SELECT COUNT(*) AS n FROM webhook_deliveries \
             WHERE state = 'processing' OR (state = 'pending' AND next_attempt_at IS NOT NULL)",
                vec![],
            )
            .await;
            if open == 0 {
                Ok(())
            } else {
                Err(format!("({open} open)"))
            }
        },
    )
    .await;
    for app in apps
        .iter()
        .filter(|app| app.state.config.worker_concurrency > 0)
    {
        worker_looks(app, 3).await;
    }
    for app in apps {
        app.stop().await;
    }
}

/// Waits until the claiming loop has finished its first round (at start-up, which a
/// loaded machine can stretch past the first few requests) and then made no round for
/// 100 ms (at most 5 s).
pub async fn loop_at_rest(app: &TestApp) {
    let rounds = &app.state.metrics.claim_rounds;
    eventually(
        "the claiming loop's first round",
        Duration::from_secs(10),
        || async { rounds.get() > 0 },
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let before = rounds.get();
        tokio::time::sleep(Duration::from_millis(100)).await;
        if rounds.get() == before || tokio::time::Instant::now() > deadline {
            return;
        }
    }
}

/// Waits until `app`'s worker has committed `rounds` more claim transactions than when
/// this was called: proof that it looked for work, for a check that nothing was sent to
/// wait on instead of the clock.
pub async fn worker_looks(app: &TestApp, rounds: u64) {
    let claims = &app.state.metrics.claim_rounds;
    let from = claims.get();
    eventually(
        "the worker looks for work",
        Duration::from_secs(20),
        || async { claims.get() >= from + rounds },
    )
    .await;
}

/// Waits until `check` holds, or panics naming `what` after `timeout`.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll(what, timeout, || {
        let checked = check();
        async move {
            if checked.await {
                Ok(())
            } else {
                Err(String::new())
            }
        }
    })
    .await
}

/// The suite's one polling loop: runs `check` every 50 ms until it yields a value, or
/// panics after `timeout` naming `what` and what `check` last saw.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match check().await {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(Instant::now() < deadline, "never happened: {what} {seen}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `COUNT(*) AS n` query's count.
pub async fn count(db: &Db, sql: &str, values: Vec<SqlValue>) -> i64 {
    rows(db, sql, values).await[0]
        .try_get::<i64>("", "n")
        .expect("a count")
}

/// Runs one SQL statement and returns its rows.
pub async fn rows(db: &Db, sql: &str, values: Vec<SqlValue>) -> Vec<QueryResult> {
    db.conn()
        .query_all_raw(Statement::from_sql_and_values(db.backend(), sql, values))
        .await
        .expect("query")
}

pub const LONG_LEASE: Duration = Duration::from_secs(60);

/// A publisher for changes made through `pool` (nobody subscribes in these tests).
pub fn events_for(pool: &Db) -> courier::bus::ChangeBus {
    courier::bus::ChangeBus::new(
        pool.backend(),
        Arc::new(courier::metrics::Metrics::default()),
    )
}

pub fn outcome(succeeded: bool) -> AttemptOutcome {
    AttemptOutcome {
        status: Some(if succeeded { 200 } else { 500 }),
        error: (!succeeded).then(|| "HTTP 500".to_owned()),
        retry_after: None,
        duration: Duration::from_millis(3),
        kind: if succeeded {
            OutcomeKind::Success
        } else {
            OutcomeKind::HttpStatus
        },
        answer: None,
    }
}

pub async fn record_result(
    pool: &Db,
    claim: &Claim,
    succeeded: bool,
) -> courier::worker::record::Recorded {
    let outcome = outcome(succeeded);
    let step = if succeeded {
        NextStep::Delivered
    } else {
        NextStep::RetryAfter(Duration::from_secs(1))
    };
    let now = courier::db::now();
    record(
        pool,
        &events_for(pool),
        HealthPolicy::default(),
        &[FinishedAttempt {
            claim: claim.clone(),
            outcome,
            step,
            started_at: now,
            finished_at: now,
        }],
    )
    .await
    .expect("record")
    .pop()
    .expect("one result per attempt")
}

pub const ATTEMPT_FIELDS: &str =
    "number statusCode error superseded startedAt finishedAt durationMs responseBody responseHeaders";

/// Creates an endpoint on `receiver` at `path` and teaches the receiver its secret.
pub async fn endpoint_on(app: &TestApp, admin: &str, receiver: &Receiver, path: &str) -> String {
    let (id, secret) = app.create_endpoint(admin, &receiver.url(path)).await;
    receiver.set_secret(path, &secret);
    id
}

/// Polls a delivery until it reaches `state` and returns it with its attempts.
pub async fn wait_for_state(
    app: &TestApp,
    admin: &str,
    delivery_id: &str,
    state: &str,
    timeout: Duration,
) -> Value {
    let query = format!("query($id: ID!) {{ delivery(id: $id) {{ id state cycleAttempts lastError nextAttemptAt attempts {{ {ATTEMPT_FIELDS} }} }} }}");
    let (query, variables) = (&query, json!({ "id": delivery_id }));
    poll(&format!("delivery reaches {state}"), timeout, || async {
        let body = app.graphql(admin, query, variables.clone()).await;
        let delivery = &body["data"]["delivery"];
        if delivery["state"] == state {
            Ok(delivery.clone())
        } else {
            Err(body.to_string())
        }
    })
    .await
}

pub fn delivery_id(submitted: &Value) -> String {
    submitted["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{submitted}"))
        .to_owned()
}

/// `(submissions, deliveries)` stored.
pub async fn row_counts(app: &TestApp) -> (u64, u64) {
    let conn = app.state.db.conn();
    let submissions = entity::submission::Entity::find()
        .count(conn)
        .await
        .expect("count");
    let deliveries = entity::webhook_delivery::Entity::find()
        .count(conn)
        .await
        .expect("count");
    (submissions, deliveries)
}

/// Runs retention once over `db` as a process starting does (30 days, a new event sweep),
/// until nothing more is due: how many deliveries went.
pub async fn prune_expired(db: &Db) -> u64 {
    courier::worker::retention::prune(
        db,
        30,
        &courier::worker::retention::EventSweep::default(),
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .expect("pruned")
}

/// A transaction on `holder` holding endpoint `id`'s row `FOR UPDATE` (PostgreSQL): work that
/// takes the endpoint waits on it until it ends.
pub async fn lock_endpoint_row(holder: &Db, id: &str) -> sea_orm::DatabaseTransaction {
    let lock = holder.conn().begin().await.expect("begin");
    lock.execute_raw(Statement::from_sql_and_values(
        sea_orm::DbBackend::Postgres,
        "SELECT id FROM endpoints WHERE id = $1::uuid FOR UPDATE",
        [id.into()],
    ))
    .await
    .expect("lock the endpoint");
    lock
}

/// How many of `answers` to `submit` created a submission; every other one must be refused
/// with `refusal`.
pub fn created_or_refused(answers: &[Value], refusal: &str) -> usize {
    let mut created = 0;
    for answer in answers {
        if answer["data"]["submit"]["created"] == true {
            created += 1;
        } else {
            assert_eq!(
                crate::support::gql_error_code(answer),
                Some(refusal),
                "a submission neither created nor refused with {refusal}: {answer}"
            );
        }
    }
    created
}

/// How many backends of this database wait on a lock, as `observer` sees it (PostgreSQL).
pub async fn lock_waiters(observer: &Db) -> i64 {
    count(
        observer,
        "SELECT count(*) AS n FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
        vec![],
    )
    .await
}

/// Waits (10 s at most) until exactly one backend of this database waits on a lock, as
/// `observer` sees it (PostgreSQL): `what` has reached the lock a test holds.
pub async fn until_one_waits_on_a_lock(observer: &Db, what: &str) {
    eventually(what, Duration::from_secs(10), || async move {
        lock_waiters(observer).await == 1
    })
    .await;
}

/// Runs `submits` (against `app`, on PostgreSQL) so that the group writer sends them in one
/// statement: it is first held on a submission whose endpoint row another session has
/// locked, and released only once all of `submits` wait in its queue. Returns their answers.
pub async fn submit_as_one_group<F: Future<Output = Value>>(
    db: &TestDb,
    app: &TestApp,
    admin: &str,
    submits: Vec<F>,
) -> Vec<Value> {
    let count = submits.len() as i64;
    let (gate, _) = app.create_endpoint(admin, "https://example.com/gate").await;
    let holder = db.connect(2).await;
    let lock = lock_endpoint_row(&holder, &gate).await;
    let held = submit(app, admin, &gate, json!({ "gate": true }), None);
    let rest = async {
        until_one_waits_on_a_lock(&holder, "the writer waits on the lock").await;
        let release = async {
            let queued = &app.state.metrics.submissions_queued;
            eventually(
                "every submission is queued",
                Duration::from_secs(10),
                || async move { queued.get() == count },
            )
            .await;
            lock.commit().await.expect("release the gate");
        };
        futures_util::future::join(futures_util::future::join_all(submits), release)
            .await
            .0
    };
    let (gated, answers) = futures_util::future::join(held, rest).await;
    assert_eq!(gated["data"]["submit"]["created"], true, "{gated}");
    answers
}

/// The signing secret stored for an endpoint.
pub async fn stored_secret(app: &TestApp, id: &str) -> String {
    use sea_orm::EntityTrait;
    let id = uuid::Uuid::parse_str(id).expect("uuid");
    entity::endpoint::Entity::find_by_id(id)
        .one(app.state.db.conn())
        .await
        .expect("query")
        .expect("the endpoint exists")
        .signing_secret
}

/// How many endpoints are stored.
pub async fn endpoint_count(app: &TestApp) -> u64 {
    use sea_orm::{EntityTrait, PaginatorTrait};
    entity::endpoint::Entity::find()
        .count(app.state.db.conn())
        .await
        .expect("count")
}

pub const PUBLISH: &str = "mutation($input: PublishInput!) { publish(input: $input) { created event { id eventType idempotencyKey payload deliveries(first: 100) { edges { node { id state endpoint { id } submission { eventType event { id } } } } } } } }";

pub async fn publish(
    app: &TestApp,
    token: &str,
    event_type: &str,
    payload: Value,
    key: Option<&str>,
) -> Value {
    let input = json!({ "eventType": event_type, "payload": payload, "idempotencyKey": key });
    app.graphql(token, PUBLISH, json!({ "input": input })).await
}

/// Moves every lease an hour into the past, as if it had run out long ago (a `processing`
/// row's due time is its lease expiry, so both move): tests never wait on the wall clock
/// for a lease.
pub async fn expire_leases(pool: &Db) {
    use entity::webhook_delivery::{Column, Entity};
    use sea_orm::{ActiveModelTrait, ColumnTrait, IntoActiveModel, QueryFilter, Set};
    let held = Entity::find()
        .filter(Column::ClaimExpiresAt.is_not_null())
        .all(pool.conn())
        .await
        .expect("leased deliveries");
    assert!(!held.is_empty(), "a lease to expire");
    for row in held {
        let hour = chrono::Duration::hours(1);
        let expires = row.claim_expires_at.expect("a lease");
        let due = row.next_attempt_at.map(|due| due - hour);
        let mut row = row.into_active_model();
        row.claim_expires_at = Set(Some(expires - hour));
        row.next_attempt_at = Set(due);
        row.update(pool.conn()).await.expect("expire the lease");
    }
    // A lease that ran out is due at its expiry, which the endpoint's turn already waits
    // for; moved into the past by hand, the backstop sweep finds it.
    courier::worker::turns::sweep(pool, courier::worker::claim::DEFAULT_MAX_IN_FLIGHT)
        .await
        .expect("sweep");
}

pub async fn delivery(pool: &Db, id: Uuid) -> entity::webhook_delivery::Model {
    entity::webhook_delivery::Entity::find_by_id(id)
        .one(pool.conn())
        .await
        .expect("query")
        .expect("exists")
}

pub async fn attempts(pool: &Db, id: Uuid) -> Vec<entity::delivery_attempt::Model> {
    use sea_orm::{ColumnTrait, QueryFilter};
    entity::delivery_attempt::Entity::find()
        .filter(entity::delivery_attempt::Column::DeliveryId.eq(id))
        .order_by_asc(entity::delivery_attempt::Column::Number)
        .all(pool.conn())
        .await
        .expect("attempts")
}

/// A time-ordered id for `{at}` (a UUIDv7 as Courier mints them), in SQL: for seeding
/// history whose ids follow creation, as Courier's do.
pub const V7: &str = "(lpad(to_hex((extract(epoch FROM {at}) * 1000)::bigint), 12, '0') \
     || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid";

/// `counted` (an expression over `pg_stat_user_tables` columns, such as `seq_scan`) for
/// `table`, as PostgreSQL's statistics have it, this connection's own counts flushed first:
/// with a pool of one connection, what that connection's statements read.
pub async fn table_stat(db: &Db, table: &str, counted: &str) -> i64 {
    rows(db, "SELECT pg_stat_force_next_flush()", vec![]).await;
    rows(
        db,
        &format!("SELECT ({counted})::int8 AS n FROM pg_stat_user_tables WHERE relname = $1"),
        vec![table.into()],
    )
    .await[0]
        .try_get("", "n")
        .expect("a table statistic")
}

/// Asserts `answer` refused a replay or a resend with `DELIVERY_NOT_REPLAYABLE`, naming the
/// delivery's `state` (as the API spells it) and, if given, saying `message`.
pub fn assert_not_replayable(answer: &Value, state: &str, message: Option<&str>) {
    assert_eq!(
        super::gql_error_code(answer),
        Some("DELIVERY_NOT_REPLAYABLE"),
        "{answer}"
    );
    assert_eq!(
        answer["errors"][0]["extensions"]["state"], state,
        "{answer}"
    );
    if let Some(message) = message {
        assert_eq!(answer["errors"][0]["message"], message, "{answer}");
    }
}
