//! Fair share on PostgreSQL: one endpoint's slow or hanging receiver and its backlog never
//! become another endpoint's delay.

use std::time::{Duration, Instant};

use courier::config::ServeArgs;
use serde_json::json;

use super::{each_once, endpoint_with, submit_many};
use crate::support::fixtures::{eventually, quick_worker, rarely_polling_worker, submit};
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// A receiver that answers `200` after `delay` (past the request timeout: one that hangs).
async fn answering_after(delay: Duration) -> Receiver {
    Receiver::start(move |_| Reply {
        body: Default::default(),
        status: 200,
        headers: Vec::new(),
        delay,
    })
    .await
}

/// An endpoint `stuck` at `hanging` whose cap (1,000) is above any test's slots, and an
/// endpoint `quick` at `fast` with the default cap.
async fn stuck_and_quick(
    app: &TestApp,
    admin: &str,
    hanging: &Receiver,
    fast: &Receiver,
) -> (String, String) {
    let large_cap = json!({ "maxInFlight": 1000 });
    let stuck = endpoint_with(app, admin, hanging, "stuck", large_cap).await;
    let quick = endpoint_with(app, admin, fast, "quick", json!({})).await;
    (stuck, quick)
}

/// Submits `count` payloads to `endpoint` `gap` apart and returns, for each, how long it
/// took from the submit to its arrival at `path`.
async fn latencies(
    app: &TestApp,
    admin: &str,
    receiver: &Receiver,
    endpoint: &str,
    path: &str,
    count: usize,
) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(count);
    for n in 0..count {
        let arrived_before = receiver
            .received()
            .iter()
            .filter(|r| r.path == path)
            .count();
        let sent = Instant::now();
        let body = submit(app, admin, endpoint, json!({ "n": n }), None).await;
        assert!(body["errors"].is_null(), "{body}");
        loop {
            let arrived: Vec<_> = receiver
                .received()
                .into_iter()
                .filter(|r| r.path == path)
                .collect();
            if arrived.len() > arrived_before {
                latencies.push(arrived[arrived_before].at.saturating_duration_since(sent));
                break;
            }
            assert!(
                sent.elapsed() < Duration::from_secs(20),
                "delivery {n} never arrived"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    latencies
}

/// An instance with `slots` slots whose requests time out after `timeout_ms` (the lease,
/// a minute, outlives them).
async fn beside_hanging(db: &TestDb, slots: u32, timeout_ms: u64) -> TestApp {
    TestApp::spawn_with(db, |config: &mut ServeArgs| {
        quick_worker(config);
        config.worker_concurrency = slots;
        config.request_timeout_ms = timeout_ms;
        config.lease_secs = 60;
    })
    .await
}

/// `count` endpoints at `receiver` (paths `{prefix}-{n}`) with a cap of one, each with
/// `each` deliveries submitted; their paths.
async fn small_caps_at(
    app: &TestApp,
    admin: &str,
    receiver: &Receiver,
    prefix: &str,
    count: usize,
    each: usize,
) -> Vec<String> {
    let paths: Vec<String> = (0..count).map(|n| format!("{prefix}-{n}")).collect();
    for path in &paths {
        let small_cap = json!({ "maxInFlight": 1 });
        let endpoint = endpoint_with(app, admin, receiver, path, small_cap).await;
        submit_many(app, admin, &endpoint, each).await;
    }
    paths
}

/// Eight deliveries to `quick` at `fast`, each arriving within half a second of its submit
/// (`beside`: what they were sent beside, for the failure message), and each once.
async fn quick_ones_arrive_at_once(
    app: &TestApp,
    admin: &str,
    fast: &Receiver,
    quick: &str,
    beside: &str,
) {
    let waited = latencies(app, admin, fast, quick, "quick", 8).await;
    let worst = waited.iter().max().expect("latencies");
    assert!(
        *worst < Duration::from_millis(500),
        "a fast delivery waited {worst:?} beside {beside}: {waited:?}"
    );
    each_once(fast, "quick", 8);
}

/// Every request `receivers` got, in order of arrival, in milliseconds since `started`: what
/// a failed fairness check shows of the rounds that led to it.
fn arrivals(started: Instant, receivers: &[(&str, &Receiver)]) -> String {
    let mut lines: Vec<(Duration, String)> = receivers
        .iter()
        .flat_map(|(name, receiver)| {
            receiver.received().into_iter().map(move |r| {
                let at = r.at.saturating_duration_since(started);
                (at, format!("{:>7} ms {name} {}", at.as_millis(), r.body))
            })
        })
        .collect();
    lines.sort();
    lines
        .into_iter()
        .map(|(_, line)| line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The slow endpoint's receiver answers after a second, and there are only four slots,
/// all of which it could fill (its cap is the default 32): still, the fast endpoint's
/// deliveries go out as soon as any slot frees, never behind the slow one's backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_neighbour_waits_its_turn() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = answering_after(Duration::from_secs(1)).await;
    let fast = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, |config: &mut ServeArgs| {
        quick_worker(config);
        config.worker_concurrency = 4;
        config.request_timeout_ms = 5_000;
        config.lease_secs = 30;
    })
    .await;
    let admin = app.admin_token().await;
    let slow = endpoint_with(&app, &admin, &receiver, "slow", json!({})).await;
    let quick = endpoint_with(&app, &admin, &fast, "quick", json!({})).await;
    submit_many(&app, &admin, &slow, 40).await;
    eventually(
        "the slow endpoint fills every slot",
        Duration::from_secs(5),
        || async { receiver.in_flight("slow") == 4 },
    )
    .await;
    let started = Instant::now();
    let waited = latencies(&app, &admin, &fast, &quick, "quick", 6).await;
    // Without fair share they would wait behind 40 one-second requests on four slots (10 s).
    let worst = waited.iter().max().expect("latencies");
    assert!(
        *worst < Duration::from_millis(1_600),
        "a fast delivery waited {worst:?} behind a slow backlog: {waited:?}; arrivals:\n{}",
        arrivals(started, &[("slow", &receiver), ("QUICK", &fast)])
    );
    assert!(
        receiver.received().len() < 40,
        "the slow backlog was still waiting while the fast endpoint was served"
    );
    drop(receiver);
    app.stop().await;
}

/// A receiver that hangs past the request timeout holds only its endpoint's cap of slots;
/// every other endpoint's deliveries arrive at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hanging_neighbour_holds_only_its_cap() {
    let db = TestDb::new(Backend::Postgres).await;
    let hanging = answering_after(Duration::from_secs(30)).await;
    let fast = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, |config: &mut ServeArgs| {
        quick_worker(config);
        config.worker_concurrency = 16;
        config.request_timeout_ms = 1_000;
        config.retry_base_ms = Some(10_000);
        config.lease_secs = 30;
    })
    .await;
    let admin = app.admin_token().await;
    let stuck = endpoint_with(&app, &admin, &hanging, "stuck", json!({ "maxInFlight": 4 })).await;
    let quick = endpoint_with(&app, &admin, &fast, "quick", json!({})).await;
    submit_many(&app, &admin, &stuck, 30).await;
    eventually(
        "the hanging endpoint holds its cap",
        Duration::from_secs(5),
        || async { hanging.in_flight("stuck") == 4 },
    )
    .await;
    let waited = latencies(&app, &admin, &fast, &quick, "quick", 8).await;
    let worst = waited.iter().max().expect("latencies");
    assert!(
        *worst < Duration::from_millis(500),
        "a fast delivery waited {worst:?} beside a hanging endpoint: {waited:?}"
    );
    assert!(hanging.most_in_flight("stuck") <= 4);
    each_once(&fast, "quick", 8);
    app.stop().await;
}

/// A hanging receiver whose cap is above the worker's slots holds all but one of them: the
/// other endpoint's backlog (every delivery claimed by the claiming loop) still goes out
/// through the one left, claim after claim, rather than waiting for a quarter of the slots
/// to gather (which never happens here) until the poll, ten minutes off.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_is_claimed_through_the_few_slots_a_hanging_neighbour_leaves() {
    let db = TestDb::new(Backend::Postgres).await;
    let hanging = answering_after(Duration::from_secs(60)).await;
    let fast = Receiver::accepting().await;
    let app = TestApp::spawn_with(&db, |config: &mut ServeArgs| {
        rarely_polling_worker(config);
        config.worker_concurrency = 8;
        config.request_timeout_ms = 60_000;
        // Every delivery goes through the claiming loop, which a backlog makes gather slots.
        config.claim_at_submit = false;
    })
    .await;
    let admin = app.admin_token().await;
    let (stuck, quick) = stuck_and_quick(&app, &admin, &hanging, &fast).await;
    submit_many(&app, &admin, &stuck, 7).await;
    eventually(
        "the hanging endpoint holds seven of the eight slots",
        Duration::from_secs(5),
        || async { hanging.in_flight("stuck") == 7 },
    )
    .await;
    submit_many(&app, &admin, &quick, 40).await;
    eventually(
        "the backlog goes out through the one free slot",
        Duration::from_secs(20),
        || async { fast.received().len() == 40 },
    )
    .await;
    each_once(&fast, "quick", 40);
    app.stop().await;
}

/// A hanging receiver whose cap (1,000) is above the worker's slots holds all but an eighth
/// of them, however long its backlog: claims, and claims at submit, leave it alone once it
/// holds its share, and every other endpoint's deliveries arrive at once through the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hanging_neighbour_with_a_large_cap_leaves_an_eighth_of_the_slots() {
    let db = TestDb::new(Backend::Postgres).await;
    let hanging = answering_after(Duration::from_secs(30)).await;
    let fast = Receiver::accepting().await;
    let app = beside_hanging(&db, 8, 30_000).await;
    let admin = app.admin_token().await;
    let (stuck, quick) = stuck_and_quick(&app, &admin, &hanging, &fast).await;
    submit_many(&app, &admin, &stuck, 30).await;
    eventually(
        "the hanging endpoint holds its share",
        Duration::from_secs(5),
        || async { hanging.in_flight("stuck") >= 7 },
    )
    .await;
    // More of its deliveries, each a chance for a claim at submit to take the last slot.
    submit_many(&app, &admin, &stuck, 5).await;
    quick_ones_arrive_at_once(&app, &admin, &fast, &quick, "a hanging endpoint").await;
    assert_eq!(
        hanging.most_in_flight("stuck"),
        7,
        "seven of the eight slots"
    );
    drop(hanging);
    app.stop().await;
}

/// Two hanging receivers with large caps share what one may hold (all but an eighth of the
/// slots) rather than each taking its own share of them: together they leave the kept
/// slots to endpoints holding few requests, and every other endpoint's deliveries arrive
/// at once through them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hanging_neighbours_leave_an_eighth_of_the_slots_together() {
    let db = TestDb::new(Backend::Postgres).await;
    let hanging = answering_after(Duration::from_secs(30)).await;
    let fast = Receiver::accepting().await;
    let app = beside_hanging(&db, 16, 30_000).await;
    let admin = app.admin_token().await;
    let (stuck, quick) = stuck_and_quick(&app, &admin, &hanging, &fast).await;
    let large_cap = json!({ "maxInFlight": 1000 });
    let also_stuck = endpoint_with(&app, &admin, &hanging, "also-stuck", large_cap).await;
    submit_many(&app, &admin, &stuck, 20).await;
    submit_many(&app, &admin, &also_stuck, 20).await;
    let held = || hanging.in_flight("stuck") + hanging.in_flight("also-stuck");
    eventually(
        "the hanging endpoints hold their share",
        Duration::from_secs(5),
        || async { held() >= 14 },
    )
    .await;
    // More of theirs, each a chance for a claim at submit to take a kept slot.
    submit_many(&app, &admin, &stuck, 3).await;
    submit_many(&app, &admin, &also_stuck, 3).await;
    quick_ones_arrive_at_once(&app, &admin, &fast, &quick, "two hanging endpoints").await;
    // Fourteen of the sixteen slots together; of the two kept, one endpoint holding fewer
    // than two (light) may take one.
    assert!(held() <= 15, "{} of the sixteen slots", held());
    drop(hanging);
    app.stop().await;
}

/// Twenty hanging receivers with a cap of one each, more than the slots: once each has
/// had a request run past a second, they are slow, and slow endpoints hold all but an
/// eighth of the slots together however few each holds, so a quick endpoint's deliveries
/// arrive at once through the rest rather than a request timeout later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_slow_neighbours_with_small_caps_leave_an_eighth_of_the_slots() {
    let db = TestDb::new(Backend::Postgres).await;
    let hanging = answering_after(Duration::from_millis(2_500)).await;
    let fast = Receiver::accepting().await;
    let app = beside_hanging(&db, 16, 2_000).await;
    let admin = app.admin_token().await;
    let quick = endpoint_with(&app, &admin, &fast, "quick", json!({})).await;
    let paths = small_caps_at(&app, &admin, &hanging, "slow", 20, 10).await;
    let seen = || {
        let received = hanging.received();
        paths
            .iter()
            .all(|path| received.iter().any(|r| &r.path == path))
    };
    eventually(
        "every slow endpoint had a request",
        Duration::from_secs(20),
        || async { seen() },
    )
    .await;
    // The last of them run out their timeout, and are known slow from then on.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    quick_ones_arrive_at_once(&app, &admin, &fast, &quick, "twenty slow endpoints").await;
    drop(hanging);
    app.stop().await;
}

/// Forty new hanging receivers with a cap of one each, more than the slots, all sent to
/// at once: none is known slow before its first request has run a second, but endpoints
/// not yet seen answering quickly hold all but a quarter of the kept eighth together, so an
/// endpoint that has answered quickly still has slots while they hang, rather than
/// waiting a whole request timeout for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_hanging_neighbours_leave_slots_to_an_endpoint_known_quick() {
    let db = TestDb::new(Backend::Postgres).await;
    let hanging = answering_after(Duration::from_secs(30)).await;
    let fast = Receiver::accepting().await;
    let app = beside_hanging(&db, 32, 20_000).await;
    let admin = app.admin_token().await;
    let quick = endpoint_with(&app, &admin, &fast, "quick", json!({})).await;
    submit_many(&app, &admin, &quick, 1).await;
    eventually(
        "the quick endpoint has answered once",
        Duration::from_secs(5),
        || async { fast.received().len() == 1 },
    )
    .await;
    let paths = small_caps_at(&app, &admin, &hanging, "new", 40, 2).await;
    let held = || {
        paths
            .iter()
            .map(|path| hanging.in_flight(path))
            .sum::<usize>()
    };
    eventually(
        "the new endpoints hold what the untrusted may",
        Duration::from_secs(10),
        || async { held() >= 31 },
    )
    .await;
    let waited = latencies(&app, &admin, &fast, &quick, "quick", 8).await;
    let worst = waited.iter().max().expect("latencies");
    assert!(
        *worst < Duration::from_millis(500),
        "a fast delivery waited {worst:?} beside forty new hanging endpoints: {waited:?}"
    );
    assert_eq!(held(), 31, "all but one of the 32 slots");
    assert_eq!(fast.received().len(), 9);
    drop(hanging);
    app.stop().await;
}

/// A hanging receiver with a large cap, holding every heavy slot, and a quick endpoint
/// with a backlog (more than the few requests a light endpoint holds): while the quick one
/// waits for room, the heavy share is split between them, so the hanging one takes no
/// slot back as its requests time out until it holds no more than half, and the quick
/// one's backlog goes out through the other half rather than one slot's worth at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quick_backlog_beside_a_hanging_neighbour_takes_half_the_heavy_share() {
    let db = TestDb::new(Backend::Postgres).await;
    let hanging = answering_after(Duration::from_secs(30)).await;
    // Quick, yet slow enough that its backlog still waits after the slowest submits of a
    // busy machine (300 submits took 10 s on two starved cores): seven slots at 600 ms
    // take 25 s over it.
    let fast = answering_after(Duration::from_millis(600)).await;
    // Sixteen slots: the heavy endpoints hold fourteen together, light ones one each.
    let app = beside_hanging(&db, 16, 1_500).await;
    let admin = app.admin_token().await;
    let (stuck, quick) = stuck_and_quick(&app, &admin, &hanging, &fast).await;
    submit_many(&app, &admin, &stuck, 200).await;
    eventually(
        "the hanging endpoint holds the heavy share",
        Duration::from_secs(5),
        || async { hanging.in_flight("stuck") >= 14 },
    )
    .await;
    submit_many(&app, &admin, &quick, 300).await;
    // Two request timeouts: every request the hanging endpoint had has ended.
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    // Counted at the receivers, as requests open there: a request that ended is still a
    // `processing` row until its outcome is recorded, a moment later on a busy machine.
    let (mut most_stuck, mut most_quick) = (0, 0);
    for _ in 0..40 {
        most_stuck = most_stuck.max(hanging.in_flight("stuck"));
        most_quick = most_quick.max(fast.in_flight("quick"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        fast.received().len() + 7 < 300,
        "the quick backlog was to be still waiting while the slots were counted"
    );
    assert!(
        most_stuck <= 7,
        "the hanging endpoint took back {most_stuck} of 14 heavy slots while the quick one waited"
    );
    assert!(
        most_quick >= 5,
        "the quick endpoint's backlog had at most {most_quick} requests in flight"
    );
    drop(hanging);
    app.stop().await;
}

/// A light endpoint beside a hanging one that holds every heavy slot has only its light
/// slot: each of its requests that ends starts the next at once, not at the next poll (two
/// seconds here), so a burst of ten goes out one after another at the receiver's pace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_light_endpoints_slot_is_taken_again_as_soon_as_its_request_ends() {
    let db = TestDb::new(Backend::Postgres).await;
    let hanging = answering_after(Duration::from_secs(60)).await;
    let fast = answering_after(Duration::from_millis(100)).await;
    let app = TestApp::spawn_with(&db, |config: &mut ServeArgs| {
        quick_worker(config);
        config.worker_concurrency = 16;
        config.request_timeout_ms = 30_000;
        config.lease_secs = 60;
        config.poll_interval_ms = 2_000;
    })
    .await;
    let admin = app.admin_token().await;
    let (stuck, quick) = stuck_and_quick(&app, &admin, &hanging, &fast).await;
    submit_many(&app, &admin, &stuck, 30).await;
    eventually(
        "the hanging endpoint holds the heavy share",
        Duration::from_secs(10),
        || async { hanging.in_flight("stuck") >= 14 },
    )
    .await;
    let started = Instant::now();
    submit_many(&app, &admin, &quick, 10).await;
    eventually(
        "the burst to arrive one request after another",
        Duration::from_secs(6),
        || async { fast.received().iter().filter(|r| r.path == "quick").count() == 10 },
    )
    .await;
    assert!(
        fast.most_in_flight("quick") <= 2,
        "the light slot, per process"
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(6), "{took:?}");
    drop(hanging);
    app.stop().await;
}
