//! The line rules on both backends, with two app instances delivering (each its own pool and
//! worker): order through failures and retries, one request per line at a time, a head
//! that blocks its line until it fails, a replayed head rejoining, keys in parallel beside
//! unkeyed traffic, a published event lining up per endpoint, and bad keys refused.

use std::time::Duration;

use serde_json::json;

use crate::on_both_backends;
use crate::support::fixtures::{count, endpoint_on, quick_worker, row_counts, PUBLISH};
use crate::support::ordering::{
    all_settled, arrivals_by_key, attempt_times, failed_keyed, id_of, obedient_receiver,
    patient_worker, read, replay, single_attempt_worker, states, submit_keyed,
};
use crate::support::{gql_error_code, Backend, TestApp, TestDb};

/// Five lines of twenty, interleaved, to a receiver failing every third request: each
/// line's requests arrive in submission order (a retry repeats its delivery, never lets the
/// next one overtake), never two of a line at once, while the lines run side by side and
/// both instances claim.
async fn a_line_arrives_in_order_through_failures(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let apps = [
        TestApp::spawn_with(&db, patient_worker).await,
        TestApp::spawn_with(&db, patient_worker).await,
    ];
    let admin = apps[0].admin_token().await;
    let endpoint = endpoint_on(&apps[0], &admin, &receiver, "lines").await;
    let mut ids = Vec::new();
    for n in 0..20 {
        for line in 0..5 {
            let payload = json!({ "n": n, "flaky": true, "delayMs": 15 });
            let key = format!("order-{line}");
            let submitted =
                submit_keyed(&apps[n % 2], &admin, &endpoint, payload, Some(&key)).await;
            assert_eq!(submitted["submission"]["orderingKey"], key.as_str());
            ids.push(id_of(&submitted));
        }
    }
    all_settled(&apps[0], &admin, &ids, Duration::from_secs(90)).await;
    assert!(
        states(&apps[0], &admin, &ids)
            .await
            .iter()
            .all(|state| state == "DELIVERED"),
        "every delivery was delivered"
    );
    let lines = arrivals_by_key(&receiver, "lines");
    assert_eq!(lines.len(), 5, "{lines:?}");
    for (key, arrivals) in &lines {
        assert!(
            arrivals.windows(2).all(|pair| pair[0] <= pair[1]),
            "{key} arrived out of order: {arrivals:?}"
        );
        let mut distinct = arrivals.clone();
        distinct.dedup();
        assert_eq!(distinct, (0..20).collect::<Vec<_>>(), "{key}: {arrivals:?}");
        assert_eq!(
            receiver.most_in_flight_of_line("lines", key),
            1,
            "{key} had two requests in flight at once"
        );
    }
    let retried = receiver.received().len() - ids.len();
    assert!(
        retried >= 20,
        "a third of the requests failed: {retried} retries"
    );
    assert!(
        receiver.most_in_flight("lines") >= 2,
        "the lines ran side by side"
    );
    assert!(receiver.received().iter().all(|r| r.verified));
    if backend != Backend::Sqlite {
        let claims = apps.each_ref().map(|app| app.state.metrics.claims.get());
        assert!(
            claims.iter().all(|n| *n > 0),
            "both instances claimed: {claims:?}"
        );
    }
    let open = count(
        &apps[0].state.db,
        "SELECT COALESCE(SUM(open), 0) AS n FROM ordering_lines",
        vec![],
    )
    .await;
    assert_eq!(open, 0, "every line is empty again");
}

/// A head that keeps failing holds its line through its retries; the next waits, with no
/// due time, naming what it waits behind; once the head is `FAILED` the line moves on.
async fn the_head_holds_its_line_until_it_fails(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(3);
        config.retry_base_ms = Some(300);
    })
    .await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "held").await;
    let mut ids = Vec::new();
    for (n, payload) in [
        json!({ "n": 0, "failFirst": 99 }),
        json!({ "n": 1 }),
        json!({ "n": 2 }),
    ]
    .into_iter()
    .enumerate()
    {
        let submitted = submit_keyed(&app, &admin, &endpoint, payload, Some("invoice-9")).await;
        if n > 0 {
            assert_eq!(submitted["delivery"]["nextAttemptAt"], json!(null));
        }
        ids.push(id_of(&submitted));
    }
    let waiting = read(&app, &admin, &ids[1]).await;
    assert_eq!(waiting["state"], "PENDING");
    assert_eq!(waiting["orderingKey"], "invoice-9");
    assert_eq!(waiting["nextAttemptAt"], json!(null));
    assert_eq!(waiting["waitingBehind"]["id"], ids[0].as_str());
    assert_eq!(
        read(&app, &admin, &ids[2]).await["waitingBehind"]["id"],
        ids[0].as_str(),
        "the line's head, not the one just before"
    );
    assert_eq!(
        read(&app, &admin, &ids[0]).await["waitingBehind"],
        json!(null)
    );
    all_settled(&app, &admin, &ids, Duration::from_secs(30)).await;
    assert_eq!(
        states(&app, &admin, &ids).await,
        ["FAILED", "DELIVERED", "DELIVERED"]
    );
    assert_eq!(
        arrivals_by_key(&receiver, "held")["invoice-9"],
        [0, 0, 0, 1, 2],
        "three attempts of the head, then the rest in order"
    );
}

/// A replayed delivery is unsettled again and rejoins its line: while another of the line
/// is in flight it waits behind it, then goes before anything submitted after it.
async fn a_replayed_delivery_rejoins_its_line(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let app = TestApp::spawn_with(&db, single_attempt_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "rejoin").await;
    let key = Some("account-3");
    let first = failed_keyed(
        &app,
        &admin,
        &endpoint,
        json!({ "n": 0, "failFirst": 1 }),
        key,
    )
    .await;
    let slow = id_of(
        &submit_keyed(
            &app,
            &admin,
            &endpoint,
            json!({ "n": 1, "delayMs": 1500 }),
            key,
        )
        .await,
    );
    crate::support::fixtures::eventually(
        "the second is in flight",
        Duration::from_secs(10),
        || async { receiver.in_flight("rejoin") == 1 },
    )
    .await;
    replay(&app, &admin, &first).await;
    let rejoined = read(&app, &admin, &first).await;
    assert_eq!(rejoined["waitingBehind"]["id"], slow.as_str(), "{rejoined}");
    assert_eq!(rejoined["nextAttemptAt"], json!(null));
    let last = id_of(&submit_keyed(&app, &admin, &endpoint, json!({ "n": 2 }), key).await);
    let ids = [first, slow, last];
    all_settled(&app, &admin, &ids, Duration::from_secs(20)).await;
    assert_eq!(
        states(&app, &admin, &ids).await,
        ["DELIVERED", "DELIVERED", "DELIVERED"]
    );
    assert_eq!(
        arrivals_by_key(&receiver, "rejoin")["account-3"],
        [0, 1, 0, 2]
    );
}

/// A replayed delivery submitted before the line's head becomes the head when that head is
/// only waiting for its next retry: it goes out at once, and the head waits behind it, then
/// gets its line back due at the retry it was waiting for. (It used to go at once, spending
/// an attempt of its cycle on every hand-back: a few replays on a line whose head kept
/// failing sent that head to `FAILED` in seconds.)
async fn a_replayed_earliest_delivery_takes_over_from_a_head_between_retries(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let app = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(2);
        config.retry_base_ms = Some(50);
    })
    .await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "takeover").await;
    let key = Some("order-8");
    let first = failed_keyed(
        &app,
        &admin,
        &endpoint,
        // Slow to answer its replay, so the head it takes over from is still seen
        // waiting behind it when read (an answer within a loaded machine's read
        // let the line move on before it).
        json!({ "n": 0, "failFirst": 2, "successDelayMs": 4_000 }),
        key,
    )
    .await;
    // The next one fails once and then waits a while for its retry: longer than the
    // replayed one takes to answer.
    let app_slow = TestApp::spawn_with(&db, |config| {
        quick_worker(config);
        config.max_attempts = Some(2);
        config.retry_base_ms = Some(8_000);
        config.request_timeout_ms = 10_000;
    })
    .await;
    app.stop().await;
    let second = id_of(
        &submit_keyed(
            &app_slow,
            &admin,
            &endpoint,
            json!({ "n": 1, "failFirst": 1 }),
            key,
        )
        .await,
    );
    crate::support::fixtures::eventually(
        "the head waits for its retry",
        Duration::from_secs(10),
        || async {
            let head = read(&app_slow, &admin, &second).await;
            head["state"] == "PENDING"
                && !head["nextAttemptAt"].is_null()
                && receiver.received().len() == 3
        },
    )
    .await;
    let retry_at = read(&app_slow, &admin, &second).await["nextAttemptAt"]
        .as_str()
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .expect("the head's retry time");
    replay(&app_slow, &admin, &first).await;
    let demoted = read(&app_slow, &admin, &second).await;
    assert_eq!(demoted["waitingBehind"]["id"], first.as_str(), "{demoted}");
    assert_eq!(demoted["nextAttemptAt"], json!(null));
    let ids = [first, second];
    all_settled(&app_slow, &admin, &ids, Duration::from_secs(25)).await;
    let (retried, _) = attempt_times(&app_slow, &admin, &ids[1], 2).await;
    assert!(
        retried >= retry_at,
        "handed back, it kept its retry time {retry_at}, not {retried}"
    );
    assert_eq!(
        states(&app_slow, &admin, &ids).await,
        ["DELIVERED", "DELIVERED"]
    );
    assert_eq!(
        arrivals_by_key(&receiver, "takeover")["order-8"],
        [0, 0, 1, 0, 1],
        "the replayed one first, then the head it took over from"
    );
}

/// Four slow lines and unkeyed deliveries on one endpoint: the lines run side by side, one
/// request each at a time; the unkeyed ones wait for none of them; every keyed webhook
/// names its key in `webhook-ordering-key` (percent-encoded where it must be).
async fn lines_run_side_by_side_and_unkeyed_traffic_never_waits(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let app = TestApp::spawn_with(&db, patient_worker).await;
    let admin = app.admin_token().await;
    let endpoint = endpoint_on(&app, &admin, &receiver, "mixed").await;
    let keys = ["a", "b", "c", "order 7"];
    let mut ids = Vec::new();
    for n in 0..3 {
        for key in keys {
            let payload = json!({ "n": n, "delayMs": 600 });
            ids.push(id_of(
                &submit_keyed(&app, &admin, &endpoint, payload, Some(key)).await,
            ));
        }
    }
    for n in 100..106 {
        let payload = json!({ "n": n, "delayMs": 100 });
        ids.push(id_of(
            &submit_keyed(&app, &admin, &endpoint, payload, None).await,
        ));
    }
    all_settled(&app, &admin, &ids, Duration::from_secs(30)).await;
    let lines = arrivals_by_key(&receiver, "mixed");
    let sent_keys: Vec<&str> = lines.keys().map(String::as_str).collect();
    assert_eq!(sent_keys, ["a", "b", "c", "order%207"]);
    for (key, arrivals) in &lines {
        assert_eq!(arrivals, &[0, 1, 2], "{key}");
        assert_eq!(receiver.most_in_flight_of_line("mixed", key), 1, "{key}");
    }
    let received = receiver.received();
    let unkeyed_last = received
        .iter()
        .filter(|r| r.ordering_key.is_none())
        .map(|r| r.at)
        .max()
        .expect("unkeyed arrivals");
    assert_eq!(
        received.iter().filter(|r| r.ordering_key.is_none()).count(),
        6
    );
    for key in lines.keys() {
        let second = received
            .iter()
            .filter(|r| r.ordering_key.as_deref() == Some(key.as_str()))
            .nth(1)
            .expect("a second arrival")
            .at;
        assert!(
            unkeyed_last < second,
            "the unkeyed deliveries went out while line {key} still had its first in flight"
        );
    }
    assert!(
        receiver.most_in_flight("mixed") >= 4,
        "the four lines were in flight together: {}",
        receiver.most_in_flight("mixed")
    );
}

/// An event published with an ordering key lines up separately at each endpoint it reaches.
async fn a_published_event_lines_up_at_each_endpoint(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = obedient_receiver().await;
    let app = TestApp::spawn_with(&db, patient_worker).await;
    let admin = app.admin_token().await;
    endpoint_on(&app, &admin, &receiver, "first").await;
    endpoint_on(&app, &admin, &receiver, "second").await;
    for n in 0..6 {
        let input = json!({
            "eventType": "order.updated",
            "payload": { "n": n, "flaky": true, "delayMs": 10 },
            "orderingKey": "order-1",
        });
        let body = app
            .graphql(&admin, PUBLISH, json!({ "input": input }))
            .await;
        assert!(body["errors"].is_null(), "{body}");
    }
    crate::support::fixtures::eventually(
        "all twelve delivered",
        Duration::from_secs(30),
        || async {
            count(
                &app.state.db,
                "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'delivered'",
                vec![],
            )
            .await
                == 12
        },
    )
    .await;
    for path in ["first", "second"] {
        let mut arrivals = arrivals_by_key(&receiver, path)["order-1"].clone();
        assert!(
            arrivals.windows(2).all(|pair| pair[0] <= pair[1]),
            "{path}: {arrivals:?}"
        );
        arrivals.dedup();
        assert_eq!(arrivals, [0, 1, 2, 3, 4, 5], "{path}");
    }
}

/// An ordering key of no characters, of more than 255, with a control character or
/// beginning with `courier.` (the prefix of Courier's own events' lines) is
/// `BAD_USER_INPUT` for `submit` and `publish`, and nothing is written; a repeat of an
/// idempotent submit with another ordering key is a conflict, with the same key a repeat.
async fn bad_ordering_keys_change_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let (endpoint, _) = app
        .create_endpoint(&admin, "https://example.com/hook")
        .await;
    let long = "k".repeat(256);
    let theirs = format!("courier.endpoint.{endpoint}");
    for key in ["", long.as_str(), "line\u{7}break", theirs.as_str()] {
        let input = json!({ "endpointId": endpoint, "payload": {}, "orderingKey": key });
        let body = app
            .graphql(
                &admin,
                crate::support::ordering::SUBMIT_KEYED,
                json!({ "input": input }),
            )
            .await;
        assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
        let input = json!({ "eventType": "order.paid", "payload": {}, "orderingKey": key });
        let body = app
            .graphql(&admin, PUBLISH, json!({ "input": input }))
            .await;
        assert_eq!(gql_error_code(&body), Some("BAD_USER_INPUT"), "{body}");
    }
    assert_eq!(row_counts(&app).await, (0, 0));
    let longest = "é".repeat(255);
    let submit = |key: String| {
        let input = json!({
            "endpointId": endpoint, "payload": { "a": 1 },
            "idempotencyKey": "once", "orderingKey": key,
        });
        let app = &app;
        let admin = &admin;
        async move {
            app.graphql(
                admin,
                crate::support::ordering::SUBMIT_KEYED,
                json!({ "input": input }),
            )
            .await
        }
    };
    let first = submit(longest.clone()).await;
    assert_eq!(first["data"]["submit"]["created"], true, "{first}");
    let again = submit(longest.clone()).await;
    assert_eq!(again["data"]["submit"]["created"], false, "{again}");
    let other = submit("another".into()).await;
    assert_eq!(
        gql_error_code(&other),
        Some("IDEMPOTENCY_CONFLICT"),
        "{other}"
    );
    assert_eq!(row_counts(&app).await, (1, 1));

    // A submission stored with a `courier.` key before that prefix was reserved: a repeat
    // still gets it back, rather than a refusal its sender would take for a failure.
    let reserved = "courier.stored-before";
    for table in ["submissions", "webhook_deliveries"] {
        crate::support::fixtures::rows(
            &app.state.db,
            &format!("UPDATE {table} SET ordering_key = $1"),
            vec![reserved.into()],
        )
        .await;
    }
    let repeated = submit(reserved.into()).await;
    assert_eq!(repeated["data"]["submit"]["created"], false, "{repeated}");
    assert_eq!(row_counts(&app).await, (1, 1));
}

on_both_backends!(
    a_line_arrives_in_order_through_failures,
    the_head_holds_its_line_until_it_fails,
    a_replayed_delivery_rejoins_its_line,
    a_replayed_earliest_delivery_takes_over_from_a_head_between_retries,
    lines_run_side_by_side_and_unkeyed_traffic_never_waits,
    a_published_event_lines_up_at_each_endpoint,
    bad_ordering_keys_change_nothing,
);
