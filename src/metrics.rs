//! Prometheus metrics: one registry per process, injected through the app state, rendered at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Labels of HTTP request metrics: the matched route and the status code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// Route pattern (`/graphql`, ...), or `unmatched`.
    pub route: String,
    /// HTTP method: one HTTP defines by name, or `other`.
    pub method: String,
    /// Response status code.
    pub status: u16,
}

/// Labels of HTTP latency: the matched route.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// Route pattern, or `unmatched`.
    pub route: String,
}

/// Labels of GraphQL operation metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// `query`, `mutation` or `subscription`.
    pub kind: String,
    /// The first root field selected (a schema field name, so the set is bounded).
    pub operation: String,
    /// `ok`, or the first error's `extensions.code`.
    pub outcome: String,
}

/// Labels of submission and attempt outcomes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// What happened, e.g. `created` or `success`.
    pub outcome: &'static str,
}

/// What became of one `submit` or `publish`: the `submissions` metric's labels, listed
/// once so the metric's help cannot drift from what is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmissionOutcome {
    /// A submission was stored.
    Created,
    /// An event was published (and fanned out).
    Published,
    /// A repeat with the same idempotency key and content answered with the first.
    Deduplicated,
    /// A repeat with the same key and different content was refused.
    Conflicted,
    /// The caller's rate limit refused it.
    RateLimited,
}

impl SubmissionOutcome {
    /// The metric's help, naming every label.
    const HELP: &'static str =
        "Submissions and published events by outcome: created, published, deduplicated, conflicted, rate_limited";

    /// The label counted.
    pub fn label(self) -> &'static str {
        match self {
            SubmissionOutcome::Created => "created",
            SubmissionOutcome::Published => "published",
            SubmissionOutcome::Deduplicated => "deduplicated",
            SubmissionOutcome::Conflicted => "conflicted",
            SubmissionOutcome::RateLimited => "rate_limited",
        }
    }
}

/// Every metric Courier records.
pub struct Metrics {
    registry: Registry,
    /// HTTP requests by route, method and status.
    pub http_requests: Family<HttpLabels, Counter>,
    /// HTTP request latency by route.
    pub http_duration: HistogramFamily<RouteLabels>,
    /// Executed GraphQL operations by kind, root field and outcome.
    pub graphql_operations: Family<OperationLabels, Counter>,
    /// GraphQL execution latency by kind, root field and outcome.
    pub graphql_duration: HistogramFamily<OperationLabels>,
    /// Submissions by outcome.
    pub submissions: Family<OutcomeLabels, Counter>,
    /// Rate-limit counter failures that let a request through unchecked.
    pub rate_limit_errors: Counter,
    /// Submissions waiting for the group writer (PostgreSQL).
    pub submissions_queued: Gauge,
    /// Statements that wrote several submissions at once (PostgreSQL group commit).
    pub submission_group_writes: Counter,
    /// Submissions sent in those statements.
    pub submission_group_rows: Counter,
    /// Submissions of a group statement whose idempotency key another submission of the
    /// same statement took.
    pub submission_group_duplicates: Counter,
    /// Deliveries claimed by this process's worker.
    pub claims: Counter,
    /// Claim transactions this process committed, whatever they found: proof the worker
    /// is looking.
    pub claim_rounds: Counter,
    /// Of [`Metrics::claims`], those a submission made in the transaction that stored it.
    pub claims_at_submit: Counter,
    /// Claims at submit that failed, failing their transaction: each submission was then
    /// stored again without a claim.
    pub claims_at_submit_failed: Counter,
    /// Claims handed back because their endpoint's signing secret did not open with this
    /// process's `COURIER_ENCRYPTION_KEY`.
    pub claims_unopened: Counter,
    /// Claims handed back unsent because their endpoint asked to wait (or answered `410`)
    /// after they were made.
    pub claims_held_back: Counter,
    /// Delivery attempts by outcome.
    pub attempts: Family<OutcomeLabels, Counter>,
    /// Results that arrived after their claim was superseded.
    pub superseded: Counter,
    /// Attempt outcomes the recorder could not write and gave up on (their deliveries are
    /// reclaimed after their lease).
    pub outcomes_given_up: Counter,
    /// Tries to record a batch of outcomes that failed (the database did not answer in time,
    /// or broke a deadlock or conflict) and were tried again.
    pub recording_retries: Counter,
    /// Seconds from submission to a 2xx answer.
    pub delivery_latency: Histogram,
    /// Deliveries being sent by this process right now.
    pub in_flight: Gauge,
    /// Deliveries due now and not yet claimed (measured at scrape time).
    pub due_depth: Gauge,
    /// 1 while this process reaches its database, 0 while it finds it out of reach
    /// (read at scrape time).
    pub database_reachable: Gauge,
    /// Successful replays (single and bulk).
    pub replays: Counter,
    /// Delivered deliveries sent again.
    pub resends: Counter,
    /// Open `deliveryStateChanged` subscriptions on this process.
    pub active_subscriptions: Gauge,
    /// State changes handed to this process's subscribers.
    pub events_published: Counter,
    /// Subscriptions ended because they fell behind (or events may have been lost).
    pub lagged_subscribers: Counter,
    /// HTTP connections open on this process, WebSockets included.
    pub connections_open: Gauge,
    /// Connections refused because `COURIER_MAX_CONNECTIONS` were open.
    pub connections_refused: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~8 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 15))
}

impl Metrics {
    /// Every metric, with `db_queries` (the pool's statement counter) registered beside them.
    pub fn new(db_queries: Counter) -> Self {
        let mut registry = Registry::with_prefix("courier");
        let http_requests = Family::<HttpLabels, Counter>::default();
        let http_duration: HistogramFamily<RouteLabels> =
            Family::new_with_constructor(latency_histogram);
        let graphql_operations = Family::<OperationLabels, Counter>::default();
        let graphql_duration: HistogramFamily<OperationLabels> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "http_requests",
            "HTTP requests by route, method and status",
            http_requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency by route",
            http_duration.clone(),
        );
        registry.register(
            "graphql_operations",
            "Executed GraphQL operations by kind, root field and outcome",
            graphql_operations.clone(),
        );
        registry.register(
            "graphql_operation_duration_seconds",
            "GraphQL execution latency by kind, root field and outcome",
            graphql_duration.clone(),
        );
        let submissions = Family::<OutcomeLabels, Counter>::default();
        let rate_limit_errors = Counter::default();
        registry.register("submissions", SubmissionOutcome::HELP, submissions.clone());
        registry.register(
            "rate_limit_errors",
            "Rate-limit counter failures; each let a request through unchecked (alert on any)",
            rate_limit_errors.clone(),
        );
        let submissions_queued = Gauge::default();
        let submission_group_writes = Counter::default();
        let submission_group_rows = Counter::default();
        let submission_group_duplicates = Counter::default();
        registry.register(
            "submissions_queued",
            "Submissions waiting for the group writer",
            submissions_queued.clone(),
        );
        registry.register(
            "submission_group_writes",
            "Statements that wrote several submissions at once",
            submission_group_writes.clone(),
        );
        registry.register(
            "submission_group_rows",
            "Submissions sent in statements that wrote several at once",
            submission_group_rows.clone(),
        );
        registry.register(
            "submission_group_duplicates",
            "Submissions whose idempotency key another submission of the same statement took",
            submission_group_duplicates.clone(),
        );
        let claims = Counter::default();
        let claim_rounds = Counter::default();
        let claims_at_submit = Counter::default();
        let claims_at_submit_failed = Counter::default();
        let claims_unopened = Counter::default();
        let claims_held_back = Counter::default();
        let attempts = Family::<OutcomeLabels, Counter>::default();
        let superseded = Counter::default();
        let outcomes_given_up = Counter::default();
        let recording_retries = Counter::default();
        let delivery_latency = latency_histogram();
        let in_flight = Gauge::default();
        let due_depth = Gauge::default();
        registry.register(
            "delivery_claims",
            "Deliveries claimed by this process",
            claims.clone(),
        );
        registry.register(
            "delivery_claim_rounds",
            "Claim transactions this process committed, whatever they found",
            claim_rounds.clone(),
        );
        registry.register(
            "delivery_claims_at_submit",
            "Deliveries claimed by the submission that stored them, in its own transaction",
            claims_at_submit.clone(),
        );
        registry.register(
            "delivery_claims_at_submit_failed",
            "Claims at submit that failed; each submission was stored again without a claim",
            claims_at_submit_failed.clone(),
        );
        registry.register(
            "delivery_claims_unopened",
            "Claims handed back because their endpoint's signing secret did not open with this process's COURIER_ENCRYPTION_KEY",
            claims_unopened.clone(),
        );
        registry.register(
            "delivery_claims_held_back",
            "Claims handed back unsent because their endpoint asked to wait (429/503 with Retry-After) or answered 410 after they were made",
            claims_held_back.clone(),
        );
        registry.register(
            "delivery_attempts",
            "Delivery attempts by outcome: success, http_status, timeout, connection, refused_destination",
            attempts.clone(),
        );
        registry.register(
            "delivery_superseded_results",
            "Attempt results recorded after a newer claim took the delivery",
            superseded.clone(),
        );
        registry.register(
            "delivery_outcomes_given_up",
            "Attempt outcomes that could not be recorded; their deliveries are reclaimed after the lease",
            outcomes_given_up.clone(),
        );
        registry.register(
            "delivery_recording_retries",
            "Tries to record a batch of outcomes that failed and were tried again",
            recording_retries.clone(),
        );
        registry.register(
            "delivery_latency_seconds",
            "Seconds from submission to a 2xx answer",
            delivery_latency.clone(),
        );
        registry.register(
            "deliveries_in_flight",
            "Deliveries being sent by this process",
            in_flight.clone(),
        );
        registry.register(
            "deliveries_due",
            "Deliveries due and not yet claimed (not those of endpoints paused by Retry-After)",
            due_depth.clone(),
        );
        let database_reachable = Gauge::default();
        registry.register(
            "database_reachable",
            "1 while this process reaches its database, 0 while its probe finds it out of reach (requests are then answered SERVICE_UNAVAILABLE at once)",
            database_reachable.clone(),
        );
        let replays = Counter::default();
        let resends = Counter::default();
        let active_subscriptions = Gauge::default();
        let events_published = Counter::default();
        let lagged_subscribers = Counter::default();
        registry.register(
            "db_queries",
            "SQL statements executed by this process",
            db_queries,
        );
        registry.register(
            "log_lines_dropped",
            "Log lines dropped because stderr was not taking them fast enough",
            crate::telemetry::sink::dropped_lines(),
        );
        registry.register("replays", "Deliveries replayed", replays.clone());
        registry.register(
            "resends",
            "Delivered deliveries sent again",
            resends.clone(),
        );
        registry.register(
            "active_subscriptions",
            "Open deliveryStateChanged subscriptions",
            active_subscriptions.clone(),
        );
        registry.register(
            "events_published",
            "Delivery state changes this process handed to its live feed (its own and other processes'), whether or not anyone subscribes",
            events_published.clone(),
        );
        registry.register(
            "lagged_subscribers",
            "Subscriptions ended because they fell behind or events may have been lost",
            lagged_subscribers.clone(),
        );
        let connections_open = Gauge::default();
        let connections_refused = Counter::default();
        registry.register(
            "http_connections_open",
            "HTTP connections open on this process, WebSockets included",
            connections_open.clone(),
        );
        registry.register(
            "http_connections_refused",
            "Connections answered 503 because COURIER_MAX_CONNECTIONS were open",
            connections_refused.clone(),
        );
        Metrics {
            registry,
            connections_open,
            connections_refused,
            replays,
            resends,
            active_subscriptions,
            events_published,
            lagged_subscribers,
            claims,
            claim_rounds,
            claims_at_submit,
            claims_at_submit_failed,
            claims_unopened,
            claims_held_back,
            attempts,
            superseded,
            outcomes_given_up,
            recording_retries,
            delivery_latency,
            in_flight,
            due_depth,
            database_reachable,
            submissions,
            rate_limit_errors,
            submissions_queued,
            submission_group_writes,
            submission_group_rows,
            submission_group_duplicates,
            http_requests,
            http_duration,
            graphql_operations,
            graphql_duration,
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(Counter::default())
    }
}

impl Metrics {
    /// Counts one delivery attempt outcome.
    pub fn attempt(&self, outcome: &'static str) {
        self.attempts
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Counts one submission outcome.
    pub fn submission(&self, outcome: SubmissionOutcome) {
        self.submissions
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
    }

    /// Renders every metric in the Prometheus / OpenMetrics text format.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}
