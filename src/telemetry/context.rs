//! The W3C trace context: whether tracing is on, the `traceparent` (and `tracestate`) of
//! the span a request runs in (stored with what it submits), and reading one back, from a
//! stored value or from a caller's request headers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The header a webhook carries its attempt's trace context in, and a caller its own.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// The header that carries vendors' trace state along with [`TRACEPARENT_HEADER`].
pub const TRACESTATE_HEADER: &str = "tracestate";

/// A span context as W3C headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHeaders {
    /// The `traceparent` value.
    pub traceparent: String,
    /// The `tracestate` value, when the context carries any.
    pub tracestate: Option<String>,
}

/// `context` as W3C headers, if it is a valid context.
pub fn headers(context: &SpanContext) -> Option<TraceHeaders> {
    let traceparent = traceparent(context)?;
    let tracestate = Some(context.trace_state().header()).filter(|state| !state.is_empty());
    Some(TraceHeaders {
        traceparent,
        tracestate,
    })
}

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported. When not, no span is made and no context is stored.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Turns tracing on (once the exporter runs).
pub(super) fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// `context` as a `traceparent` value (version `00`), if it is a valid context.
pub fn traceparent(context: &SpanContext) -> Option<String> {
    context.is_valid().then(|| {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        )
    })
}

/// The trace context of the span the caller runs in, to store with what it makes: its
/// `traceparent`, then, when it carries a `tracestate`, a newline and that (neither may
/// hold one). `None` when tracing is off or there is no span.
pub fn current_trace_context() -> Option<String> {
    if !enabled() {
        return None;
    }
    // The OpenTelemetry context, not the current `tracing` span's: a debug span that only
    // the logs record (when `RUST_LOG` enables it) may be current, and it has none.
    let context = Context::current();
    let headers = headers(context.span().span_context())?;
    Some(match headers.tracestate {
        Some(state) => format!("{}\n{state}", headers.traceparent),
        None => headers.traceparent,
    })
}

/// The span context a stored trace context (see [`current_trace_context`]) names, with
/// its trace state, if it parses.
pub fn parse(stored: &str) -> Option<SpanContext> {
    let (traceparent, tracestate) = stored.split_once('\n').unwrap_or((stored, ""));
    if !well_formed(traceparent) {
        return None;
    }
    let mut carrier = HashMap::from([(TRACEPARENT_HEADER.to_owned(), traceparent.to_owned())]);
    if !tracestate.is_empty() {
        carrier.insert(TRACESTATE_HEADER.to_owned(), tracestate.to_owned());
    }
    let context = TraceContextPropagator::new().extract(&carrier);
    let span = context.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// The caller's trace context from its request headers (`traceparent`, `tracestate`),
/// when tracing is on and it sent a valid one: the parent of the request's span.
pub fn from_headers(headers: &http::HeaderMap) -> Option<Context> {
    if !enabled() {
        return None;
    }
    let mut sent = headers.get_all(TRACEPARENT_HEADER).iter();
    let (Some(traceparent), None) = (sent.next(), sent.next()) else {
        return None;
    };
    if !traceparent.to_str().is_ok_and(well_formed) {
        return None;
    }
    let context =
        TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    context.span().span_context().is_valid().then_some(context)
}

/// Whether `traceparent` is written as W3C Trace Context requires (level 1, 3.2.2): a
/// version other than `ff`, a trace id of 32 lowercase hex digits, a parent id of 16 and
/// flags of 2, separated by dashes; version `00` ends there, a later one may go on after
/// another dash. The OpenTelemetry propagator reads ids of any length up to these and pads
/// them with zeros, so `00-1-2-01` would be a trace; the specification says to ignore it.
/// (All-zero ids are refused by the propagator, as invalid contexts.)
fn well_formed(traceparent: &str) -> bool {
    let bytes = traceparent.as_bytes();
    let hex = |from: usize, to: usize| {
        bytes
            .get(from..to)
            .is_some_and(|part| part.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
    };
    let dash = |at: usize| bytes.get(at) == Some(&b'-');
    let fields =
        hex(0, 2) && dash(2) && hex(3, 35) && dash(35) && hex(36, 52) && dash(52) && hex(53, 55);
    let end = match &bytes[..2.min(bytes.len())] {
        b"ff" => false,
        b"00" => bytes.len() == 55,
        _ => bytes.len() == 55 || dash(55),
    };
    fields && end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_as_the_context_it_was_written_from() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = parse(text).expect("a valid traceparent");
        assert_eq!(
            format!("{:032x}", context.trace_id()),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(context.is_sampled());
        assert!(context.is_remote());
        assert_eq!(traceparent(&context).as_deref(), Some(text));
    }

    #[test]
    fn a_stored_trace_state_reads_back_with_its_context() {
        let stored =
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nvendor=abc,other=x y";
        let context = parse(stored).expect("a valid context");
        let written = headers(&context).expect("headers");
        assert_eq!(written.tracestate.as_deref(), Some("vendor=abc,other=x y"));
        let without = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("a valid context");
        assert_eq!(headers(&without).expect("headers").tracestate, None);
    }

    #[test]
    fn garbage_and_all_zero_ids_are_no_context() {
        for text in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert!(parse(text).is_none(), "{text:?} should not parse");
        }
    }

    #[test]
    fn only_a_traceparent_written_as_the_specification_says_is_read() {
        let valid = [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            // A later version may carry more after a dash.
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for text in valid {
            assert!(well_formed(text), "{text:?} refused");
        }
        let malformed = [
            "00-1-2-01",
            // Ids short by two digits each.
            "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01more",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "0",
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
        ];
        for text in malformed {
            assert!(!well_formed(text), "{text:?} accepted");
            assert!(parse(text).is_none(), "{text:?} parsed");
        }
    }

    #[test]
    fn nothing_is_captured_while_tracing_is_off() {
        assert!(!enabled());
        assert_eq!(current_trace_context(), None);
        assert!(from_headers(&http::HeaderMap::new()).is_none());
    }
}
