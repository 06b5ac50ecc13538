//! Where traces go and how they are batched: the OpenTelemetry variables, read as settings.

use std::time::Duration;

use clap::Args;

/// Where traces go: OTLP over HTTP/protobuf, with the OpenTelemetry variables' names. A
/// variable set but empty counts as unset, as OpenTelemetry's SDKs read them.
#[derive(Debug, Clone, Args)]
pub struct TracingArgs {
    /// The collector's base URL (traces are sent to `<URL>/v1/traces`). Unset: no
    /// tracing, and no cost.
    /// (Its value is never shown in `--help`: it may hold a password.)
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", hide_env_values = true, value_parser = parse_collector_url, global = true)]
    pub otlp_endpoint: Option<CollectorUrl>,

    /// The full URL traces are sent to, instead of the one `--otlp-endpoint` gives.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", hide_env_values = true, value_parser = parse_collector_url, global = true)]
    pub otlp_traces_endpoint: Option<CollectorUrl>,

    /// The `service.name` spans are exported under [default: the `service.name` of
    /// `OTEL_RESOURCE_ATTRIBUTES`, else `courier`].
    #[arg(long, env = "OTEL_SERVICE_NAME", global = true)]
    pub otel_service_name: Option<String>,

    /// Spans kept waiting for export at most, 1 to 1,000,000; past it, new spans are
    /// dropped [default: 2048].
    #[arg(long, env = "OTEL_BSP_MAX_QUEUE_SIZE", value_parser = batch_setting(MAX_QUEUED_SPANS), global = true)]
    pub otel_bsp_max_queue_size: Option<BatchSetting>,

    /// Spans sent in one export at most, 1 to 1,000,000 (no more than the queue holds)
    /// [default: 512].
    #[arg(long, env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", value_parser = batch_setting(MAX_QUEUED_SPANS), global = true)]
    pub otel_bsp_max_export_batch_size: Option<BatchSetting>,

    /// Milliseconds between exports, 1 to 86,400,000 [default: 5000].
    #[arg(long, env = "OTEL_BSP_SCHEDULE_DELAY", value_parser = batch_setting(MAX_BATCH_MILLIS), global = true)]
    pub otel_bsp_schedule_delay: Option<BatchSetting>,
}

/// The most spans `OTEL_BSP_MAX_QUEUE_SIZE` may hold (the queue is allocated whole).
const MAX_QUEUED_SPANS: u64 = 1_000_000;
/// The longest `OTEL_BSP_SCHEDULE_DELAY`: a day.
const MAX_BATCH_MILLIS: u64 = 86_400_000;

/// One `OTEL_BSP_*` number as given: `None` when the setting is empty (unset, as
/// OpenTelemetry's SDKs read it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSetting(pub Option<u64>);

/// Parses an `OTEL_BSP_*` number from 1 to `max`. OpenTelemetry's SDK would take anything
/// unreadable for its default, and allocate whatever queue it is given.
fn batch_setting(max: u64) -> impl Fn(&str) -> Result<BatchSetting, String> + Clone {
    move |text| {
        if text.is_empty() {
            return Ok(BatchSetting(None));
        }
        match text.parse::<u64>() {
            Ok(value) if (1..=max).contains(&value) => Ok(BatchSetting(Some(value))),
            _ => Err(format!("must be a whole number from 1 to {max}")),
        }
    }
}

/// A collector URL as given: `None` when the setting is empty.
#[derive(Debug, Clone)]
pub struct CollectorUrl(Option<url::Url>);

impl TracingArgs {
    /// How spans are batched for export: the `OTEL_BSP_*` settings given, the SDK's
    /// defaults for the rest.
    pub fn batch_config(&self) -> opentelemetry_sdk::trace::BatchConfig {
        let given = |setting: &Option<BatchSetting>| setting.and_then(|BatchSetting(value)| value);
        let mut config = opentelemetry_sdk::trace::BatchConfigBuilder::default();
        if let Some(spans) = given(&self.otel_bsp_max_queue_size) {
            config = config.with_max_queue_size(usize::try_from(spans).unwrap_or(usize::MAX));
        }
        if let Some(spans) = given(&self.otel_bsp_max_export_batch_size) {
            config =
                config.with_max_export_batch_size(usize::try_from(spans).unwrap_or(usize::MAX));
        }
        if let Some(millis) = given(&self.otel_bsp_schedule_delay) {
            config = config.with_scheduled_delay(Duration::from_millis(millis));
        }
        config.build()
    }

    /// The URL traces are sent to, if tracing is on.
    pub fn traces_url(&self) -> Option<String> {
        if let Some(CollectorUrl(Some(url))) = &self.otlp_traces_endpoint {
            return Some(url.to_string());
        }
        let CollectorUrl(Some(base)) = self.otlp_endpoint.as_ref()? else {
            return None;
        };
        Some(format!("{}/v1/traces", base.as_str().trim_end_matches('/')))
    }

    /// The `service.name` to export under: `OTEL_SERVICE_NAME` (or the flag), else the
    /// `service.name` that `resource_attributes` (`OTEL_RESOURCE_ATTRIBUTES`, as
    /// OpenTelemetry parses it) gives, else `courier`; a blank one counts as none.
    pub fn service_name(&self, resource_attributes: Option<String>) -> String {
        let given = |name: Option<String>| name.filter(|name| !name.trim().is_empty());
        given(self.otel_service_name.clone())
            .or_else(|| given(resource_attributes))
            .unwrap_or_else(|| "courier".to_owned())
    }
}

/// Parses a collector URL: `http` or `https`, with a host; empty is no URL.
fn parse_collector_url(text: &str) -> Result<CollectorUrl, String> {
    if text.trim().is_empty() {
        return Ok(CollectorUrl(None));
    }
    let url = url::Url::parse(text.trim()).map_err(|err| format!("not a URL: {err}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err("must be an http or https URL with a host".to_owned());
    }
    Ok(CollectorUrl(Some(url)))
}
