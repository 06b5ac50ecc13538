//! The HTTP surface: routes for the console, GraphQL (HTTP and WebSocket), health, readiness
//! and metrics.

mod body;
pub mod connections;
mod console;
pub mod cors;
mod date;
mod exposition;
mod graphql;
mod negotiate;
mod unique_members;
mod unrouted;
mod websocket;
mod ws_auth;
mod ws_close;
mod ws_gate;
mod ws_protocol;

use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use self::negotiate::MediaType;
use crate::metrics::{HttpLabels, RouteLabels};
use crate::schema::CourierSchema;
use crate::state::AppState;

/// What every handler gets: the schema and the application state.
#[derive(Clone)]
pub struct HttpState {
    /// The executable GraphQL schema.
    pub schema: CourierSchema,
    /// The application state.
    pub app: AppState,
}

/// How long `/readyz` waits for the database, and `/metrics` for the due-queue count: a
/// probe gets its answer (503 when the database is silent) well within two seconds.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The request's one `Authorization` value, if it is text; none when it sends several,
/// which would leave the caller ambiguous (and so unauthenticated).
fn authorization(headers: &axum::http::HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok(),
        _ => None,
    }
}

/// Builds the router with its limits, tracing and metrics.
pub fn router(schema: CourierSchema, app: AppState) -> Router {
    let body_limit = app.config.max_body_bytes;
    // Only the API is shared with other origins (see `cors`), its refusals included.
    let cors = app.config.cors_origins.layer();
    let state = HttpState { schema, app };
    // One layer of them all, outermost first: each `Router::layer` boxes every route's
    // service once more, and a request clones the whole chain of boxes (routing through
    // nine of them took about 3% of a submit's instructions).
    let layers =
        ServiceBuilder::new()
            // Outermost, so that what the CORS layer answers itself (a preflight) has it too.
            .layer(middleware::map_response(date::stamp))
            .map_response(IntoResponse::into_response)
            .layer(cors)
            .layer(CatchPanicLayer::new())
            // A failed response is logged where it fails, once, at its own level (an internal
            // error at ERROR, a silent database at WARN): tower_http's line for it is the
            // access line's companion, at debug with it.
            .layer(TraceLayer::new_for_http().on_failure(
                tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
            ))
            .layer(middleware::from_fn_with_state(
                state.clone(),
                record_request,
            ))
            .layer(middleware::from_fn_with_state(
                body_limit,
                refuse_declared_oversize,
            ))
            .layer(DefaultBodyLimit::max(body_limit));
    Router::new()
        .route("/", get(console::page))
        .route("/assets/{*path}", get(console::asset))
        .route("/graphql", get(graphql::get).post(graphql::post))
        .route("/graphql/ws", get(websocket::upgrade))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .method_not_allowed_fallback(unrouted::method_not_allowed)
        .fallback(unrouted::not_found)
        .layer(layers)
        .with_state(state)
}

/// A request whose `Content-Length` already says its body is over the limit is answered
/// `413` (with a GraphQL error) at once, without waiting for a body it would refuse anyway
/// (a body without a length, or with a false one, is still cut at the limit as it is read).
async fn refuse_declared_oversize(
    State(limit): State<usize>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    match declared {
        Some(length) if length > limit as u64 => {
            let media =
                negotiate::response_media_type(request.headers()).unwrap_or(MediaType::Json);
            let mut refused = graphql::request_error(
                media,
                StatusCode::PAYLOAD_TOO_LARGE,
                "BAD_USER_INPUT",
                &format!("the request body is over the limit of {limit} bytes"),
            );
            refused
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            graphql::varies_by_accept(refused)
        }
        _ => next.run(request).await,
    }
}

/// Liveness: the process is up.
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the database answers, within [`PROBE_TIMEOUT`].
async fn readyz(State(state): State<HttpState>) -> Response {
    let db = &state.app.db;
    match db.within(PROBE_TIMEOUT, db.ping()).await {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(err) => {
            if let Some(also) = READINESS_LOG.tell() {
                let error = if db.out_of_reach() {
                    "the database is out of reach (this process's probe finds it so)".to_owned()
                } else {
                    crate::error::error_chain(&err)
                };
                tracing::warn!(
                    error,
                    also_failed = also,
                    "readiness check failed (told at most once a second, with how many more)"
                );
            }
            (StatusCode::SERVICE_UNAVAILABLE, "database unavailable").into_response()
        }
    }
}

/// How often a failed readiness check is logged: probes polling every instance during an
/// outage would otherwise write a line each.
static READINESS_LOG: crate::telemetry::throttle::Throttle =
    crate::telemetry::throttle::Throttle::new(Duration::from_secs(1));

/// How often a scrape that could not count the due queue is logged (as for readiness).
static DUE_COUNT_LOG: crate::telemetry::throttle::Throttle =
    crate::telemetry::throttle::Throttle::new(Duration::from_secs(1));

/// Prometheus scrape endpoint: OpenMetrics when the scraper asks for it, the Prometheus text
/// format otherwise (see [`exposition`]). The due-queue depth is measured for this scrape, or
/// taken from a count that began within the last second (see
/// [`crate::service::deliveries::Deliveries::measure_due`]).
async fn metrics(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    let reachable = i64::from(!state.app.db.out_of_reach());
    state.app.metrics.database_reachable.set(reachable);
    let due = state.app.deliveries.measure_due();
    match state.app.db.within(PROBE_TIMEOUT, due).await {
        Ok(()) => {}
        Err(err) => {
            if let Some(also) = DUE_COUNT_LOG.tell() {
                tracing::warn!(error = %crate::error::error_chain(&err), also_failed = also,
                    "measuring the due queue failed (told at most once a second, with how many more)");
            }
        }
    }
    match state.app.metrics.render() {
        Ok(text) if exposition::wants_openmetrics(&headers) => {
            ([(header::CONTENT_TYPE, exposition::OPENMETRICS)], text).into_response()
        }
        Ok(text) => (
            [(header::CONTENT_TYPE, exposition::PROMETHEUS_TEXT)],
            exposition::to_prometheus_text(&text),
        )
            .into_response(),
        Err(err) => {
            tracing::error!(error = %err, "rendering metrics failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// A request's method as a metric label: the methods HTTP defines by name, anything else
/// `other` (a client may send any token as a method, and every label value is a series
/// kept for the life of the process).
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

/// Counts every request by route and status, and times it.
async fn record_request(State(state): State<HttpState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = method_label(request.method()).to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let metrics = &state.app.metrics;
    metrics
        .http_duration
        .get_or_create(&RouteLabels {
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    metrics
        .http_requests
        .get_or_create(&HttpLabels {
            route,
            method,
            status: response.status().as_u16(),
        })
        .inc();
    response
}
