//! Logs and traces: structured `tracing` to stderr (text or JSON, filtered by `RUST_LOG`),
//! and, when a collector is configured, OpenTelemetry spans exported over OTLP.
//!
//! Tracing is off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and costs nothing then: no
//! span is made (see [`context::enabled`]) and nothing is stored with a submission.

mod collector_url;
pub mod context;
mod export;
mod headers;
mod resource;
pub mod sink;
pub mod spans;
pub mod throttle;

use std::io::IsTerminal as _;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::config::{LogFormat, TracingArgs};

pub use self::export::ExportError;

/// Default filter when `RUST_LOG` is unset: Courier at info, noisy dependencies at warn.
/// Per-request access lines (method, URI, status, latency) come from `tower_http` at
/// debug: `RUST_LOG=info,tower_http=debug` turns them on.
const DEFAULT_FILTER: &str = "info,sqlx=warn,sea_orm=warn,sea_orm_migration=warn,tower_http=warn";

/// What [`init`] set up; [`Telemetry::shutdown`] sends the spans still queued.
#[derive(Debug, Default)]
pub struct Telemetry {
    traces: Option<export::Traces>,
}

impl Telemetry {
    /// Exports what is queued (within a few seconds: a dead collector does not hold the
    /// exit up), stops the exporter, and writes out the log lines still queued (within a
    /// second: a log reader that stopped reading does not hold the exit up either).
    pub async fn shutdown(self) {
        if let Some(traces) = self.traces {
            traces.shutdown().await;
        }
        sink::flush();
    }
}

/// Installs the global subscriber: logs to stderr through a queue (see [`sink`]; stdout
/// stays for command output) and, with a collector configured, spans to it. A collector
/// URL that cannot be used is an error; one that is merely unreachable is not (spans are
/// dropped, never waited for).
pub fn init(format: LogFormat, tracing: &TracingArgs) -> Result<Telemetry, ExportError> {
    let (filter, unreadable) = match std::env::var("RUST_LOG") {
        Ok(value) => log_filter(Some(&value)),
        Err(std::env::VarError::NotPresent) => log_filter(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            let (filter, _) = log_filter(None);
            (filter, Some("it is not UTF-8".to_owned()))
        }
    };
    // The exported spans are not log lines, nor prefixes of them.
    let filter = match format!("{}=off", spans::TARGET).parse() {
        Ok(quiet) => filter.add_directive(quiet),
        Err(_) => filter,
    };
    let logs = tracing_subscriber::fmt::layer()
        // Colours only for a person at a terminal: files, pipes and journals get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(sink::LogSink);
    let logs = match format {
        LogFormat::Text => logs.boxed(),
        LogFormat::Json => logs.json().flatten_event(true).boxed(),
    };
    let traces = tracing
        .traces_url()
        .map(|url| {
            let service_name = tracing.service_name(resource::service_name_in_env());
            export::Traces::start(&url, &service_name, tracing.batch_config())
                .map(|traces| (traces, url, service_name))
        })
        .transpose()?;
    let spans = traces.as_ref().map(|(traces, _, _)| traces.layer());
    sink::start();
    let _ = tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(spans)
        .try_init();
    // Said once logging works, so that an operator can see tracing is on, and where to.
    let traces = traces.map(|(traces, url, service_name)| {
        let url = collector_url::shown(&url);
        tracing::info!(%url, service_name, "exporting traces over OTLP/HTTP");
        context::enable();
        traces
    });
    if traces.is_some() {
        if let (_, Some(reason)) = resource::from_env() {
            tracing::warn!(%reason,
                "OTEL_RESOURCE_ATTRIBUTES cannot be read; none of its attributes are used");
        }
        if let Some((variable, unusable)) = headers::unusable_in_env() {
            for reason in unusable {
                tracing::warn!(%reason, "an entry of {variable} is not sent with exports");
            }
        }
    }
    if let Some(err) = unreadable {
        tracing::warn!(error = %err, default = DEFAULT_FILTER,
            "RUST_LOG cannot be read; logging with the default filter");
    }
    Ok(Telemetry { traces })
}

/// The log filter `RUST_LOG` asks for, or the default when it is unset or blank; one that
/// cannot be read falls back to the default too, with the reason (to be logged once logging
/// works).
fn log_filter(rust_log: Option<&str>) -> (EnvFilter, Option<String>) {
    match rust_log.map(str::trim).filter(|value| !value.is_empty()) {
        None => (EnvFilter::new(DEFAULT_FILTER), None),
        Some(value) => match EnvFilter::try_new(value) {
            Ok(filter) => (filter, None),
            Err(err) => (EnvFilter::new(DEFAULT_FILTER), Some(err.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_rust_log_falls_back_to_the_default_and_says_why() {
        let (filter, why) = log_filter(Some("info,tower_http=debug"));
        assert!(why.is_none());
        assert!(filter.to_string().contains("tower_http=debug"), "{filter}");
        let (filter, why) = log_filter(Some("  "));
        assert!(why.is_none());
        assert_eq!(
            filter.to_string(),
            EnvFilter::new(DEFAULT_FILTER).to_string()
        );
        let (filter, why) = log_filter(Some("courier=loud"));
        assert!(why.is_some(), "an unknown level is refused");
        assert_eq!(
            filter.to_string(),
            EnvFilter::new(DEFAULT_FILTER).to_string()
        );
    }
}
