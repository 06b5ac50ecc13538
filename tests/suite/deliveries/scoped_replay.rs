//! A bulk replay by a partner or a tenant reads its own endpoints' failures, endpoint by
//! endpoint, not every endpoint's failures looking for its own (PostgreSQL): a tenant with
//! ten failures replays them while another receiver has been down all month.

use serde_json::json;
use uuid::Uuid;

use crate::support::fixtures::{rows, V7};
use crate::support::history::tenant_key;
use crate::support::{Backend, TestApp, TestDb};

/// Failures of the receiver that was down, none of them the tenant's.
const OTHERS_FAILURES: i64 = 30_000;
/// The tenant's own failures.
const OWN_FAILURES: i64 = 10;

/// Index entries and table rows of `webhook_deliveries` read so far by this connection's
/// statements (its counts flushed first): with a pool of one connection, what the
/// instance's statements read.
async fn deliveries_read(app: &TestApp) -> i64 {
    rows(&app.state.db, "SELECT pg_stat_force_next_flush()", vec![]).await;
    rows(
        &app.state.db,
        "SELECT ((SELECT COALESCE(sum(idx_tup_read), 0) FROM pg_stat_user_indexes \
                  WHERE relname = 'webhook_deliveries') \
               + (SELECT COALESCE(seq_tup_read, 0) FROM pg_stat_user_tables \
                  WHERE relname = 'webhook_deliveries'))::int8 AS n",
        vec![],
    )
    .await[0]
        .try_get("", "n")
        .expect("a count of reads")
}

/// `count` failed deliveries of `endpoint`, failed over the last month.
async fn seed_failures(app: &TestApp, endpoint: &str, count: i64) {
    let id = |at: &str| V7.replace("{at}", at);
    let sql = format!(
        "WITH h AS (SELECT i, now() - interval '30 days' + (i * interval '30 days' / {count}) AS at
                    FROM generate_series(1, {count}) AS i),
         s AS (
           INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at)
           SELECT {sid}, '{endpoint}', '{{}}', md5(h.i::text), h.at FROM h
           RETURNING id, endpoint_id, created_at)
         INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts,
                                         created_at, updated_at)
         SELECT {did}, s.id, s.endpoint_id, 'failed', 8, s.created_at, s.created_at FROM s",
        sid = id("h.at"),
        did = id("s.created_at"),
    );
    rows(&app.state.db, &sql, vec![]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_bulk_replay_reads_its_own_failures_not_everyones() {
    let db = TestDb::new(Backend::Postgres).await;
    // One connection, so that the statistics of its statements are the replay's reads.
    let app = TestApp::spawn_on(db.connect(1).await, |_| {}).await;
    let admin = app.admin_token().await;
    let (down, _) = app
        .create_endpoint(&admin, "https://example.com/down")
        .await;
    let tenant = courier::service::tenants::create(&app.state.db, "acme")
        .await
        .expect("a tenant")
        .id;
    let (own, _) = app
        .create_endpoint(&admin, "https://example.com/acme")
        .await;
    rows(
        &app.state.db,
        &format!("UPDATE endpoints SET tenant_id = '{tenant}' WHERE id = '{own}'"),
        vec![],
    )
    .await;
    // A partner's key limited to a list: the same walk, through the list.
    let (listed, _) = app
        .create_endpoint(&admin, "https://example.com/listed")
        .await;
    seed_failures(&app, &down, OTHERS_FAILURES).await;
    seed_failures(&app, &own, OWN_FAILURES).await;
    seed_failures(&app, &listed, OWN_FAILURES).await;
    rows(&app.state.db, "VACUUM ANALYZE", vec![]).await;
    let key = tenant_key(&app, tenant).await;
    let listed_id = Uuid::parse_str(&listed).expect("an endpoint id");
    let partner = app.token(courier::auth::Role::Partner, &[listed_id]).await;
    for (who, token) in [("the tenant's key", &key), ("a partner's list", &partner)] {
        let before = deliveries_read(&app).await;
        let answer = app
            .graphql(
                token,
                "mutation { replayDeliveries(filter: {}) { replayed } }",
                json!({}),
            )
            .await;
        let read = deliveries_read(&app).await - before;
        assert_eq!(
            answer["data"]["replayDeliveries"]["replayed"], OWN_FAILURES,
            "{who}: {answer}"
        );
        assert!(
            read < 1_000,
            "{who}: replaying {OWN_FAILURES} failures read {read} deliveries \
             ({OTHERS_FAILURES} other failures)"
        );
    }
    // The other receiver's failures were not touched.
    let untouched = rows(
        &app.state.db,
        &format!(
            "SELECT count(*)::int8 AS n FROM webhook_deliveries \
             WHERE endpoint_id = '{down}' AND state = 'failed'"
        ),
        vec![],
    )
    .await[0]
        .try_get::<i64>("", "n")
        .expect("a count");
    assert_eq!(untouched, OTHERS_FAILURES);
}
