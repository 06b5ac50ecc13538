//! A real OTLP/HTTP trace collector: it accepts `POST /v1/traces` in protobuf, as the
//! OpenTelemetry Collector does, decodes every export and keeps the spans; and a dead one
//! that accepts connections and never answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

/// `SpanKind` values of the OTLP protocol.
pub const KIND_SERVER: i32 = 2;
/// See [`KIND_SERVER`].
pub const KIND_CLIENT: i32 = 3;
/// `Status.code` of a span that failed.
pub const STATUS_ERROR: i32 = 2;

/// One span as the collector decoded it; ids in lowercase hex, as in `traceparent`.
#[derive(Debug, Clone)]
pub struct CollectedSpan {
    /// The exporting resource's `service.name`.
    pub service_name: String,
    pub name: String,
    pub kind: i32,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// Attribute values as text.
    pub attributes: HashMap<String, String>,
    /// The attributes whose values are integers.
    pub int_attributes: HashMap<String, i64>,
    /// Each link as `(trace id, span id)`.
    pub links: Vec<(String, String)>,
    /// `Status.code` (0 unset, 1 ok, 2 error).
    pub status_code: i32,
}

#[derive(Default)]
struct Shared {
    spans: Mutex<Vec<CollectedSpan>>,
    content_types: Mutex<Vec<String>>,
    authorizations: Mutex<Vec<String>>,
}

/// A running collector.
pub struct Collector {
    base_url: String,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
}

impl Collector {
    /// Starts a collector on a free local port.
    pub async fn start() -> Collector {
        let shared = Arc::new(Shared::default());
        let router = Router::new()
            .route("/v1/traces", post(export))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
        });
        Collector {
            base_url: format!("http://{addr}"),
            shared,
            shutdown,
        }
    }

    /// The base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it.
    pub fn url(&self) -> &str {
        &self.base_url
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.shared.spans.lock().expect("lock").clone()
    }

    /// The content type of every export received so far.
    pub fn content_types(&self) -> Vec<String> {
        self.shared.content_types.lock().expect("lock").clone()
    }

    /// The `Authorization` of every export received so far (empty when it sent none).
    pub fn authorizations(&self) -> Vec<String> {
        self.shared.authorizations.lock().expect("lock").clone()
    }

    /// Waits until `done` holds of the spans received, and returns them; panics after
    /// `timeout` with what did arrive.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        done: impl Fn(&[CollectedSpan]) -> bool,
    ) -> Vec<CollectedSpan> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the collector did not get the spans expected; it got {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn export(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    shared
        .content_types
        .lock()
        .expect("lock")
        .push(content_type);
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    shared
        .authorizations
        .lock()
        .expect("lock")
        .push(authorization);
    let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
    };
    let mut decoded = Vec::new();
    for resource_spans in request.resource_spans {
        let service_name = resource_spans
            .resource
            .map(|resource| attributes(&resource.attributes))
            .and_then(|mut attributes| attributes.remove("service.name"))
            .unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                decoded.push(CollectedSpan {
                    service_name: service_name.clone(),
                    name: span.name,
                    kind: span.kind,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    int_attributes: int_attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|link| (hex::encode(&link.trace_id), hex::encode(&link.span_id)))
                        .collect(),
                    status_code: span.status.map_or(0, |status| status.code),
                });
            }
        }
    }
    shared.spans.lock().expect("lock").extend(decoded);
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    (StatusCode::OK, protobuf, answer)
}

/// Attribute values as text (numbers and booleans as they print).
fn attributes(list: &[KeyValue]) -> HashMap<String, String> {
    list.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|value| value.value.as_ref()) {
                Some(any_value::Value::StringValue(text)) => text.clone(),
                Some(any_value::Value::IntValue(n)) => n.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                Some(any_value::Value::DoubleValue(x)) => x.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// The integer-valued attributes (a number sent as text is not among them).
fn int_attributes(list: &[KeyValue]) -> HashMap<String, i64> {
    list.iter()
        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::IntValue(n) => Some((kv.key.clone(), *n)),
            _ => None,
        })
        .collect()
}

/// A collector that accepts connections and never answers: every export waits until it
/// times out. Returns its base URL; it stops when the token is cancelled.
pub async fn dead_collector() -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            tokio::select! {
                () = stopped.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((socket, _)) => held.push(socket),
                    Err(_) => break,
                },
            }
        }
    });
    (format!("http://{addr}"), stop)
}
