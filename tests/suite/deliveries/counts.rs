//! `deliveryCounts` without counting history: the delivered and failed counts are kept in
//! sharded rows that recording, replaying, resending and pruning adjust in their own
//! transactions, exact however many instances record at once; the work in progress comes
//! from its partial index.

use std::collections::HashMap;
use std::time::Duration;

use courier::service::deliveries::tally::{SETTLED, UNSETTLED};
use migration::MigratorTrait;
use sea_orm::Value as SqlValue;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::on_every_backend;
use crate::support::fixtures::{count, endpoint_on, eventually, quick_worker, rows, submit};
use crate::support::{gql_error_code, Backend, Receiver, Reply, TestApp, TestDb};

const COUNTS: &str = "{ endpoints { edges { node { id deliveryCounts { pending processing delivered failed total } } } } }";
const RESEND: &str = "mutation($id: ID!) { resendDelivery(id: $id) { id } }";

/// Each endpoint's counts as the API reports them.
async fn reported(app: &TestApp, admin: &str) -> HashMap<String, Value> {
    let body = app.graphql(admin, COUNTS, json!({})).await;
    body["data"]["endpoints"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|edge| {
            (
                edge["node"]["id"].as_str().unwrap_or_default().to_owned(),
                edge["node"]["deliveryCounts"].clone(),
            )
        })
        .collect()
}

/// Each endpoint's counts by counting every row.
async fn counted(app: &TestApp) -> HashMap<String, Value> {
    let mut counts: HashMap<String, Value> = HashMap::new();
    for row in rows(
        &app.state.db,
        "SELECT endpoint_id, state, COUNT(*) AS n FROM webhook_deliveries GROUP BY endpoint_id, state",
        vec![],
    )
    .await
    {
        let endpoint: Uuid = row.try_get("", "endpoint_id").expect("endpoint");
        let state: String = row.try_get("", "state").expect("state");
        let n: i64 = row.try_get("", "n").expect("n");
        let entry = counts.entry(endpoint.to_string()).or_insert_with(|| {
            json!({ "pending": 0, "processing": 0, "delivered": 0, "failed": 0, "total": 0 })
        });
        entry[state.as_str()] = json!(n);
        entry["total"] = json!(entry["total"].as_i64().unwrap_or(0) + n);
    }
    counts
}

async fn assert_counts_exact(app: &TestApp, admin: &str, when: &str) {
    let counted = counted(app).await;
    let reported = reported(app, admin).await;
    for (endpoint, counts) in &counted {
        assert_eq!(
            reported.get(endpoint),
            Some(counts),
            "{when}: endpoint {endpoint}"
        );
    }
}

/// Two instances deliver (every first attempt fails, so retries are recorded too), resends
/// race each other on both, retention prunes half of what was delivered, and the migration
/// is run again on the full database: at every step the reported counts equal a count of
/// every row.
async fn delivered_counts_stay_exact(backend: Backend) {
    const SUBMISSIONS: usize = 240;
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(|n| Reply::status(if n == 1 { 500 } else { 200 })).await;
    let configure = |config: &mut courier::config::ServeArgs| {
        quick_worker(config);
        // The failing endpoint stays enabled through its failures.
        config.disable_after_failures = 0;
    };
    let apps = [
        TestApp::spawn_with(&db, configure).await,
        TestApp::spawn_with(&db, configure).await,
    ];
    let admin = apps[0].admin_token().await;
    let mut endpoints = Vec::new();
    for path in ["a", "b", "c"] {
        endpoints.push(endpoint_on(&apps[0], &admin, &receiver, path).await);
    }
    // A fourth endpoint whose receiver always fails: its deliveries end FAILED.
    let down = Receiver::start(|_| Reply::status(500)).await;
    endpoints.push(endpoint_on(&apps[0], &admin, &down, "down").await);
    let mut ids = Vec::new();
    for chunk in (0..SUBMISSIONS).collect::<Vec<_>>().chunks(40) {
        let submits = chunk.iter().map(|n| {
            let (app, admin, endpoint) = (&apps[n % 2], &admin, &endpoints[n % 4]);
            async move { submit(app, admin, endpoint, json!({ "n": n }), None).await }
        });
        for answer in futures_util::future::join_all(submits).await {
            ids.push(
                answer["data"]["submit"]["delivery"]["id"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{answer}"))
                    .to_owned(),
            );
        }
    }
    // The checks have a pool of their own: under a loaded machine they once waited out
    // the acquire timeout behind the instance's own work.
    let checks = db.connect(2).await;
    let pool = &checks;
    let all_settled = || async {
        count(
            pool,
            "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state IN ('delivered', 'failed')",
            vec![],
        )
        .await
            == SUBMISSIONS as i64
    };
    eventually(
        "every delivery is settled",
        Duration::from_secs(60),
        all_settled,
    )
    .await;
    assert_counts_exact(&apps[0], &admin, "after delivering").await;

    // The failed ones replayed, in bulk on one instance racing single replays on the
    // other, and failed again.
    let failed_ids: Vec<String> = ids.iter().skip(3).step_by(4).cloned().collect();
    let singles = failed_ids.iter().take(10).map(|id| {
        apps[1].graphql(
            &admin,
            "mutation($id: ID!) { replayDelivery(id: $id) { id } }",
            json!({ "id": id }),
        )
    });
    let bulk = apps[0].graphql(
        &admin,
        "mutation { replayDeliveries(filter: {}) { replayed } }",
        json!({}),
    );
    let (_, bulk) = tokio::join!(futures_util::future::join_all(singles), bulk);
    assert!(bulk.get("errors").is_none(), "{bulk}");
    eventually(
        "the replayed fail again",
        Duration::from_secs(60),
        all_settled,
    )
    .await;
    assert_counts_exact(&apps[0], &admin, "after replaying").await;

    // Each of 30 delivered deliveries resent twice at once, once through each instance.
    let delivered_ids: Vec<String> = ids
        .iter()
        .enumerate()
        .filter(|(n, _)| n % 4 != 3)
        .map(|(_, id)| id.clone())
        .collect();
    let resends = delivered_ids[..30].iter().flat_map(|id| {
        let admin = &admin;
        apps.iter()
            .map(move |app| async move { app.graphql(admin, RESEND, json!({ "id": id })).await })
    });
    let answers = futures_util::future::join_all(resends).await;
    let won = answers.iter().filter(|a| a.get("errors").is_none()).count();
    assert!(won >= 30, "every delivery resent at least once: {won}");
    for lost in answers.iter().filter(|a| a.get("errors").is_some()) {
        assert_eq!(
            gql_error_code(lost),
            Some("DELIVERY_NOT_REPLAYABLE"),
            "{lost}"
        );
    }
    eventually(
        "the resent are delivered again",
        Duration::from_secs(60),
        all_settled,
    )
    .await;
    assert_counts_exact(&apps[0], &admin, "after resending").await;

    // Half of what was delivered settled long ago, and is pruned.
    let old = chrono::Utc::now() - chrono::Duration::days(40);
    for id in ids.iter().step_by(2) {
        rows(
            pool,
            "UPDATE webhook_deliveries SET updated_at = $1 WHERE id = $2",
            vec![
                SqlValue::from(old),
                SqlValue::from(Uuid::parse_str(id).expect("uuid")),
            ],
        )
        .await;
    }
    let mut pruned = 0;
    loop {
        let batch = courier::worker::retention::prune_batch(pool, 30, 50)
            .await
            .expect("prune");
        pruned += batch;
        if batch == 0 {
            break;
        }
    }
    assert_eq!(pruned, (SUBMISSIONS / 2) as u64);
    assert_counts_exact(&apps[0], &admin, "after pruning").await;

    // The migration carries a database that has history over: undone and done again, it
    // fills the counts from the rows there.
    // The last five migrations: the delivered counts, and the four after them.
    migration::Migrator::down(pool.conn(), Some(5))
        .await
        .expect("down");
    migration::Migrator::up(pool.conn(), None)
        .await
        .expect("up");
    assert_counts_exact(&apps[0], &admin, "after migrating again").await;
}

/// On a large table never analyzed, the count statements read indexes, never the table's
/// history: 200,000 delivered rows and a few of every other state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_statements_never_scan_history() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    for n in 0..6 {
        submit(&app, &admin, &endpoint, json!({ "n": n }), None).await;
    }
    let pool = &app.state.db;
    rows(
        pool,
        "WITH s AS (INSERT INTO submissions (id, endpoint_id, payload, payload_hash, created_at) \
         SELECT gen_random_uuid(), e.id, '{}', 'x', now() FROM endpoints e, generate_series(1, 200000) \
         RETURNING id, endpoint_id) \
         INSERT INTO webhook_deliveries (id, submission_id, endpoint_id, state, cycle_attempts, \
         next_attempt_at, created_at, updated_at) \
         SELECT gen_random_uuid(), s.id, s.endpoint_id, 'delivered', 1, NULL, now(), now() FROM s",
        vec![],
    )
    .await;
    rows(
        pool,
        "UPDATE webhook_deliveries SET state = 'failed', next_attempt_at = NULL WHERE id IN \
         (SELECT id FROM webhook_deliveries WHERE state = 'pending' LIMIT 2)",
        vec![],
    )
    .await;
    let ids = format!("= ANY('{{{endpoint}}}'::uuid[])");
    for statement in [UNSETTLED, SETTLED] {
        let sql = statement.replace("{ids}", &ids);
        let plan = rows(pool, &format!("EXPLAIN (FORMAT JSON) {sql}"), vec![]).await;
        let plan: Value = plan[0].try_get("", "QUERY PLAN").expect("a plan");
        let text = plan.to_string();
        assert!(
            !text.contains("\"Seq Scan\""),
            "a count reads the whole table: {sql}\n{text}"
        );
        let mut indexes = Vec::new();
        index_names(&plan, &mut indexes);
        for index in &indexes {
            assert!(
                [
                    "idx_webhook_deliveries_due_by_endpoint",
                    "idx_webhook_deliveries_in_flight",
                    "idx_webhook_deliveries_endpoint_failed",
                    "endpoint_settled_counts_pkey",
                ]
                .contains(&index.as_str()),
                "a count reads {index}, which holds history: {sql}\n{text}"
            );
        }
        assert!(!indexes.is_empty(), "{text}");
    }
    let reported = reported(&app, &admin).await;
    assert_eq!(
        reported[&endpoint],
        json!({ "pending": 4, "processing": 0, "delivered": 0, "failed": 0, "total": 4 }),
        "rows written behind Courier's back are not counted as settled; the states in \
         progress are counted from the table itself"
    );
}

/// Every index a plan reads.
fn index_names(plan: &Value, names: &mut Vec<String>) {
    match plan {
        Value::Object(node) => {
            if let Some(Value::String(name)) = node.get("Index Name") {
                names.push(name.clone());
            }
            node.values().for_each(|child| index_names(child, names));
        }
        Value::Array(items) => items.iter().for_each(|item| index_names(item, names)),
        _ => {}
    }
}

on_every_backend!(delivered_counts_stay_exact);
