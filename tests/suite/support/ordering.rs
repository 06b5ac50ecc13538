//! Helpers for ordered delivery: submitting with an ordering key, replaying, reading a
//! delivery's place in its line, a receiver that does what each body says, and arrivals per key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, FixedOffset};
use courier::config::ServeArgs;
use serde_json::{json, Value};

use crate::support::fixtures::{eventually, quick_worker};
use crate::support::{Receiver, Reply, ReplyBody, TestApp};

/// `submit` with an ordering key, answering with the delivery.
pub const SUBMIT_KEYED: &str = "mutation($input: SubmitInput!) { submit(input: $input) { created submission { id orderingKey } delivery { id state orderingKey nextAttemptAt } } }";

/// One delivery with its place in its line.
pub const DELIVERY: &str = "query($id: ID!) { delivery(id: $id) { id state orderingKey nextAttemptAt waitingBehind { id } } }";

/// Replays a failed delivery.
const REPLAY: &str = "mutation($id: ID!) { replayDelivery(id: $id) { id state } }";

/// A worker that retries quickly and makes one attempt per cycle (a failure is final).
pub fn single_attempt_worker(config: &mut ServeArgs) {
    quick_worker(config);
    config.max_attempts = Some(1);
}

/// Replays the failed delivery `id`, asserting that it is pending again.
pub async fn replay(app: &TestApp, token: &str, id: &str) {
    let replayed = app.graphql(token, REPLAY, json!({ "id": id })).await;
    assert_eq!(
        replayed["data"]["replayDelivery"]["state"], "PENDING",
        "{replayed}"
    );
}

/// A worker that retries quickly and often (nothing runs out of attempts by accident).
pub fn patient_worker(config: &mut ServeArgs) {
    quick_worker(config);
    config.worker_concurrency = 16;
    config.max_attempts = Some(20);
    config.retry_base_ms = Some(20);
    config.retry_max_ms = 200;
}

/// Submits `payload` to `endpoint` with ordering key `key` (none: unkeyed) and returns
/// the submit's answer, asserting it succeeded.
pub async fn submit_keyed(
    app: &TestApp,
    token: &str,
    endpoint: &str,
    payload: Value,
    key: Option<&str>,
) -> Value {
    let input = json!({ "endpointId": endpoint, "payload": payload, "orderingKey": key });
    let body = app
        .graphql(token, SUBMIT_KEYED, json!({ "input": input }))
        .await;
    assert!(body["errors"].is_null(), "{body}");
    body["data"]["submit"].clone()
}

/// Submits `payload` (which makes the receiver fail every attempt of a cycle) to
/// `endpoint` with ordering key `key`, waits for it to end `FAILED`, and returns its id.
pub async fn failed_keyed(
    app: &TestApp,
    token: &str,
    endpoint: &str,
    payload: Value,
    key: Option<&str>,
) -> String {
    let id = id_of(&submit_keyed(app, token, endpoint, payload, key).await);
    all_settled(
        app,
        token,
        std::slice::from_ref(&id),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(read(app, token, &id).await["state"], "FAILED");
    id
}

/// The delivery id in a [`submit_keyed`] answer.
pub fn id_of(submitted: &Value) -> String {
    submitted["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{submitted}"))
        .to_owned()
}

/// A delivery as [`DELIVERY`] reads it.
pub async fn read(app: &TestApp, token: &str, id: &str) -> Value {
    let body = app.graphql(token, DELIVERY, json!({ "id": id })).await;
    assert!(body["errors"].is_null(), "{body}");
    body["data"]["delivery"].clone()
}

/// When attempt `number` of delivery `id` started and finished, as `app` records them.
pub async fn attempt_times(
    app: &TestApp,
    token: &str,
    id: &str,
    number: i64,
) -> (DateTime<FixedOffset>, DateTime<FixedOffset>) {
    let body = app
        .graphql(
            token,
            "query($id: ID!) { delivery(id: $id) { attempts { number startedAt finishedAt } } }",
            json!({ "id": id }),
        )
        .await;
    let attempt = body["data"]["delivery"]["attempts"]
        .as_array()
        .and_then(|attempts| attempts.iter().find(|attempt| attempt["number"] == number))
        .unwrap_or_else(|| panic!("attempt {number}: {body}"));
    let at = |field: &str| {
        attempt[field]
            .as_str()
            .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
            .unwrap_or_else(|| panic!("{field} of attempt {number}: {body}"))
    };
    (at("startedAt"), at("finishedAt"))
}

/// A receiver that does what each body says: `500` for a webhook's first `failFirst`
/// requests, `500` for every third request overall when `flaky` is set, otherwise `200`;
/// after `delayMs` either way, and `successDelayMs` more before a `200`.
pub async fn obedient_receiver() -> Receiver {
    let calls = Arc::new(AtomicUsize::new(0));
    Receiver::start_by_body(move |body, nth| {
        let call = calls.fetch_add(1, Ordering::SeqCst);
        let fail_first = body["failFirst"].as_u64().unwrap_or(0);
        let flaky = body["flaky"].as_bool().unwrap_or(false) && call % 3 == 2;
        let failing = nth as u64 <= fail_first || flaky;
        Reply {
            status: if failing { 500 } else { 200 },
            headers: Vec::new(),
            delay: Duration::from_millis(
                body["delayMs"].as_u64().unwrap_or(0)
                    + if failing {
                        0
                    } else {
                        body["successDelayMs"].as_u64().unwrap_or(0)
                    },
            ),
            body: ReplyBody::Empty,
        }
    })
    .await
}

/// For each ordering key seen at `path` (as sent in `webhook-ordering-key`), the `n` of
/// its bodies in arrival order, retries included.
pub fn arrivals_by_key(receiver: &Receiver, path: &str) -> BTreeMap<String, Vec<i64>> {
    let mut lines: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for received in receiver.received().into_iter().filter(|r| r.path == path) {
        if let Some(key) = received.ordering_key {
            lines
                .entry(key)
                .or_default()
                .push(received.body["n"].as_i64().unwrap_or(-1));
        }
    }
    lines
}

/// Waits until every one of `ids` is `DELIVERED` or `FAILED`.
pub async fn all_settled(app: &TestApp, token: &str, ids: &[String], timeout: Duration) {
    eventually("every delivery settles", timeout, || async {
        for id in ids {
            let state = read(app, token, id).await["state"].clone();
            if state != "DELIVERED" && state != "FAILED" {
                return false;
            }
        }
        true
    })
    .await;
}

/// The states of `ids`, in order.
pub async fn states(app: &TestApp, token: &str, ids: &[String]) -> Vec<String> {
    let mut states = Vec::with_capacity(ids.len());
    for id in ids {
        states.push(
            read(app, token, id).await["state"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    states
}
