//! Claims at submit: a submission stored while the local worker has a slot to spare claims
//! its own delivery in the transaction that stores it, under the same rules as any claim:
//! the endpoint's cap (held across instances, racing the claiming loops), its rate limit,
//! due order within the endpoint, and the lease and fence when the process dies or the
//! request outlives its lease (a process killed after such a claim: [`super::at_submit_crash`]).

use std::time::Duration;

use courier::config::ServeArgs;
use serde_json::json;

use super::{each_once, endpoint_with, most_in_any_window, RATE_WINDOW};
use crate::on_both_backends;
use crate::support::fixtures::{
    attempts, delivery, delivery_id, loop_at_rest, quick_worker, settle, submit,
};
use crate::support::receiver::{answering_after, slow_first_attempt};
use crate::support::{Backend, Receiver, TestApp, TestDb};

/// Submits `n` and returns the delivery's id.
async fn submit_one(app: &TestApp, admin: &str, endpoint: &str, n: usize) -> uuid::Uuid {
    let body = submit(app, admin, endpoint, json!({ "n": n }), None).await;
    assert!(body["errors"].is_null(), "{body}");
    assert_eq!(
        body["data"]["submit"]["delivery"]["state"], "PENDING",
        "submit answers with the delivery as created: {body}"
    );
    delivery_id(&body).parse().expect("a delivery id")
}

/// An app whose claiming loop rounds, which a submission could meet, are a second apart,
/// with an accepting receiver and an endpoint on it at `path`.
struct Quiet {
    _db: TestDb,
    receiver: Receiver,
    app: TestApp,
    admin: String,
    endpoint: String,
}

impl Quiet {
    async fn start(backend: Backend, path: &str) -> Self {
        let db = TestDb::new(backend).await;
        let receiver = Receiver::accepting().await;
        let app = TestApp::spawn_with(&db, |config| {
            quick_worker(config);
            config.poll_interval_ms = 1_000;
        })
        .await;
        let admin = app.admin_token().await;
        let endpoint = endpoint_with(&app, &admin, &receiver, path, json!({})).await;
        Quiet {
            _db: db,
            receiver,
            app,
            admin,
            endpoint,
        }
    }
}

/// One submission at a time: each is claimed by the submit itself (a claim is
/// opportunistic: one that meets the claiming loop's own round, which holds the free slots
/// while it claims, waits for the loop instead), delivered once, signed, with one attempt,
/// and published `PENDING`, `PROCESSING`, `DELIVERED` in that order.
async fn a_quiet_submission_claims_its_own_delivery(backend: Backend) {
    let Quiet {
        _db,
        receiver,
        app,
        admin,
        endpoint,
    } = Quiet::start(backend, "quiet").await;
    let mut changes = app.state.bus.subscribe();
    let mut ids = Vec::new();
    for n in 0..5 {
        let id = submit_one(&app, &admin, &endpoint, n).await;
        receiver.wait_for(n + 1, Duration::from_secs(10)).await;
        // Quiet again before the next: its outcome recorded, and any round of the
        // claiming loop that recording woke over (on a busy machine, these can still be
        // under way when the webhook has arrived).
        let pool = app.state.db.clone();
        crate::support::fixtures::eventually("recorded", Duration::from_secs(10), || async {
            delivery(&pool, id).await.state == entity::webhook_delivery::DeliveryState::Delivered
        })
        .await;
        loop_at_rest(&app).await;
        ids.push(id);
    }
    let metrics = &app.state.metrics;
    let at_submit = metrics.claims_at_submit.get();
    assert!(at_submit >= 4, "claimed at submit: {at_submit} of 5");
    assert_eq!(
        metrics.claims.get(),
        5,
        "each claimed once, at submit or by the loop"
    );
    let pool = app.state.db.clone();
    for id in &ids {
        crate::support::fixtures::eventually("delivered", Duration::from_secs(10), || async {
            delivery(&pool, *id).await.state == entity::webhook_delivery::DeliveryState::Delivered
        })
        .await;
        assert_eq!(attempts(&pool, *id).await.len(), 1, "one attempt");
    }
    let mut seen: std::collections::HashMap<uuid::Uuid, Vec<String>> = Default::default();
    while let Ok(Ok(message)) =
        tokio::time::timeout(Duration::from_millis(500), changes.recv()).await
    {
        if let courier::bus::ChangeMessage::Change(change) = message {
            seen.entry(change.delivery_id)
                .or_default()
                .push(format!("{:?}", change.state));
        }
    }
    for id in &ids {
        assert_eq!(
            seen.get(id).map(Vec::as_slice),
            Some(
                &[
                    "Pending".to_owned(),
                    "Processing".into(),
                    "Delivered".into()
                ][..]
            ),
            "the changes of {id}"
        );
    }
    settle([app]).await;
    each_once(&receiver, "quiet", 5);
}

/// A full endpoint takes nothing at submit: with `maxInFlight: 1` and a slow receiver, the
/// second submission waits for the first to end, and they arrive in submission order. A
/// rate limit holds too: four submissions in a row to `rateLimit: 2` never start more
/// than two in a second.
async fn a_submission_claims_only_within_its_endpoints_limits(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(answering_after(Duration::from_millis(400))).await;
    let app = TestApp::spawn_with(&db, quick_worker).await;
    let admin = app.admin_token().await;
    let capped = endpoint_with(
        &app,
        &admin,
        &receiver,
        "capped",
        json!({ "maxInFlight": 1 }),
    )
    .await;
    let limited = endpoint_with(
        &app,
        &admin,
        &receiver,
        "limited",
        json!({ "rateLimit": 2 }),
    )
    .await;

    submit_one(&app, &admin, &capped, 0).await;
    receiver.wait_for(1, Duration::from_secs(10)).await;
    // The first went out at submit or, if it met the claiming loop's round, by the loop (a
    // claim at submit is opportunistic); either way it now holds the endpoint's one slot.
    let while_free = app.state.metrics.claims_at_submit.get();
    assert!(
        while_free <= 1,
        "{while_free} claims at submit for one submission"
    );
    submit_one(&app, &admin, &capped, 1).await;
    assert_eq!(
        app.state.metrics.claims_at_submit.get(),
        while_free,
        "a full endpoint claims nothing at submit"
    );
    let received = receiver.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(receiver.most_in_flight("capped"), 1, "never two at once");
    let order: Vec<_> = received.iter().map(|r| r.body["n"].clone()).collect();
    assert_eq!(
        order,
        vec![json!(0), json!(1)],
        "due order within the endpoint"
    );

    for n in 0..4 {
        submit_one(&app, &admin, &limited, n).await;
    }
    let received = receiver.wait_for(6, Duration::from_secs(15)).await;
    let arrivals: Vec<_> = received
        .iter()
        .filter(|r| r.path == "limited")
        .map(|r| r.at)
        .collect();
    assert_eq!(arrivals.len(), 4);
    let most = most_in_any_window(&arrivals, RATE_WINDOW);
    assert!(
        most <= 2,
        "{most} starts within {RATE_WINDOW:?} at rateLimit 2"
    );
    settle([app]).await;
    each_once(&receiver, "capped", 2);
    each_once(&receiver, "limited", 4);
}

/// Makes the database refuse (or, `refuse` false, allow again) every claim: no delivery
/// can become `processing`, while new deliveries (`pending`) are stored as ever.
async fn refuse_claims(app: &TestApp, refuse: bool) {
    use sea_orm::ConnectionTrait;
    let sql = match (app.state.db.backend(), refuse) {
        (sea_orm::DbBackend::Postgres, true) => {
            "ALTER TABLE webhook_deliveries ADD CONSTRAINT no_claims \
             CHECK (state <> 'processing') NOT VALID"
        }
        (sea_orm::DbBackend::Postgres, false) => {
            "ALTER TABLE webhook_deliveries DROP CONSTRAINT no_claims"
        }
        (_, true) => {
            "CREATE TRIGGER no_claims BEFORE UPDATE ON webhook_deliveries \
             WHEN NEW.state = 'processing' BEGIN SELECT RAISE(ABORT, 'no claims'); END"
        }
        (_, false) => "DROP TRIGGER no_claims",
    };
    app.state
        .db
        .conn()
        .execute_unprepared(sql)
        .await
        .expect("refuse or allow claims");
}

/// A claim at submit that fails (the database refuses it) fails the transaction it runs
/// in, with no savepoint: the submission is then stored again, once, with the ids it was
/// minted with, answers without an error, and is delivered by an ordinary claim once
/// claims are allowed again.
async fn a_failed_claim_at_submit_still_stores_the_submission(backend: Backend) {
    let Quiet {
        _db,
        receiver,
        app,
        admin,
        endpoint,
    } = Quiet::start(backend, "refused").await;
    let metrics = &app.state.metrics;
    // A claim at submit is opportunistic (one that meets a round of the claiming loop
    // waits for the loop), so on a loaded machine it may take a few submissions to see one.
    let mut stored = 0;
    while metrics.claims_at_submit.get() == 0 {
        assert!(
            stored < 5,
            "none of {stored} quiet submissions claimed at submit"
        );
        submit_one(&app, &admin, &endpoint, stored).await;
        stored += 1;
        receiver.wait_for(stored, Duration::from_secs(10)).await;
        let rows = (stored as u64, stored as u64);
        crate::support::fixtures::eventually("all claimed", Duration::from_secs(10), || async {
            crate::support::fixtures::row_counts(&app).await == rows
                && metrics.claims.get() == stored as u64
        })
        .await;
    }
    let claimed_at_submit = metrics.claims_at_submit.get();

    refuse_claims(&app, true).await;
    // Likewise, until a submission tries to claim at submit (and fails).
    let (mut id, mut key) = (uuid::Uuid::nil(), String::new());
    while metrics.claims_at_submit_failed.get() == 0 {
        assert!(stored < 10, "no submission tried to claim at submit");
        key = format!("once-{stored}");
        let body = submit(&app, &admin, &endpoint, json!({ "n": stored }), Some(&key)).await;
        assert!(
            body["errors"].is_null(),
            "a failed claim fails no submission: {body}"
        );
        stored += 1;
        id = delivery_id(&body).parse().expect("a delivery id");
        assert_eq!(body["data"]["submit"]["delivery"]["state"], "PENDING");
    }
    let stored_delivery = delivery(&app.state.db, id).await;
    assert_eq!(
        stored_delivery.state,
        entity::webhook_delivery::DeliveryState::Pending,
        "stored under the id it answered with, unclaimed"
    );
    assert!(stored_delivery.claim_token.is_none());
    assert_eq!(
        crate::support::fixtures::row_counts(&app).await,
        (stored as u64, stored as u64),
        "stored once: nothing of the failed try committed"
    );
    assert_eq!(
        metrics.claims_at_submit.get(),
        claimed_at_submit,
        "the claim at submit failed"
    );
    assert_eq!(
        metrics.claims_at_submit_failed.get(),
        1,
        "the submission claimed at submit, failed, and was stored again"
    );
    let again = submit(
        &app,
        &admin,
        &endpoint,
        json!({ "n": stored - 1 }),
        Some(&key),
    )
    .await;
    assert_eq!(
        delivery_id(&again),
        id.to_string(),
        "its idempotency key is held by the stored submission: {again}"
    );

    refuse_claims(&app, false).await;
    receiver.wait_for(stored, Duration::from_secs(15)).await;
    settle([app]).await;
    each_once(&receiver, "refused", stored);
}

on_both_backends!(
    a_quiet_submission_claims_its_own_delivery,
    a_submission_claims_only_within_its_endpoints_limits,
    a_failed_claim_at_submit_still_stores_the_submission,
);

/// Three instances, six submitters racing through them, and the instances' claiming loops
/// all claiming for one endpoint with `maxInFlight: 3`: the receiver never holds more than
/// three at once, claims at submit race the loops' claims, and each of the 48 arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_at_submit_and_claiming_loops_share_one_cap_across_instances() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(answering_after(Duration::from_millis(60))).await;
    let configure = |config: &mut ServeArgs| {
        quick_worker(config);
        config.worker_concurrency = 4;
        config.request_timeout_ms = 5_000;
        config.lease_secs = 30;
        // The loops claim when slots free; their idle rounds, which hold the free slots
        // while they claim, are a second apart.
        config.poll_interval_ms = 1_000;
    };
    let apps = std::sync::Arc::new([
        TestApp::spawn_with(&db, configure).await,
        TestApp::spawn_with(&db, configure).await,
        TestApp::spawn_with(&db, configure).await,
    ]);
    let admin = apps[0].admin_token().await;
    let endpoint = endpoint_with(
        &apps[0],
        &admin,
        &receiver,
        "shared",
        json!({ "maxInFlight": 3 }),
    )
    .await;
    let mut submitters = tokio::task::JoinSet::new();
    for submitter in 0..6 {
        let (apps, admin, endpoint) = (apps.clone(), admin.clone(), endpoint.clone());
        submitters.spawn(async move {
            for n in 0..8 {
                let app = &apps[(submitter + n) % 3];
                submit_one(app, &admin, &endpoint, submitter * 8 + n).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
    }
    while let Some(done) = submitters.join_next().await {
        done.expect("a submitter");
    }
    // Well inside the 30 s lease: a claimed delivery left unsent would wait for it.
    receiver.wait_for(48, Duration::from_secs(15)).await;
    let most = receiver.most_in_flight("shared");
    assert!(most <= 3, "the receiver held {most} requests at once");
    let at_submit = apps
        .each_ref()
        .map(|app| app.state.metrics.claims_at_submit.get());
    assert!(
        at_submit.iter().filter(|n| **n > 0).count() >= 2 && at_submit.iter().sum::<u64>() >= 6,
        "claims at submit on several instances raced the claiming loops: {at_submit:?}"
    );
    let apps = std::sync::Arc::try_unwrap(apps).unwrap_or_else(|_| panic!("apps still shared"));
    settle(apps).await;
    each_once(&receiver, "shared", 48);
}

/// A request that outlives the lease of a claim made at submit: another instance takes
/// the delivery again once the lease runs out and delivers it, and the late answer of the
/// first claim is recorded as superseded and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_made_at_submit_is_fenced_like_any_other() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(slow_first_attempt(Duration::from_millis(3_500))).await;
    let short_lease = |config: &mut ServeArgs| {
        quick_worker(config);
        config.lease_secs = 1;
        config.request_timeout_ms = 8_000;
    };
    // The first instance's claiming loop runs only when woken (its poll is long), and any
    // round the new endpoint woke is over before the submission: a round holds the free
    // slots while it claims, and a submission then claims nothing at submit.
    let first = TestApp::spawn_with(&db, |config| {
        short_lease(config);
        config.poll_interval_ms = 10_000;
    })
    .await;
    let admin = first.admin_token().await;
    let endpoint = endpoint_with(&first, &admin, &receiver, "slow", json!({})).await;
    loop_at_rest(&first).await;
    let id = submit_one(&first, &admin, &endpoint, 0).await;
    assert_eq!(first.state.metrics.claims_at_submit.get(), 1);
    let second = TestApp::spawn_with(&db, short_lease).await;
    let pool = first.state.db.clone();
    crate::support::fixtures::eventually(
        "the late result is recorded",
        Duration::from_secs(15),
        || async { attempts(&pool, id).await.len() == 2 },
    )
    .await;
    let attempts = attempts(&pool, id).await;
    assert_eq!(
        attempts.iter().filter(|a| a.superseded).count(),
        1,
        "the first claim's late answer is superseded: {attempts:?}"
    );
    assert_eq!(
        delivery(&pool, id).await.state,
        entity::webhook_delivery::DeliveryState::Delivered
    );
    assert!(second.state.metrics.claims.get() + first.state.metrics.claims.get() >= 2);
    let received = receiver.wait_for(2, Duration::from_secs(5)).await;
    assert_eq!(
        received[0].webhook_id, received[1].webhook_id,
        "one webhook, sent again"
    );
    first.stop().await;
    second.stop().await;
}

/// With `COURIER_CLAIM_AT_SUBMIT=false` every delivery waits for the claiming loop, and is
/// delivered all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_at_submit_can_be_turned_off() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.claim_at_submit = false;
    })
    .await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_with(&app, &admin, &receiver, "off", json!({})).await;
    for n in 0..3 {
        submit_one(&app, &admin, &endpoint, n).await;
        receiver.wait_for(n + 1, Duration::from_secs(10)).await;
    }
    assert_eq!(app.state.metrics.claims_at_submit.get(), 0);
    assert!(app.state.metrics.claims.get() >= 3, "the loop claimed them");
    settle([app]).await;
    each_once(&receiver, "off", 3);
}
