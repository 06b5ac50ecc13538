//! Dashboard queries: `deliveries` pages, filters and scoping, per-endpoint counts, and the
//! number of SQL statements a page with nested fields costs.

use std::collections::HashSet;

use courier::auth::Role;
use sea_orm::ConnectionTrait;
use serde_json::{json, Value};

use crate::on_both_backends;
use crate::support::fixtures::submit;
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

const PAGE: &str = "query($first: Int, $after: String, $filter: DeliveryFilter) {
  deliveries(first: $first, after: $after, filter: $filter) {
    edges { cursor node { id state endpoint { id } } }
    pageInfo { hasNextPage endCursor }
  }
}";

async fn submit_many(app: &TestApp, token: &str, endpoint: &str, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for n in 0..count {
        let body = submit(app, token, endpoint, json!({ "n": n }), None).await;
        ids.push(
            body["data"]["submit"]["delivery"]["id"]
                .as_str()
                .unwrap_or_else(|| panic!("{body}"))
                .to_owned(),
        );
    }
    ids
}

/// Walks every page; returns the ids in the order seen.
async fn walk(
    app: &TestApp,
    token: &str,
    first: i32,
    filter: Value,
    during: impl AsyncFn(usize),
) -> Vec<String> {
    let mut seen = Vec::new();
    let mut after = Value::Null;
    for page in 0.. {
        let body = app
            .graphql(
                token,
                PAGE,
                json!({ "first": first, "after": after, "filter": filter }),
            )
            .await;
        let connection = &body["data"]["deliveries"];
        let edges = connection["edges"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"));
        seen.extend(
            edges
                .iter()
                .map(|e| e["node"]["id"].as_str().unwrap_or_default().to_owned()),
        );
        during(page).await;
        if connection["pageInfo"]["hasNextPage"] != true {
            break;
        }
        after = connection["pageInfo"]["endCursor"].clone();
    }
    seen
}

async fn pages_have_no_gaps_or_duplicates_under_concurrent_inserts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app.create_endpoint(&admin, "https://example.com/a").await;
    let mut existing = submit_many(&app, &admin, &endpoint, 27).await;

    let seen = walk(&app, &admin, 7, Value::Null, async |_| {
        submit_many(&app, &admin, &endpoint, 2).await;
    })
    .await;
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no delivery appears twice");
    existing.reverse();
    assert_eq!(
        seen, existing,
        "exactly the deliveries that existed, newest first; new ones land before the cursor"
    );

    for (first, after) in [
        (json!(0), json!(null)),
        (json!(101), json!(null)),
        (json!(5), json!("bogus")),
    ] {
        let body = app
            .graphql(&admin, PAGE, json!({ "first": first, "after": after }))
            .await;
        if first == 0 {
            assert_eq!(body["data"]["deliveries"]["edges"], json!([]), "{body}");
        } else {
            assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
        }
    }
}

async fn filters_and_partner_scope_apply(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (mine, _) = app
        .create_endpoint(&admin, "https://example.com/mine")
        .await;
    let (theirs, _) = app
        .create_endpoint(&admin, "https://example.com/theirs")
        .await;
    let my_ids: HashSet<String> = submit_many(&app, &admin, &mine, 3)
        .await
        .into_iter()
        .collect();
    submit_many(&app, &admin, &theirs, 4).await;
    app.state
        .db
        .conn()
        .execute_unprepared("UPDATE webhook_deliveries SET state = 'failed', next_attempt_at = NULL WHERE id IN (SELECT id FROM webhook_deliveries ORDER BY id LIMIT 2)")
        .await
        .expect("fail two");
    // Counted as Courier counts a failure it records.
    app.state
        .db
        .conn()
        .execute_unprepared(
            "INSERT INTO endpoint_settled_counts (endpoint_id, shard, delivered, failed) \
             SELECT endpoint_id, 0, 0, COUNT(*) FROM webhook_deliveries WHERE state = 'failed' \
             GROUP BY endpoint_id",
        )
        .await
        .expect("count the two");

    let all = walk(&app, &admin, 100, Value::Null, async |_| {}).await;
    assert_eq!(all.len(), 7);
    let by_endpoint = walk(
        &app,
        &admin,
        100,
        json!({ "endpointId": mine }),
        async |_| {},
    )
    .await;
    assert_eq!(by_endpoint.into_iter().collect::<HashSet<_>>(), my_ids);
    let failed = walk(
        &app,
        &admin,
        100,
        json!({ "state": "FAILED" }),
        async |_| {},
    )
    .await;
    assert_eq!(failed.len(), 2);

    let partner = app
        .token(
            Role::Partner,
            &[uuid::Uuid::parse_str(&mine).expect("uuid")],
        )
        .await;
    let scoped = walk(&app, &partner, 100, Value::Null, async |_| {}).await;
    assert_eq!(
        scoped.into_iter().collect::<HashSet<_>>(),
        my_ids,
        "a partner lists only its endpoints"
    );
    let forbidden = app
        .graphql(
            &partner,
            PAGE,
            json!({ "filter": { "endpointId": theirs } }),
        )
        .await;
    assert_eq!(gql_error_code(&forbidden), Some("FORBIDDEN"), "{forbidden}");
    let other_id = all
        .iter()
        .find(|id| !my_ids.contains(*id))
        .expect("one of theirs");
    let read = app
        .graphql(
            &partner,
            "query($id: ID!) { delivery(id: $id) { id } }",
            json!({ "id": other_id }),
        )
        .await;
    assert_eq!(gql_error_code(&read), Some("FORBIDDEN"), "{read}");

    let counts = app
        .graphql(&admin, "{ endpoints { edges { node { id deliveryCounts { pending processing delivered failed total } } } } }", json!({}))
        .await;
    let total: i64 = counts["data"]["endpoints"]["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .map(|edge| {
            let c = &edge["node"]["deliveryCounts"];
            assert_eq!(
                c["total"],
                c["pending"].as_i64().unwrap_or(0) + c["failed"].as_i64().unwrap_or(0),
                "{counts}"
            );
            c["total"].as_i64().unwrap_or(0)
        })
        .sum();
    assert_eq!(total, 7, "{counts}");
}

async fn a_page_with_nested_fields_costs_a_constant_number_of_queries(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    for n in 0..4 {
        let (endpoint, _) = app
            .create_endpoint(&admin, &format!("https://example.com/{n}"))
            .await;
        submit_many(&app, &admin, &endpoint, 25).await;
    }
    let nested = "query($first: Int) { deliveries(first: $first) { edges { node { id state
        endpoint { id name deliveryCounts { total } }
        submission { id payload delivery { id } endpoint { id } }
        attempts { number } } } } }";
    // The pool's statement counter also counts background work (the revocation watcher's
    // poll every 500 ms, pruning), which can only add: the cheapest of five runs is the
    // request's cost.
    let mut costs = Vec::new();
    for first in [100, 10, 1] {
        let mut cheapest = u64::MAX;
        for _ in 0..5 {
            let before = app.state.db.queries().get();
            let body = app.graphql(&admin, nested, json!({ "first": first })).await;
            let after = app.state.db.queries().get();
            assert_eq!(
                body["data"]["deliveries"]["edges"].as_array().map(Vec::len),
                Some(first as usize),
                "{body}"
            );
            cheapest = cheapest.min(after - before);
        }
        costs.push(cheapest);
    }
    assert_eq!(costs[0], costs[1], "100 rows cost what 10 do: {costs:?}");
    assert_eq!(costs[1], costs[2], "and what 1 does: {costs:?}");
    assert!(
        costs[0] <= 8,
        "one statement per kind of thing, not per row: {costs:?}"
    );
}

/// `createdAfter` (inclusive) and `createdBefore` (exclusive) bound a listing by when the
/// deliveries were created, pages included; a backwards range is refused.
async fn listings_by_creation_time(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let ids = submit_many(&app, &admin, &endpoint, 9).await;
    // Three days, three deliveries each: ids 0-2 on the 1st, 3-5 on the 2nd, 6-8 on the 3rd.
    let days: Vec<chrono::DateTime<chrono::Utc>> = [
        "2026-11-01T00:00:00Z",
        "2026-11-02T00:00:00Z",
        "2026-11-03T00:00:00Z",
    ]
    .iter()
    .map(|day| day.parse().expect("time"))
    .collect();
    for (n, id) in ids.iter().enumerate() {
        let at = days[n / 3] + chrono::Duration::hours(n as i64 % 3);
        app.state
            .db
            .conn()
            .execute_raw(sea_orm::Statement::from_sql_and_values(
                app.state.db.backend(),
                "UPDATE webhook_deliveries SET created_at = $1 WHERE id = $2",
                [at.into(), uuid::Uuid::parse_str(id).expect("uuid").into()],
            ))
            .await
            .expect("move the creation time");
    }
    let second_day = json!({ "createdAfter": days[1], "createdBefore": days[2] });
    let seen = walk(&app, &admin, 2, second_day, async |_| {}).await;
    let expected: Vec<String> = ids[3..6].iter().rev().cloned().collect();
    assert_eq!(
        seen, expected,
        "newest first, the second day only, over two pages"
    );
    let from_second = walk(
        &app,
        &admin,
        50,
        json!({ "createdAfter": days[1] }),
        async |_| {},
    )
    .await;
    assert_eq!(from_second.len(), 6, "the lower bound is inclusive");
    let before_second = walk(
        &app,
        &admin,
        50,
        json!({ "createdBefore": days[1] }),
        async |_| {},
    )
    .await;
    assert_eq!(before_second.len(), 3, "the upper bound is exclusive");
    let backwards = app
        .graphql(
            &admin,
            PAGE,
            json!({ "filter": { "createdAfter": days[2], "createdBefore": days[1] } }),
        )
        .await;
    assert_eq!(
        gql_error_code(&backwards),
        Some("BAD_USER_INPUT"),
        "{backwards}"
    );
    // Moments RFC 3339 cannot write: PostgreSQL cannot store the first, SQLite would
    // compare the second as text; both are refused alike.
    for (field, at) in [
        ("createdBefore", "-5000-01-01T00:00:00Z"),
        ("createdAfter", "+10000-01-01T00:00:00Z"),
    ] {
        let refused = app
            .graphql(&admin, PAGE, json!({ "filter": { field: at } }))
            .await;
        assert_eq!(
            gql_error_code(&refused),
            Some("BAD_USER_INPUT"),
            "{refused}"
        );
    }
    let replay =
        "mutation($filter: ReplayFilter!) { replayDeliveries(filter: $filter) { replayed } }";
    let refused = app
        .graphql(
            &admin,
            replay,
            json!({ "filter": { "since": "-5000-01-01T00:00:00Z" } }),
        )
        .await;
    assert_eq!(
        gql_error_code(&refused),
        Some("BAD_USER_INPUT"),
        "{refused}"
    );
    // A cursor goes on from where it stands even once its delivery is gone (as retention
    // removes deliveries while an old window is paged).
    let all = json!({ "createdAfter": days[0] });
    let first = app
        .graphql(&admin, PAGE, json!({ "first": 2, "filter": all }))
        .await;
    let connection = &first["data"]["deliveries"];
    let cursor = connection["pageInfo"]["endCursor"].clone();
    let gone = connection["edges"][1]["node"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();
    assert_eq!(gone, ids[7], "{first}");
    crate::support::fixtures::rows(
        &app.state.db,
        "DELETE FROM webhook_deliveries WHERE id = $1",
        vec![uuid::Uuid::parse_str(&gone).expect("uuid").into()],
    )
    .await;
    let rest = app
        .graphql(
            &admin,
            PAGE,
            json!({ "first": 50, "after": cursor, "filter": all }),
        )
        .await;
    let rest: Vec<&str> = rest["data"]["deliveries"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{rest}"))
        .iter()
        .filter_map(|edge| edge["node"]["id"].as_str())
        .collect();
    let expected: Vec<&str> = ids[..7].iter().rev().map(String::as_str).collect();
    assert_eq!(
        rest, expected,
        "the page after a cursor whose delivery is gone"
    );
}

on_both_backends!(
    listings_by_creation_time,
    pages_have_no_gaps_or_duplicates_under_concurrent_inserts,
    filters_and_partner_scope_apply,
    a_page_with_nested_fields_costs_a_constant_number_of_queries,
);
