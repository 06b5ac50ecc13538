//! A claim reads its batch, not the backlog: with statistics taken over a settled history
//! while little was pending, and a generic plan (what a prepared statement settles on), a
//! backlog of due deliveries arriving afterwards must not make each claim read every due
//! row of the table.

use courier::worker::claim::claim_due;
use sea_orm::ConnectionTrait;

use crate::support::fixtures::{count, events_for, rows, LONG_LEASE};
use crate::support::seeding::seed;
use crate::support::{Backend, TestDb};

/// Settled history the statistics are taken over.
const HISTORY: i64 = 60_000;
/// Due deliveries that arrive after the statistics were taken.
const BACKLOG: i64 = 30_000;

/// `count` deliveries to the one endpoint, each with its submission, in `state`, due a
/// minute ago when pending.
fn deliveries(count: i64, state: &str) -> String {
    format!(
        "WITH s AS (
           INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at)
           SELECT gen_random_uuid(), (SELECT id FROM endpoints), jsonb_build_object('n', i),
                  md5(i::text), now()
           FROM generate_series(1, {count}) AS i
           RETURNING id, endpoint_id)
         INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts,
                                         next_attempt_at, created_at, updated_at)
         SELECT gen_random_uuid(), s.id, s.endpoint_id, '{state}', 1,
                CASE WHEN '{state}' = 'pending' THEN now() - interval '1 minute' END, now(), now()
         FROM s"
    )
}

/// Index entries of `webhook_deliveries` read so far, by every backend that has reported.
async fn index_entries_read(db: &courier::db::Db) -> i64 {
    count(
        db,
        "SELECT COALESCE(SUM(idx_tup_read), 0)::bigint AS n FROM pg_stat_user_indexes \
         WHERE relname = 'webhook_deliveries'",
        vec![],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reads_its_batch_not_a_backlog_the_statistics_never_saw() {
    let db = TestDb::new(Backend::Postgres).await;
    let name = db.url.rsplit('/').next().unwrap_or_default().to_owned();
    let admin = db.connect(1).await;
    admin
        .conn()
        .execute_unprepared(&format!(
            "ALTER DATABASE \"{name}\" SET plan_cache_mode = force_generic_plan"
        ))
        .await
        .expect("generic plans from the first execution");
    let (app, _) = seed(&db, 20).await;
    rows(&app.state.db, &deliveries(HISTORY, "delivered"), vec![]).await;
    rows(&app.state.db, "ANALYZE", vec![]).await;
    // The backlog, due now, to the same endpoint, written after the statistics.
    rows(&app.state.db, &deliveries(BACKLOG, "pending"), vec![]).await;

    // One claim on a connection of its own, which reports its statistics when it closes;
    // what the other connections did is reported within a second, before it starts.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let before = index_entries_read(&admin).await;
    let claimer = db.connect(1).await;
    let events = events_for(&claimer);
    let claims = claim_due(&claimer, &events, 10, LONG_LEASE)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 10);
    claimer.close().await.expect("close");
    let mut read = 0;
    for _ in 0..50 {
        read = index_entries_read(&admin).await - before;
        if read > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(read > 0, "the claim's statistics were never reported");
    assert!(
        read < 2_000,
        "one claim of 10 read {read} index entries of a backlog of {BACKLOG}"
    );
}
