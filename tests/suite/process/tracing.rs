//! Traces, end to end: a real `courier serve` exporting OTLP/HTTP protobuf to a real
//! collector, decoded here. A submit's span and the spans of its attempts are one trace,
//! under the caller's own trace when it sends one, and every webhook carries its
//! attempt's `traceparent`. A collector that never answers fails and holds up nothing; with
//! no collector nothing is traced or stored.

use std::time::Duration;

use sea_orm::{ConnectionTrait, Statement};
use serde_json::json;

use crate::on_both_backends;
use crate::support::collector::{
    dead_collector, CollectedSpan, Collector, KIND_CLIENT, KIND_SERVER, STATUS_ERROR,
};
use crate::support::process::{admin_token, Served};
use crate::support::websocket::{initialised_at, next, send};
use crate::support::{Backend, Receiver, Reply, TestDb};

const SUBMIT: &str = "mutation Deliver($id: ID!, $p: JSON!) { submit(input: {endpointId: $id, payload: $p}) { delivery { id } } }";
const PUBLISH: &str = "mutation($p: JSON!) { publish(input: {eventType: \"order.paid\", payload: $p}) { event { id } } }";

/// A caller's own trace context, as an instrumented partner backend would send it.
const CALLER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER_SPAN: &str = "b7ad6b7169203331";

/// A traced process: worker on, quick polling, one retry 100 ms after a failure, spans
/// exported every 100 ms to `collector`, then `settings`. Courier's debug spans are logged,
/// as an operator chasing a problem would have them: they must not change what is traced.
fn traced(db: &TestDb, collector: &str, settings: &[(&str, &str)]) -> Served {
    let mut all = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", collector)];
    all.extend_from_slice(&delivering(settings));
    Served::start(&db.url, &all)
}

/// The settings of a delivering process, traced or not, then `settings`.
fn delivering<'a>(settings: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all = vec![
        ("RUST_LOG", "info,courier=debug"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("COURIER_WORKER_CONCURRENCY", "4"),
        ("COURIER_POLL_INTERVAL_MS", "100"),
        ("COURIER_RETRY_SCHEDULE", "100ms"),
    ];
    all.extend_from_slice(settings);
    all
}

fn named<'a>(spans: &'a [CollectedSpan], name: &str) -> Vec<&'a CollectedSpan> {
    spans.iter().filter(|span| span.name == name).collect()
}

/// The trace id and span id of a `traceparent`.
fn ids_of(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {traceparent:?}");
    assert_eq!(parts[0], "00", "version of {traceparent:?}");
    assert_eq!(parts[3], "01", "sampled flag of {traceparent:?}");
    (parts[1].to_owned(), parts[2].to_owned())
}

async fn stored_trace_context(db: &TestDb, delivery_id: &str) -> Option<String> {
    let pool = db.connect(1).await;
    let backend = pool.backend();
    let row = pool
        .conn()
        .query_one_raw(Statement::from_sql_and_values(
            backend,
            "SELECT s.trace_context FROM submissions s \
             JOIN webhook_deliveries d ON d.submission_id = s.id WHERE d.id = $1",
            [uuid::Uuid::parse_str(delivery_id).expect("uuid").into()],
        ))
        .await
        .expect("query")
        .expect("the delivery's submission");
    let context: Option<String> = row.try_get("", "trace_context").expect("column");
    pool.close().await.expect("close");
    context
}

/// A submit sent with the caller's `traceparent` and `tracestate`; its first attempt is
/// answered 500, the retry 200. The operation's span continues the caller's trace; each
/// attempt's span is its child and links to it; each webhook carries its own attempt's
/// context, with the caller's trace state.
async fn a_submit_and_its_attempts_are_one_trace(backend: Backend) {
    let db = TestDb::new(backend).await;
    let collector = Collector::start().await;
    let receiver = Receiver::start(|nth| Reply::status(if nth == 1 { 500 } else { 200 })).await;
    let process = traced(&db, collector.url(), &[]);
    let token = admin_token(&db).await;
    let endpoint = process.create_endpoint(&token, &receiver, "r", &[]).await;

    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let submitted = process
        .graphql_with_headers(
            &token,
            SUBMIT,
            json!({ "id": endpoint, "p": { "order": 1 } }),
            &[("traceparent", &caller), ("tracestate", "vendor=abc")],
        )
        .await;
    let delivery_id = submitted["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("submit: {submitted}"))
        .to_owned();
    let received = receiver.wait_for(2, Duration::from_secs(20)).await;
    assert!(received
        .iter()
        .all(|r| r.verified && r.webhook_id == delivery_id));

    let spans = collector
        .wait_until(Duration::from_secs(20), |spans| {
            named(spans, "mutation Deliver").len() == 1
                && named(spans, "webhook attempt").len() == 2
        })
        .await;
    let operation = named(&spans, "mutation Deliver")[0];
    assert_eq!(operation.kind, KIND_SERVER);
    assert_eq!(operation.service_name, "courier");
    assert_eq!(
        operation.trace_id, CALLER_TRACE,
        "the caller's trace goes on"
    );
    assert_eq!(operation.parent_span_id, CALLER_SPAN);
    assert_eq!(operation.attributes["graphql.operation.type"], "mutation");
    assert_eq!(operation.attributes["graphql.operation.name"], "Deliver");
    assert!(collector
        .content_types()
        .iter()
        .all(|content_type| content_type == "application/x-protobuf"));

    let mut attempts = named(&spans, "webhook attempt");
    attempts.sort_by_key(|span| span.attributes["courier.attempt"].clone());
    for (attempt, (span, webhook)) in attempts.iter().zip(&received).enumerate() {
        assert_eq!(span.kind, KIND_CLIENT);
        assert_eq!(
            span.trace_id, CALLER_TRACE,
            "one trace from submit to attempt"
        );
        assert_eq!(
            span.parent_span_id, operation.span_id,
            "a child of the submit"
        );
        assert_eq!(
            span.links,
            vec![(operation.trace_id.clone(), operation.span_id.clone())],
            "linked to the submit"
        );
        assert_eq!(span.attributes["courier.delivery.id"], delivery_id);
        assert_eq!(
            span.int_attributes.get("courier.attempt"),
            Some(&(attempt as i64 + 1)),
            "the attempt's number, as an integer"
        );
        assert_eq!(span.attributes["server.address"], "127.0.0.1");
        let traceparent = webhook
            .traceparent
            .as_deref()
            .expect("the webhook's traceparent");
        assert_eq!(
            ids_of(traceparent),
            (CALLER_TRACE.to_owned(), span.span_id.clone())
        );
        assert_eq!(webhook.tracestate.as_deref(), Some("vendor=abc"));
    }
    assert_eq!(
        attempts[0].int_attributes.get("http.response.status_code"),
        Some(&500)
    );
    assert_eq!(attempts[0].status_code, STATUS_ERROR);
    assert_eq!(
        attempts[1].int_attributes.get("http.response.status_code"),
        Some(&200)
    );
    assert_ne!(attempts[1].status_code, STATUS_ERROR);

    assert_eq!(
        stored_trace_context(&db, &delivery_id).await,
        Some(format!(
            "00-{CALLER_TRACE}-{}-01\nvendor=abc",
            operation.span_id
        )),
        "the submission keeps the context its attempts link to"
    );
}

/// A publish with no caller context starts a trace of its own, which the attempts at every
/// endpoint it reaches join; `OTEL_SERVICE_NAME` names the service. A subscription watching
/// it all has no span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_event_traces_to_every_endpoint_it_reaches() {
    let db = TestDb::new(Backend::Postgres).await;
    let collector = Collector::start().await;
    let receiver = Receiver::accepting().await;
    let process = traced(
        &db,
        collector.url(),
        &[("OTEL_SERVICE_NAME", "courier-east")],
    );
    let token = admin_token(&db).await;
    process
        .create_endpoint(&token, &receiver, "a", &["order.paid"])
        .await;
    process
        .create_endpoint(&token, &receiver, "b", &["order.paid"])
        .await;

    // A dashboard watching: its subscription is executed once per change it is sent.
    let mut watching = initialised_at(&process.addr, "graphql-transport-ws", &token).await;
    let watch = "subscription Watch { deliveryStateChanged { deliveryId state } }";
    let subscribe = json!({ "id": "w", "type": "subscribe", "payload": { "query": watch } });
    send(&mut watching, subscribe).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let published = process
        .graphql(&token, PUBLISH, json!({ "p": { "order": 7 } }))
        .await;
    assert!(
        published["data"]["publish"]["event"]["id"].is_string(),
        "{published}"
    );
    let received = receiver.wait_for(2, Duration::from_secs(20)).await;
    let mut delivered = 0;
    while delivered < 2 {
        let change = next(&mut watching).await.expect("a change");
        if change["payload"]["data"]["deliveryStateChanged"]["state"] == "DELIVERED" {
            delivered += 1;
        }
    }
    // Spans go out in the order they end: once this one is in, any span of the
    // subscription's events would be too.
    process
        .graphql(&token, "query Marker { __typename }", json!({}))
        .await;

    let spans = collector
        .wait_until(Duration::from_secs(20), |spans| {
            named(spans, "mutation publish").len() == 1
                && named(spans, "webhook attempt").len() == 2
                && named(spans, "query Marker").len() == 1
        })
        .await;
    assert!(
        named(&spans, "subscription Watch").is_empty(),
        "a subscription has no span, not one per event"
    );
    let operation = named(&spans, "mutation publish")[0];
    assert_eq!(operation.service_name, "courier-east");
    assert_eq!(operation.parent_span_id, "", "a trace of its own");
    let attempts = named(&spans, "webhook attempt");
    for span in &attempts {
        assert_eq!(span.service_name, "courier-east");
        assert_eq!(span.trace_id, operation.trace_id);
        assert_eq!(span.parent_span_id, operation.span_id);
    }
    let mut endpoints: Vec<&String> = attempts
        .iter()
        .map(|span| &span.attributes["courier.endpoint.id"])
        .collect();
    endpoints.sort();
    endpoints.dedup();
    assert_eq!(endpoints.len(), 2, "one attempt span per endpoint");
    for webhook in &received {
        let (trace, span) = ids_of(webhook.traceparent.as_deref().expect("traceparent"));
        assert_eq!(trace, operation.trace_id);
        assert!(attempts.iter().any(|attempt| attempt.span_id == span));
    }
}

/// Exports to a collector that accepts connections and never answers time out on the
/// exporter's own thread, and the small queue overflows: every submit still answers and
/// every webhook still goes out, each with its trace context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_fails_and_holds_up_nothing() {
    let db = TestDb::new(Backend::Postgres).await;
    let (dead, _stop) = dead_collector().await;
    let receiver = Receiver::accepting().await;
    let process = traced(
        &db,
        &dead,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "8"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4"),
        ],
    );
    let token = admin_token(&db).await;
    let endpoint = process.create_endpoint(&token, &receiver, "r", &[]).await;

    const SUBMISSIONS: usize = 40;
    let mut slowest = Duration::ZERO;
    for n in 0..SUBMISSIONS {
        let sent = std::time::Instant::now();
        let submitted = process
            .graphql(&token, SUBMIT, json!({ "id": endpoint, "p": { "n": n } }))
            .await;
        slowest = slowest.max(sent.elapsed());
        assert!(
            submitted["data"]["submit"]["delivery"]["id"].is_string(),
            "submit {n}: {submitted}"
        );
    }
    // A bound, not a measurement: an export that held a request up would take its 10 s
    // timeout (the cost itself is measured in the bench).
    assert!(
        slowest < Duration::from_secs(5),
        "a submit waited on the dead collector: {slowest:?}"
    );
    let received = receiver
        .wait_for(SUBMISSIONS, Duration::from_secs(30))
        .await;
    assert_eq!(received.len(), SUBMISSIONS);
    assert!(received
        .iter()
        .all(|webhook| webhook.verified && webhook.traceparent.is_some()));
}

/// A collector URL with credentials in it (`http://user:password@host/...`): they reach the
/// collector as an `Authorization: Basic` header, and the URL the process sends to (and
/// would name in an error) holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_the_collector_url_are_sent_as_a_header() {
    let db = TestDb::new(Backend::Postgres).await;
    let collector = Collector::start().await;
    let with_credentials = collector
        .url()
        .replacen("http://", "http://otel:S3CRET%21@", 1);
    let process = traced(&db, &with_credentials, &[]);
    let token = admin_token(&db).await;
    let receiver = Receiver::accepting().await;
    let endpoint = process.create_endpoint(&token, &receiver, "r", &[]).await;
    let submitted = process
        .graphql(&token, SUBMIT, json!({ "id": endpoint, "p": { "n": 1 } }))
        .await;
    assert!(submitted["errors"].is_null(), "{submitted}");
    collector
        .wait_until(Duration::from_secs(20), |spans| {
            !named(spans, "webhook attempt").is_empty()
        })
        .await;
    use base64::Engine as _;
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("otel:S3CRET!")
    );
    let authorizations = collector.authorizations();
    assert!(
        !authorizations.is_empty() && authorizations.iter().all(|sent| *sent == expected),
        "{authorizations:?}"
    );
}

/// With no collector configured (the default) nothing is traced: a caller's
/// `traceparent` is not carried on, no webhook has one, and no context is stored.
async fn without_a_collector_nothing_is_traced(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::accepting().await;
    let process = Served::start(&db.url, &delivering(&[]));
    let token = admin_token(&db).await;
    let endpoint = process.create_endpoint(&token, &receiver, "r", &[]).await;
    let submitted = process
        .graphql_with_headers(
            &token,
            SUBMIT,
            json!({ "id": endpoint, "p": { "n": 1 } }),
            &[(
                "traceparent",
                &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"),
            )],
        )
        .await;
    let delivery_id = submitted["data"]["submit"]["delivery"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("submit: {submitted}"))
        .to_owned();
    let received = receiver.wait_for(1, Duration::from_secs(20)).await;
    assert!(received[0].verified);
    assert_eq!(received[0].traceparent, None);
    assert_eq!(stored_trace_context(&db, &delivery_id).await, None);
}

/// A `traceparent` not written as W3C Trace Context requires (ids short of their digits,
/// which a lenient reader pads with zeros) is ignored: the submit starts a trace of its
/// own, and its webhook carries that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_starts_a_trace_of_its_own() {
    let db = TestDb::new(Backend::Sqlite).await;
    let collector = Collector::start().await;
    let receiver = Receiver::accepting().await;
    let process = traced(&db, collector.url(), &[]);
    let token = admin_token(&db).await;
    let endpoint = process.create_endpoint(&token, &receiver, "r", &[]).await;
    let malformed = [
        "00-1-2-01".to_owned(),
        format!("00-{}-{CALLER_SPAN}-01", &CALLER_TRACE[2..]),
        format!("00-{CALLER_TRACE}-{}-01", &CALLER_SPAN[2..]),
    ];
    for traceparent in &malformed {
        let submitted = process
            .graphql_with_headers(
                &token,
                SUBMIT,
                json!({ "id": endpoint, "p": { "traceparent": traceparent } }),
                &[("traceparent", traceparent)],
            )
            .await;
        assert!(
            submitted["data"]["submit"]["delivery"]["id"].is_string(),
            "submit: {submitted}"
        );
    }
    let received = receiver
        .wait_for(malformed.len(), Duration::from_secs(20))
        .await;
    let spans = collector
        .wait_until(Duration::from_secs(20), |spans| {
            named(spans, "mutation Deliver").len() == malformed.len()
        })
        .await;
    let mut traces = Vec::new();
    for operation in named(&spans, "mutation Deliver") {
        assert_eq!(operation.parent_span_id, "", "a root span: {operation:?}");
        let padded = [
            format!("{:0>32}", "1"),
            format!("00{}", &CALLER_TRACE[2..]),
            CALLER_TRACE.to_owned(),
        ];
        assert!(
            !padded.contains(&operation.trace_id),
            "not the caller's ids, padded or not: {operation:?}"
        );
        traces.push(operation.trace_id.clone());
    }
    for webhook in &received {
        let (trace, _) = ids_of(webhook.traceparent.as_deref().expect("traceparent"));
        assert!(traces.contains(&trace), "{trace} is one of {traces:?}");
    }
    traces.sort();
    traces.dedup();
    assert_eq!(traces.len(), malformed.len(), "a trace each");
}

on_both_backends!(
    a_submit_and_its_attempts_are_one_trace,
    without_a_collector_nothing_is_traced,
);
