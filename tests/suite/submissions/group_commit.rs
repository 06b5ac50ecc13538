//! Group commit on PostgreSQL: submissions arriving together share one statement, and
//! each caller still gets its own answer, also when the statement outlives its deadline.

use std::time::{Duration, Instant};

use sea_orm::ConnectionTrait as _;
use serde_json::json;

use crate::support::{gql_error_code, Backend, TestApp, TestDb};

use crate::support::fixtures::{
    created_or_refused, lock_endpoint_row, row_counts, submit, submit_as_one_group,
};

/// Submissions arriving together are written together on PostgreSQL; each caller still gets
/// its own answer: stored, unknown endpoint, disabled endpoint, or the idempotent winner.
async fn submissions_written_together_get_their_own_answers(backend: Backend) {
    const EACH: usize = 12;
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (open, _) = app
        .create_endpoint(&admin, "https://example.com/open")
        .await;
    let (closed, _) = app
        .create_endpoint(&admin, "https://example.com/closed")
        .await;
    app.graphql(
        &admin,
        "mutation($id: ID!) { updateEndpoint(id: $id, input: {disabled: true}) { secret } }",
        json!({ "id": closed }),
    )
    .await;
    let unknown = uuid::Uuid::now_v7().to_string();

    let calls = (0..EACH * 4)
        .map(|i| {
            let (app, admin) = (&app, admin.clone());
            let (endpoint, key) = match i % 4 {
                0 => (open.clone(), None),
                1 => (closed.clone(), None),
                2 => (unknown.clone(), None),
                _ => (open.clone(), Some("shared".to_owned())),
            };
            async move {
                submit(
                    app,
                    &admin,
                    &endpoint,
                    json!({ "same": true }),
                    key.as_deref(),
                )
                .await
            }
        })
        .collect();
    let answers = submit_as_one_group(&db, &app, &admin, calls).await;
    let metrics = &app.state.metrics;
    assert_eq!(
        (
            metrics.submission_group_writes.get(),
            metrics.submission_group_rows.get()
        ),
        (1, EACH as u64 * 4),
        "one statement wrote them all"
    );
    assert_eq!(
        metrics.submission_group_duplicates.get(),
        EACH as u64 - 1,
        "the shared key was taken inside the statement"
    );
    let mut shared_ids = std::collections::HashSet::new();
    for (i, answer) in answers.iter().enumerate() {
        match i % 4 {
            0 => assert_eq!(answer["data"]["submit"]["created"], true, "{answer}"),
            1 => assert_eq!(gql_error_code(answer), Some("BAD_USER_INPUT"), "{answer}"),
            2 => assert_eq!(gql_error_code(answer), Some("NOT_FOUND"), "{answer}"),
            _ => {
                assert!(answer.get("errors").is_none(), "{answer}");
                shared_ids.insert(answer["data"]["submit"]["submission"]["id"].clone());
            }
        }
    }
    assert_eq!(shared_ids.len(), 1, "one submission for the shared key");
    let created = answers
        .iter()
        .enumerate()
        .filter(|(i, a)| i % 4 == 3 && a["data"]["submit"]["created"] == true)
        .count();
    assert_eq!(created, 1);
    // The gate's submission, the open endpoint's, and the shared key's.
    assert_eq!(row_counts(&app).await, (EACH as u64 + 2, EACH as u64 + 2));
}

/// A group statement waits on a lock past its deadline (another session holds the
/// endpoint's row for 20 s): every caller is answered (created, or unavailable once its
/// request's deadline passed), the group writer goes on with other endpoints' submissions
/// (one to another endpoint, sent 11 s in, is answered at once: the group's rows are not
/// written again for callers that stopped waiting), and what the abandoned statements
/// commit once the lock goes is stored once.
async fn a_group_held_past_its_deadline_stalls_nothing_and_stores_once(backend: Backend) {
    const CALLS: usize = 10;
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (blocked, _) = app
        .create_endpoint(&admin, "https://example.com/blocked")
        .await;
    let (open, _) = app
        .create_endpoint(&admin, "https://example.com/open")
        .await;
    let holder = db.connect(1).await;
    let lock = lock_endpoint_row(&holder, &blocked).await;
    // Busy while it holds the lock, so no idle-in-transaction timeout ends it early.
    let held = async {
        lock.execute_unprepared("SELECT pg_sleep(20)")
            .await
            .expect("slept");
        lock.commit().await.expect("released");
    };
    let calls = futures_util::future::join_all((0..CALLS).map(|n| {
        let (app, admin, blocked) = (&app, &admin, &blocked);
        async move { submit(app, admin, blocked, json!({ "n": n }), None).await }
    }));
    let bystander = async {
        // After the first submission's deadline (5 s) and the group's (5 s more).
        tokio::time::sleep(Duration::from_secs(11)).await;
        let sent = Instant::now();
        let answer = submit(&app, &admin, &open, json!({ "bystander": true }), None).await;
        (answer, sent.elapsed())
    };
    let ((), answers, (bystanders, waited)) =
        futures_util::future::join3(held, calls, bystander).await;
    assert_eq!(
        bystanders["data"]["submit"]["created"], true,
        "{bystanders}"
    );
    assert!(
        waited < Duration::from_secs(3),
        "another endpoint's submission waited {waited:?} behind the blocked group"
    );
    let created = created_or_refused(&answers, "SERVICE_UNAVAILABLE");
    assert!(
        app.state.metrics.submission_group_writes.get() >= 1,
        "some were written as a group"
    );
    // What the abandoned statements committed is stored once (each committing as the lock
    // goes); what was answered created is among it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (submissions, deliveries) = row_counts(&app).await;
    assert_eq!(submissions, deliveries);
    assert!(
        (created as u64 + 1..=CALLS as u64 + 1).contains(&submissions),
        "{submissions} stored, {created} answered created, and the bystander's"
    );
}

crate::on_postgres!(
    submissions_written_together_get_their_own_answers,
    a_group_held_past_its_deadline_stalls_nothing_and_stores_once,
);
