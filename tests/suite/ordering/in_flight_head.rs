//! A replay made while its line's head is in flight: the head finishes its attempt, and when
//! that attempt ends in a retry, the replayed delivery (submitted before it) goes next, at
//! once, rather than after the head's whole retry cycle; the head gets its line back at the
//! retry time that attempt gave it, not at once.

use std::time::Duration;

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{endpoint_on, quick_worker};
use crate::support::ordering::{
    all_settled, arrivals_by_key, attempt_times, failed_keyed, id_of, obedient_receiver, read,
    replay, states, submit_keyed,
};
use crate::support::{Backend, TestApp, TestDb};

async fn a_replay_during_the_heads_attempt_goes_next_when_that_attempt_fails(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let quick = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(2);
        config.retry_base_ms = Some(50);
    })
    .await;
    let admin = quick.admin_token().await;
    let endpoint = endpoint_on(&quick, &admin, &receiver, "in-flight").await;
    let key = Some("order-9");
    let first = failed_keyed(
        &quick,
        &admin,
        &endpoint,
        json!({ "n": 0, "failFirst": 2 }),
        key,
    )
    .await;
    // The next head is slow to answer its first attempt, fails it, and then waits five
    // seconds (less a fifth at most, for jitter) for its retry.
    let patient = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(3);
        config.retry_base_ms = Some(5_000);
    })
    .await;
    quick.stop().await;
    let second = id_of(
        &submit_keyed(
            &patient,
            &admin,
            &endpoint,
            json!({ "n": 1, "failFirst": 1, "delayMs": 1_500 }),
            key,
        )
        .await,
    );
    crate::support::fixtures::eventually(
        "the head's first attempt is in flight",
        Duration::from_secs(10),
        || async { receiver.received().len() == 3 },
    )
    .await;
    assert_eq!(read(&patient, &admin, &second).await["state"], "PROCESSING");
    replay(&patient, &admin, &first).await;
    let ids = [first, second];
    // The replayed one went as soon as the head's attempt failed, and the head followed it
    // at its retry time.
    all_settled(&patient, &admin, &ids, Duration::from_secs(20)).await;
    assert_eq!(
        states(&patient, &admin, &ids).await,
        ["DELIVERED", "DELIVERED"]
    );
    assert_eq!(
        arrivals_by_key(&receiver, "in-flight")["order-9"],
        [0, 0, 1, 0, 1],
        "the head's attempt, then the replayed one, then the head again"
    );
    let (_, failed) = attempt_times(&patient, &admin, &ids[1], 1).await;
    let (retried, _) = attempt_times(&patient, &admin, &ids[1], 2).await;
    let waited = retried - failed;
    assert!(
        waited >= chrono::Duration::milliseconds(3_900),
        "handed back, the head kept its retry time: it went {waited} after its attempt"
    );
}

on_both_backends!(a_replay_during_the_heads_attempt_goes_next_when_that_attempt_fails);
