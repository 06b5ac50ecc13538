//! Group commit on PostgreSQL: submissions arriving together share one statement, and
//! each caller still gets its own answer.

use serde_json::json;

use crate::support::{gql_error_code, Backend, TestApp, TestDb};

use crate::support::fixtures::{row_counts, submit, submit_as_one_group};

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

crate::on_postgres!(submissions_written_together_get_their_own_answers,);
