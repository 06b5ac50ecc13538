//! Courier's spans, made only while tracing is on: one per GraphQL operation and one per
//! delivery attempt, the attempt a child of (and linked to) the request that submitted it.

use opentelemetry::trace::{Status, TraceContextExt as _};
use opentelemetry::Context;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use uuid::Uuid;

use super::context::{self, enabled};

/// The `tracing` target of every exported span: the trace layer takes these and no others.
pub const TARGET: &str = "courier::trace";

/// A span for one GraphQL operation, named like `mutation submit` (OpenTelemetry's
/// GraphQL conventions), under the caller's trace context when it sent one.
pub fn operation(kind: &str, name: Option<&str>, parent: Option<&Context>) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span_name = match name {
        Some(name) => format!("{kind} {name}"),
        None => kind.to_owned(),
    };
    let span = tracing::info_span!(
        target: TARGET,
        "graphql.operation",
        otel.name = %span_name,
        otel.kind = "server",
        "graphql.operation.type" = kind,
        "graphql.operation.name" = name,
    );
    if let Some(parent) = parent {
        let _ = span.set_parent(parent.clone());
    }
    span
}

/// Marks an operation's span failed with its first error's message.
pub fn operation_failed(span: &Span, message: &str) {
    span.set_status(Status::error(message.to_owned()));
}

/// What an attempt span is about.
#[derive(Debug, Clone, Copy)]
pub struct AttemptSpan<'a> {
    /// The delivery (also the `webhook-id`).
    pub delivery_id: Uuid,
    /// The endpoint it goes to.
    pub endpoint_id: Uuid,
    /// Which attempt of the cycle this is, from 1.
    pub attempt: u32,
    /// The endpoint's URL (only its host is recorded: a query may carry a token).
    pub url: &'a str,
    /// The trace context stored with the submission, if it was made while tracing.
    pub submitted_in: Option<&'a str>,
}

/// A client span for one delivery attempt, and the trace headers its webhook carries
/// (`traceparent`, and the submitter's `tracestate` if it sent one). The
/// submitting request's span, when stored, is its parent (so the whole story of a
/// delivery is one trace) and its link; `(Span::none(), None)` while tracing is off.
pub fn attempt(about: AttemptSpan<'_>) -> (Span, Option<context::TraceHeaders>) {
    if !enabled() {
        return (Span::none(), None);
    }
    let url = url::Url::parse(about.url).ok();
    let span = tracing::info_span!(
        target: TARGET,
        "webhook.attempt",
        otel.name = "webhook attempt",
        otel.kind = "client",
        "http.request.method" = "POST",
        "server.address" = url.as_ref().and_then(url::Url::host_str),
        "courier.delivery.id" = %about.delivery_id,
        "courier.endpoint.id" = %about.endpoint_id,
        "courier.attempt" = i64::from(about.attempt),
    );
    if let Some(submitted) = about.submitted_in.and_then(context::parse) {
        let _ = span.set_parent(Context::new().with_remote_span_context(submitted.clone()));
        span.add_link(submitted);
    }
    let headers = context::headers(span.context().span().span_context());
    (span, headers)
}

/// Records an attempt's answer on its span: the status code, and an error status unless
/// the receiver answered 2xx.
pub fn attempt_finished(span: &Span, status: Option<u16>, error: Option<&str>) {
    if let Some(status) = status {
        span.set_attribute("http.response.status_code", i64::from(status));
    }
    match (status, error) {
        (Some(200..=299), _) => {}
        (_, Some(error)) => span.set_status(Status::error(error.to_owned())),
        (Some(status), None) => span.set_status(Status::error(format!("HTTP {status}"))),
        (None, None) => span.set_status(Status::error("no answer")),
    }
}
