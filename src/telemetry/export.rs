//! The OTLP trace pipeline: spans batched off the request path and posted as protobuf to
//! the collector by Courier's own HTTP client, on the process's runtime.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{SpanExporter, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::{BatchConfig, BatchSpanProcessor, SdkTracerProvider};
use tracing::Subscriber;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use super::collector_url::CollectorUrl;
use super::spans::TARGET;
use super::throttle::Throttle;

/// Longest one export may take, connecting included: past it the batch is dropped, and
/// the spans after it wait in the bounded queue (or are dropped when it is full).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// A failing export is told at most this often.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Longest the exit waits for queued spans to go out.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

/// Why tracing could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Tracing needs the async runtime to send from.
    #[error("tracing must be started inside the async runtime")]
    NoRuntime,
    /// The HTTP client could not be built.
    #[error("cannot build the OTLP HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    /// The exporter refused its settings (the collector URL, most likely).
    #[error("cannot set up the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The running trace pipeline.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Starts exporting to `url` (the full traces URL) as `service_name`. Batching follows
    /// the `OTEL_BSP_*` variables (by default a queue of 2,048 spans sent every 5 s), and
    /// headers `OTEL_EXPORTER_OTLP_HEADERS`.
    pub fn start(url: &str, service_name: &str, batch: BatchConfig) -> Result<Self, ExportError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ExportError::NoRuntime)?;
        crate::crypto::install_tls_provider();
        let client = reqwest::Client::builder()
            .user_agent(concat!("Courier/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(3))
            .timeout(EXPORT_TIMEOUT)
            .build()?;
        let collector = CollectorUrl::new(url);
        let exporter = SpanExporter::builder()
            .with_http()
            .with_endpoint(collector.url)
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(OnRuntime {
                client,
                runtime,
                authorization: collector.authorization,
                failures: Throttle::new(FAILURE_LOG_EVERY),
            })
            .build()?;
        let resource = super::resource::resource(service_name);
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        Ok(Traces { provider })
    }

    /// The layer that turns Courier's spans (those of [`TARGET`] only) into OpenTelemetry
    /// spans.
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
    {
        let tracer = self.provider.tracer("courier");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(Targets::new().with_target(TARGET, tracing::Level::INFO))
    }

    /// Sends what is queued, for at most [`SHUTDOWN_TIMEOUT`], and stops.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let stopped =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT))
                .await;
        if let Ok(Err(err)) = stopped {
            tracing::warn!(error = %err, "the last spans could not be exported");
        }
    }
}

/// The exporter's HTTP client: the batch processor calls it from its own thread, so each
/// request is run on the process's runtime, where reqwest's connections live.
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
    /// The credentials the collector URL held, sent as a header (see [`CollectorUrl`]);
    /// an `Authorization` in `OTEL_EXPORTER_OTLP_HEADERS` goes first.
    authorization: Option<reqwest::header::HeaderValue>,
    /// Failed exports, told at most once per [`FAILURE_LOG_EVERY`].
    failures: Throttle,
}

#[async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let mut request = reqwest::Request::try_from(request)?;
        if let Some(authorization) = &self.authorization {
            request
                .headers_mut()
                .entry(reqwest::header::AUTHORIZATION)
                .or_insert_with(|| authorization.clone());
        }
        let sent = self.runtime.spawn(async move {
            // Errors without the URL: a query string may hold a token.
            let response = client
                .execute(request)
                .await
                .map_err(reqwest::Error::without_url)?;
            let mut answer = http::Response::builder().status(response.status());
            if let Some(headers) = answer.headers_mut() {
                headers.extend(response.headers().clone());
            }
            let body = response
                .bytes()
                .await
                .map_err(reqwest::Error::without_url)?;
            Ok::<_, HttpError>(answer.body(body)?)
        });
        let answer = sent.await?;
        match &answer {
            Ok(response) if response.status().is_success() => {}
            Ok(response) => self.failed(&format!("the collector answered {}", response.status())),
            Err(err) => self.failed(&crate::error::error_chain(&**err)),
        }
        answer
    }
}

impl OnRuntime {
    /// Tells that an export failed (its spans are dropped), at most once per
    /// [`FAILURE_LOG_EVERY`], so an unreachable collector is noticed without a flood.
    fn failed(&self, reason: &str) {
        if self.failures.tell().is_some() {
            tracing::warn!(
                error = reason,
                "exporting spans failed; they are dropped (told at most once a minute)"
            );
        }
    }
}
