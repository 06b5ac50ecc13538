//! The claim's flow control against the database directly, on every backend: an endpoint's
//! cap counts what is in flight, a claim's slots are shared across endpoints, the rate
//! limit spaces starts, a `Retry-After` pauses the whole endpoint, and settings out of range
//! are refused without changing anything.

use std::collections::HashMap;
use std::time::Duration;

use courier::worker::claim::Claim;
use courier::worker::dispatch::{AttemptOutcome, OutcomeKind};
use courier::worker::health::HealthPolicy;
use courier::worker::record::{record, FinishedAttempt};
use courier::worker::schedule::NextStep;
use serde_json::json;
use uuid::Uuid;

use super::{claim, endpoint_with_backlog, two_seconds_pass};
use crate::on_every_backend;
use crate::support::fixtures::{events_for, record_result, LONG_LEASE};
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

fn per_endpoint(claims: &[Claim]) -> HashMap<Uuid, usize> {
    let mut counts = HashMap::new();
    for claim in claims {
        *counts.entry(claim.endpoint_id).or_default() += 1;
    }
    counts
}

/// A claim shares its slots evenly among the endpoints with due work (one each when there
/// are as many endpoints as slots), never takes more of one endpoint than its cap allows
/// in flight, and an outcome recorded frees a slot for the next claim.
async fn a_claim_shares_its_slots_and_holds_each_cap(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let capped = endpoint_with_backlog(&app, &admin, json!({ "maxInFlight": 2 }), 6).await;
    let second = endpoint_with_backlog(&app, &admin, json!({}), 6).await;
    let third = endpoint_with_backlog(&app, &admin, json!({}), 6).await;
    let pool = &app.state.db;

    let first = claim(pool, 3).await;
    assert_eq!(
        per_endpoint(&first),
        HashMap::from([(capped, 1), (second, 1), (third, 1)]),
        "three slots, three endpoints: one each"
    );
    let more = claim(pool, 30).await;
    let counts = per_endpoint(&more);
    assert_eq!(
        counts.get(&capped),
        Some(&1),
        "the capped endpoint fills its two slots"
    );
    assert_eq!(
        (counts[&second], counts[&third]),
        (5, 5),
        "the others take the rest"
    );
    assert!(
        claim(pool, 30).await.is_empty(),
        "a full endpoint gets nothing more"
    );

    let held = first
        .iter()
        .find(|c| c.endpoint_id == capped)
        .expect("a claim of the capped endpoint");
    record_result(pool, held, true).await;
    let freed = claim(pool, 30).await;
    assert_eq!(
        per_endpoint(&freed),
        HashMap::from([(capped, 1)]),
        "one slot freed"
    );
}

/// A request that has ended is no longer in flight at its receiver though its outcome is
/// not recorded yet: the claimer that knows it (its own process) leaves it out of the count
/// and fills the slot, while another claimer still counts it.
async fn an_ended_request_frees_its_slot_for_its_own_process(backend: Backend) {
    use courier::worker::claim::{claim as claim_with, ClaimRequest};
    use courier::worker::ended::Snapshot;
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let capped = endpoint_with_backlog(&app, &admin, json!({ "maxInFlight": 2 }), 5).await;
    let pool = &app.state.db;
    let held = claim(pool, 10).await;
    assert_eq!(held.len(), 2);
    assert!(
        claim(pool, 10).await.is_empty(),
        "full while both are in flight"
    );
    let request = |ended: Vec<Uuid>| ClaimRequest {
        limit: 10,
        lease: LONG_LEASE,
        default_max_in_flight: 32,
        ended: Snapshot {
            ended,
            revisit: vec![capped],
        },
        only: None,
        shares: Default::default(),
        left_alone: Vec::new(),
        attempts_per_cycle: None,
        outages: None,
    };
    let events = events_for(pool);
    let refilled = claim_with(pool, &events, request(vec![held[0].delivery_id]))
        .await
        .expect("claim");
    assert_eq!(refilled.claims.len(), 1, "one slot is free again");
    let other = claim_with(pool, &events, request(Vec::new()))
        .await
        .expect("claim");
    assert!(
        other.claims.is_empty(),
        "a claimer that does not know counts it still"
    );
}

/// A rate limit of one a second starts one delivery, then none until the limiter's interval
/// has passed (moved into the past here rather than waited for).
async fn a_rate_limit_spaces_the_starts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let limited = endpoint_with_backlog(&app, &admin, json!({ "rateLimit": 1 }), 3).await;
    let pool = &app.state.db;
    assert_eq!(claim(pool, 10).await.len(), 1);
    assert!(claim(pool, 10).await.is_empty(), "the next start waits");

    // Two seconds pass for the limiter.
    two_seconds_pass(pool, backend, &["rate_tat", "turn_at", "blocked_until"]).await;
    let next = claim(pool, 10).await;
    assert_eq!(per_endpoint(&next), HashMap::from([(limited, 1)]));
}

/// A `429` with `Retry-After` pauses the whole endpoint on the database's clock (capped at
/// an hour): nothing more of it is claimed, and its waiting deliveries keep their places
/// with no attempt spent.
async fn a_retry_after_pauses_the_whole_endpoint(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_with_backlog(&app, &admin, json!({}), 4).await;
    let pool = &app.state.db;
    let claimed = claim(pool, 1).await;
    let asked = Duration::from_secs(7200);
    let now = courier::db::now();
    let recorded = record(
        pool,
        &events_for(pool),
        HealthPolicy::default(),
        &[FinishedAttempt {
            claim: claimed[0].clone(),
            outcome: AttemptOutcome {
                status: Some(429),
                error: Some("HTTP 429 Too Many Requests".into()),
                retry_after: Some(asked),
                duration: Duration::from_millis(2),
                kind: OutcomeKind::HttpStatus,
                answer: None,
            },
            step: NextStep::RetryAfter(Duration::from_secs(3600)),
            started_at: now,
            finished_at: now,
        }],
    )
    .await
    .expect("record");
    assert!(recorded[0].new_state.is_some());
    assert!(
        claim(pool, 10).await.is_empty(),
        "a paused endpoint gets nothing"
    );

    let body = app
        .graphql(
            &admin,
            "query($id: ID!) { endpoint(id: $id) { pausedUntil } deliveries(filter: {endpointId: $id, state: PENDING}) { edges { node { cycleAttempts } } } }",
            json!({ "id": endpoint.to_string() }),
        )
        .await;
    let until: chrono::DateTime<chrono::Utc> = body["data"]["endpoint"]["pausedUntil"]
        .as_str()
        .unwrap_or_else(|| panic!("paused: {body}"))
        .parse()
        .expect("a time");
    let ahead = until - chrono::Utc::now();
    assert!(
        ahead > chrono::Duration::minutes(59) && ahead <= chrono::Duration::minutes(61),
        "a two-hour Retry-After pauses for an hour: {ahead}"
    );
    let waiting: Vec<i64> = body["data"]["deliveries"]["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .map(|edge| edge["node"]["cycleAttempts"].as_i64().expect("attempts"))
        .collect();
    assert_eq!(waiting.len(), 4, "all four wait: {body}");
    assert_eq!(
        waiting.iter().filter(|n| **n == 0).count(),
        3,
        "three spent no attempt"
    );
}

/// `maxInFlight` outside 1..=1000 and `rateLimit` outside 1..=100000 are `BAD_USER_INPUT`,
/// on create and on update, and change nothing; null puts a setting back to its default and
/// omitting it leaves it.
async fn bad_flow_settings_are_refused_and_change_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let create = "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id } } }";
    for bad in [
        json!({ "maxInFlight": 0 }),
        json!({ "maxInFlight": 1001 }),
        json!({ "rateLimit": 0 }),
        json!({ "rateLimit": 100_001 }),
        json!({ "maxInFlight": -5 }),
    ] {
        let input = super::endpoint_input("bad", "https://example.com/hook", bad.clone());
        let body = app.graphql(&admin, create, json!({ "input": input })).await;
        assert_eq!(
            gql_error_code(&body),
            Some("BAD_USER_INPUT"),
            "{bad}: {body}"
        );
    }
    let listed = app
        .graphql(&admin, "{ endpoints { edges { node { id } } } }", json!({}))
        .await;
    assert_eq!(
        listed["data"]["endpoints"]["edges"],
        json!([]),
        "nothing was created"
    );

    let id = endpoint_with_backlog(
        &app,
        &admin,
        json!({ "maxInFlight": 5, "rateLimit": 10 }),
        0,
    )
    .await
    .to_string();
    let update = "mutation($id: ID!, $input: UpdateEndpointInput!) { updateEndpoint(id: $id, input: $input) { endpoint { maxInFlight rateLimit } } }";
    for bad in [
        json!({ "maxInFlight": 0, "name": "renamed" }),
        json!({ "rateLimit": 0 }),
    ] {
        let body = app
            .graphql(&admin, update, json!({ "id": id, "input": bad }))
            .await;
        assert_eq!(
            gql_error_code(&body),
            Some("BAD_USER_INPUT"),
            "{bad}: {body}"
        );
    }
    let read = "query($id: ID!) { endpoint(id: $id) { name maxInFlight rateLimit } }";
    let body = app.graphql(&admin, read, json!({ "id": id })).await;
    assert_eq!(
        body["data"]["endpoint"],
        json!({ "name": "flow", "maxInFlight": 5, "rateLimit": 10 }),
        "unchanged"
    );
    let body = app
        .graphql(
            &admin,
            update,
            json!({ "id": id, "input": { "name": "kept" } }),
        )
        .await;
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"],
        json!({ "maxInFlight": 5, "rateLimit": 10 }),
        "omitted settings stay"
    );
    let body = app
        .graphql(
            &admin,
            update,
            json!({ "id": id, "input": { "maxInFlight": null, "rateLimit": null } }),
        )
        .await;
    assert_eq!(
        body["data"]["updateEndpoint"]["endpoint"],
        json!({ "maxInFlight": 32, "rateLimit": null }),
        "null is back to the default: {body}"
    );
}

on_every_backend!(
    a_claim_shares_its_slots_and_holds_each_cap,
    an_ended_request_frees_its_slot_for_its_own_process,
    a_rate_limit_spaces_the_starts,
    a_retry_after_pauses_the_whole_endpoint,
    bad_flow_settings_are_refused_and_change_nothing,
);
