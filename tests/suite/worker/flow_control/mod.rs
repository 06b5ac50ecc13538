//! Fair share and flow control per endpoint: the claim's arithmetic on both backends (caps,
//! shares, rate limits, pauses, bad settings), then real receivers behind several app
//! instances on PostgreSQL (the cap, the rate limit and a pause held across processes, a
//! settings change felt by another process, and neighbours that are slow or hang), turns set
//! ahead taken when they come rather than at the next poll, turns left ready with nothing due
//! put to sleep without waiting for it, a pause held from the answer
//! that asked for it, and claims made at submit under the same rules.

mod across_instances;
mod at_submit;
mod at_submit_crash;
mod at_submit_fence;
mod at_submit_stop;
mod claiming;
mod neighbours;
mod pace;
mod pause;
mod relaxed_commit;
mod settings_change;
mod stale_turns;

use std::time::{Duration, Instant};

use serde_json::json;

pub use crate::support::endpoints::{endpoint_input, endpoint_with};
use crate::support::{Receiver, TestApp};

/// Submits `count` payloads to `endpoint`, each tagged with its number.
pub async fn submit_many(app: &TestApp, admin: &str, endpoint: &str, count: usize) {
    for n in 0..count {
        let body =
            crate::support::fixtures::submit(app, admin, endpoint, json!({ "n": n }), None).await;
        assert!(body["errors"].is_null(), "{body}");
    }
}

/// The window a rate limit is checked in at the receiver: a second, less the 100 ms that a
/// loaded machine can add between a start and its arrival (the limiter spaces starts
/// `1.05 / rate` apart, so `rate + 1` starts span 1.05 s). One start too many still shows
/// in it at up to 10 a second: `rate + 1` starts then span at most 0.945 s.
pub const RATE_WINDOW: Duration = Duration::from_millis(950);

/// The most of `arrivals` (sorted or not) that fall in any window `[t, t + window)`.
pub fn most_in_any_window(arrivals: &[Instant], window: Duration) -> usize {
    let mut sorted = arrivals.to_vec();
    sorted.sort();
    let mut most = 0;
    let mut first = 0;
    for (last, at) in sorted.iter().enumerate() {
        while *at - sorted[first] >= window {
            first += 1;
        }
        most = most.max(last - first + 1);
    }
    most
}

/// Asserts each of `count` deliveries arrived exactly once at `path` (by `webhook-id`),
/// every one signed for the receiver's secret.
pub fn each_once(receiver: &Receiver, path: &str, count: usize) {
    let received: Vec<_> = receiver
        .received()
        .into_iter()
        .filter(|r| r.path == path)
        .collect();
    let mut ids: Vec<&str> = received.iter().map(|r| r.webhook_id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), count, "distinct webhooks at {path}");
    assert_eq!(received.len(), count, "nothing at {path} was sent twice");
    assert!(
        received.iter().all(|r| r.verified),
        "every webhook verifies"
    );
}

/// An endpoint at `https://example.com/...` with `settings`, and `due` deliveries to it.
pub async fn endpoint_with_backlog(
    app: &TestApp,
    admin: &str,
    settings: serde_json::Value,
    due: usize,
) -> uuid::Uuid {
    let input = endpoint_input("flow", "https://example.com/hook", settings);
    let body = app
        .graphql(
            admin,
            "mutation($input: CreateEndpointInput!) { createEndpoint(input: $input) { endpoint { id } } }",
            json!({ "input": input }),
        )
        .await;
    let id = body["data"]["createEndpoint"]["endpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"))
        .to_owned();
    submit_many(app, admin, &id, due).await;
    uuid::Uuid::parse_str(&id).expect("uuid")
}

/// What one claim of at most `limit` deliveries takes, with a lease no test outlives.
pub async fn claim(pool: &courier::db::Db, limit: u32) -> Vec<courier::worker::claim::Claim> {
    use crate::support::fixtures::{events_for, LONG_LEASE};
    courier::worker::claim::claim_due(pool, &events_for(pool), limit, LONG_LEASE)
        .await
        .expect("claim")
}

/// Moves `columns` of every flow row two seconds into the past, as if that time had passed.
pub async fn two_seconds_pass(
    pool: &courier::db::Db,
    backend: crate::support::Backend,
    columns: &[&str],
) {
    let earlier = |column: &&str| match backend {
        crate::support::Backend::Sqlite => {
            format!("{column} = strftime('%Y-%m-%dT%H:%M:%f+00:00', {column}, '-2 seconds')")
        }
        _ => format!("{column} = {column} - interval '2 seconds'"),
    };
    let set: Vec<String> = columns.iter().map(earlier).collect();
    crate::support::fixtures::rows(
        pool,
        &format!("UPDATE endpoint_flow SET {}", set.join(", ")),
        vec![],
    )
    .await;
}
