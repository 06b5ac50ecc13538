//! Every tunable, documented once: the command line, each flag backed by an environment variable.

pub use crate::http::cors::CorsOrigins;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use clap::builder::{BoolishValueParser, RangedU64ValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::crypto::sealing::SecretKeys;
use crate::db::Timeouts;
use crate::worker::schedule::{
    parse_schedule, RetryPolicy, DEFAULT_DELAYS, DEFAULT_DOUBLING_ATTEMPTS, DEFAULT_DOUBLING_BASE,
};

mod command_line;
mod commands;
mod traces;
mod unknown;

pub use self::commands::{
    ApiKeyCommand, CreateApiKeyArgs, CreateTenantArgs, EndpointCommand, RevokeApiKeyArgs,
    RotateSecretArgs, TenantCommand,
};
pub use self::traces::{BatchSetting, CollectorUrl, TracingArgs};
pub use self::unknown::unread_variables;

/// Longest retry delay accepted: 30 days.
pub const MAX_RETRY_DELAY_MS: u64 = 30 * 24 * 3_600_000;

/// The largest request body, WebSocket message or payload a process may be set to accept:
/// 1 GiB.
pub const MAX_BODY_BYTES: u64 = 1 << 30;

/// The largest database pool a process may ask for: far above what one process can use, and
/// small enough that the pool's bookkeeping is allocated without fail.
pub const MAX_DB_POOL_SIZE: i64 = 1_000;

/// The most deliveries one process may have in flight: each holds a request, a task and a
/// place in the recording queue; past this many, one process would spend its time
/// switching between them (run more processes instead).
pub const MAX_WORKER_CONCURRENCY: i64 = 10_000;

/// Courier: webhook delivery with durable retries, replay and live delivery events.
#[derive(Debug, Parser)]
#[command(
    name = "courier",
    version,
    about,
    long_about = None
)]
pub struct Cli {
    /// Database settings shared by every command.
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Log output format.
    #[arg(long, env = "COURIER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Trace export (OpenTelemetry), off unless a collector is named.
    #[command(flatten)]
    pub tracing: TracingArgs,

    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Settings of `serve` when no command is named: `courier --bind ADDR` is
    /// `courier serve --bind ADDR`.
    #[command(flatten)]
    pub serve: Box<ServeArgs>,
}

/// Courier's commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the GraphQL API and the in-process delivery worker (the default).
    Serve(Box<ServeArgs>),
    /// Apply pending database migrations and exit.
    Migrate,
    /// Print the GraphQL schema (SDL) and exit.
    Schema,
    /// Manage API keys.
    #[command(subcommand)]
    ApiKey(ApiKeyCommand),
    /// Manage tenants (the customers endpoints are grouped by).
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Manage endpoints' signing secrets.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
}

/// Parses COURIER_PUBLIC_URL: an `http` or `https` URL with a host, no query, fragment,
/// user name or password, and not port 0.
fn parse_public_url(text: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(text.trim()).map_err(|err| format!("not a URL: {err}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err("must be an http or https URL with a host".to_owned());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("must have no query or fragment".to_owned());
    }
    // Nobody can open a link to port 0.
    if url.port() == Some(0) {
        return Err("must not name port 0".to_owned());
    }
    // Portal links made from it are handed to tenants.
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must have no user name or password".to_owned());
    }
    Ok(url)
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where the database is.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// `postgres://...` for production; `sqlite://FILE?mode=rwc` for the embedded default.
    /// (Its value is never shown in `--help`: it may hold a password.)
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://courier.db?mode=rwc",
        global = true
    )]
    pub database_url: String,

    /// Connections in this process's database pool (2 to 1000: start-up holds one while it
    /// reads with another).
    #[arg(
        long,
        env = "COURIER_DB_POOL_SIZE",
        default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(2..=MAX_DB_POOL_SIZE),
        global = true
    )]
    pub db_pool_size: u32,

    /// Longest wait for a database connection, opening one included, in milliseconds.
    #[arg(long, env = "COURIER_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(100..=600_000), global = true)]
    pub db_acquire_timeout_ms: u64,

    /// Longest a request (or one step of a background task) waits on the database, in
    /// milliseconds; past it the request answers SERVICE_UNAVAILABLE (HTTP 503, Retry-After).
    #[arg(long, env = "COURIER_DB_TIMEOUT_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..=600_000), global = true)]
    pub db_timeout_ms: u64,
}

impl DatabaseArgs {
    /// The database deadlines these settings give.
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            acquire: Duration::from_millis(self.db_acquire_timeout_ms),
            work: Duration::from_millis(self.db_timeout_ms),
        }
    }
}

/// Settings of `courier serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address the HTTP API listens on: `IP:PORT`, or `HOST:PORT` with a name resolved at
    /// start (its first IPv4 address, else its first).
    #[arg(long, env = "COURIER_BIND", default_value = "127.0.0.1:8080", value_parser = parse_bind)]
    pub bind: SocketAddr,

    /// Where users reach this Courier (scheme, host, port, any path prefix), for the
    /// console URLs portal links hand out; default `http://` + COURIER_BIND.
    #[arg(long, env = "COURIER_PUBLIC_URL", value_parser = parse_public_url)]
    pub public_url: Option<url::Url>,

    /// Deliveries in flight per process (requests being sent); 0 runs the API only, with no
    /// worker. Their outcomes then wait to be recorded in batches, at most twice as many.
    /// Each costs a few kilobytes; a larger number means larger batches (fewer commits per
    /// delivery) and more parallel requests to each endpoint.
    #[arg(long, env = "COURIER_WORKER_CONCURRENCY", default_value_t = 128, value_parser = clap::value_parser!(u32).range(0..=MAX_WORKER_CONCURRENCY))]
    pub worker_concurrency: u32,

    /// Requests in flight at once to one endpoint that sets no `maxInFlight` of its own,
    /// counted across every Courier process on the database (1 to 1000).
    #[arg(long, env = "COURIER_ENDPOINT_MAX_IN_FLIGHT", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub endpoint_max_in_flight: u32,

    /// Whether a submission written on its own, while this process's worker has a slot to
    /// spare, claims its delivery in the transaction that stores it, so the request leaves
    /// after that one commit; `false` leaves every delivery to the claiming loop (`true`/`false`,
    /// `yes`/`no`, `on`/`off`, `1`/`0`).
    #[arg(long, env = "COURIER_CLAIM_AT_SUBMIT", default_value_t = true, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new(), hide_possible_values = true)]
    pub claim_at_submit: bool,

    /// How long a claim is held before another worker may reclaim the delivery.
    #[arg(long, env = "COURIER_LEASE_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub lease_secs: u64,

    /// The delays between a cycle's attempts, comma-separated (`5s,5m,30m,2h,5h,10h,10h`;
    /// units ms, s, m, h, d): attempts per cycle are the delays + 1, jittered, and a
    /// `Retry-After` is still honoured. Overrides COURIER_MAX_ATTEMPTS and
    /// COURIER_RETRY_BASE_MS. When none of the three is set the default schedule is
    /// `5s,30s,2m,5m,30m,2h,6h,12h,12h`: ten attempts over about 32.6 hours.
    #[arg(long, env = "COURIER_RETRY_SCHEDULE", value_parser = parse_retry_schedule)]
    pub retry_schedule: Option<RetrySchedule>,

    /// Attempts per cycle before a delivery is `failed`, with delays doubling from
    /// COURIER_RETRY_BASE_MS (8 when only the base is set).
    #[arg(long, env = "COURIER_MAX_ATTEMPTS", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_attempts: Option<u32>,

    /// First retry delay in milliseconds, doubling per attempt, with jitter (1000 when only
    /// COURIER_MAX_ATTEMPTS is set).
    #[arg(long, env = "COURIER_RETRY_BASE_MS", value_parser = clap::value_parser!(u64).range(1..=MAX_RETRY_DELAY_MS))]
    pub retry_base_ms: Option<u64>,

    /// Longest doubling delay, in milliseconds.
    #[arg(long, env = "COURIER_RETRY_MAX_MS", default_value_t = 3_600_000, value_parser = clap::value_parser!(u64).range(1..=MAX_RETRY_DELAY_MS))]
    pub retry_max_ms: u64,

    /// Timeout of one webhook request (connect and total), in milliseconds.
    #[arg(long, env = "COURIER_REQUEST_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub request_timeout_ms: u64,

    /// How often the worker looks for due deliveries when no wake-up arrives, in milliseconds.
    #[arg(long, env = "COURIER_POLL_INTERVAL_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub poll_interval_ms: u64,

    /// Submissions per API key per window, at least 1; unset means unlimited.
    #[arg(long, env = "COURIER_RATE_LIMIT", value_parser = parse_rate_limit)]
    pub rate_limit: Option<u32>,

    /// Length of the rate-limit window in seconds.
    #[arg(long, env = "COURIER_RATE_LIMIT_WINDOW_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub rate_limit_window_secs: u64,

    /// Largest accepted submission payload, in bytes (at least 2, the size of `{}`).
    #[arg(long, env = "COURIER_MAX_PAYLOAD_BYTES", default_value_t = 256 * 1024, value_parser = RangedU64ValueParser::<usize>::new().range(2..=MAX_BODY_BYTES))]
    pub max_payload_bytes: usize,

    /// Allow webhook URLs that resolve to loopback, private, link-local or other non-public
    /// addresses (`true`/`false`, `yes`/`no`, `on`/`off`, `1`/`0`).
    #[arg(long, env = "COURIER_ALLOW_PRIVATE_DESTINATIONS", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new(), hide_possible_values = true)]
    pub allow_private_destinations: bool,

    /// Largest accepted HTTP request body, and WebSocket message, in bytes (at least 64).
    #[arg(long, env = "COURIER_MAX_BODY_BYTES", default_value_t = 1024 * 1024, value_parser = RangedU64ValueParser::<usize>::new().range(64..=MAX_BODY_BYTES))]
    pub max_body_bytes: usize,

    /// HTTP connections open at once, WebSockets included; one more is answered 503 and
    /// closed. Keep the process's open-file limit well above it.
    #[arg(long, env = "COURIER_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,

    /// Which web pages of other origins may call `/graphql` and read its answers (CORS):
    /// `*` for any (Courier takes bearer tokens, never cookies, so a page can do nothing
    /// without a token of its own), comma-separated origins such as
    /// `https://dashboard.example.com`, or empty for none.
    #[arg(long, env = "COURIER_CORS_ORIGINS", default_value = "*", value_parser = CorsOrigins::parse)]
    pub cors_origins: CorsOrigins,

    /// Longest a request's header may take to arrive, from its first byte, in milliseconds.
    #[arg(long, env = "COURIER_HEADER_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub header_timeout_ms: u64,

    /// Longest a request's body may take to arrive whole, from when it is first read, in
    /// milliseconds (past it: 408).
    #[arg(long, env = "COURIER_BODY_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub body_timeout_ms: u64,

    /// Longest a kept-alive connection may sit with no request before it is closed, in
    /// milliseconds.
    #[arg(long, env = "COURIER_IDLE_TIMEOUT_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub idle_timeout_ms: u64,

    /// Longest a new WebSocket may take to send an accepted `connection_init` before it is
    /// closed with 4408, in milliseconds.
    #[arg(long, env = "COURIER_WS_INIT_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub ws_init_timeout_ms: u64,

    /// How often a WebSocket is pinged, in milliseconds. One that sends nothing back (no
    /// pong, no message) for two of these, or does not take what is sent to it for as
    /// long, is dropped and its subscriptions end: a peer gone without closing (a lost
    /// network, a sleeping laptop) does not hold them.
    #[arg(long, env = "COURIER_WS_PING_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub ws_ping_ms: u64,

    /// How long an authenticated API key is remembered, in milliseconds (0: look it up on
    /// every request). A revoked key is evicted within a second regardless.
    #[arg(long, env = "COURIER_AUTH_CACHE_MS", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub auth_cache_ms: u64,

    /// On SIGTERM, how long in-flight deliveries may run before the process exits.
    #[arg(long, env = "COURIER_SHUTDOWN_GRACE_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3_600))]
    pub shutdown_grace_secs: u64,

    /// Disable an endpoint (reason FAILING) after this many consecutive deliveries end
    /// failed with no success between; 0 never disables.
    #[arg(long, env = "COURIER_DISABLE_AFTER_FAILURES", default_value_t = 100)]
    pub disable_after_failures: u32,

    /// Encrypt signing secrets at rest: base64 of 32 random bytes, or several separated by
    /// commas (the first encrypts, every one decrypts). Generate one with
    /// `head -c 32 /dev/urandom | base64`.
    #[arg(long, env = "COURIER_ENCRYPTION_KEY", hide_env_values = true, value_parser = crate::crypto::sealing::parse_keys)]
    pub encryption_key: Option<SecretKeys>,

    /// Delete deliveries settled (delivered or failed) longer ago than this many days, with
    /// their attempts and submissions; 0 keeps everything.
    #[arg(long, env = "COURIER_RETENTION_DAYS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=36_500))]
    pub retention_days: u32,

    /// How often expired deliveries are pruned, in seconds.
    #[arg(long, env = "COURIER_PRUNE_INTERVAL_SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub prune_interval_secs: u64,
}

impl ServeArgs {
    /// The settings `courier serve` would use with no flags: defaults overlaid by `COURIER_*` variables.
    /// Environment variables still apply, so a bad `COURIER_*` value is an error here too.
    pub fn from_env() -> Result<Self, clap::Error> {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            serve: ServeArgs,
        }
        Only::try_parse_from(["courier"]).map(|only| only.serve)
    }

    /// Refuses combinations that make no sense, naming the settings to change.
    pub fn check(&self) -> Result<(), String> {
        if let (None, Some(base)) = (&self.retry_schedule, self.retry_base_ms) {
            if base > self.retry_max_ms {
                return Err(format!(
                    "COURIER_RETRY_BASE_MS ({base}) is above COURIER_RETRY_MAX_MS ({}): the first \
                     retry delay cannot be longer than the longest; lower COURIER_RETRY_BASE_MS \
                     or raise COURIER_RETRY_MAX_MS",
                    self.retry_max_ms
                ));
            }
        }
        Ok(())
    }

    /// Combinations that work but are likely mistakes, each a sentence naming the settings
    /// to change: for `serve` to log at start.
    pub fn doubts(&self) -> Vec<String> {
        let mut doubts = Vec::new();
        if self.lease_secs.saturating_mul(1_000) <= self.request_timeout_ms {
            doubts.push(format!(
                "COURIER_LEASE_SECS ({} s) is not above COURIER_REQUEST_TIMEOUT_MS ({} ms): a \
                 webhook request still running when its lease runs out may be retaken and sent \
                 again by another worker, past the endpoint's maxInFlight; raise \
                 COURIER_LEASE_SECS well above the request timeout",
                self.lease_secs, self.request_timeout_ms
            ));
        }
        doubts
    }

    /// Where users reach this Courier, without a trailing slash: COURIER_PUBLIC_URL, or
    /// `http://` + COURIER_BIND.
    pub fn public_url(&self) -> String {
        match &self.public_url {
            Some(url) => url.as_str().trim_end_matches('/').to_owned(),
            None => format!("http://{}", self.bind),
        }
    }

    /// Fills in the default COURIER_PUBLIC_URL from the address the server listens on,
    /// once it is bound (`listening`): the port it got for a port-0 bind, and the loopback
    /// address for one on every interface (`0.0.0.0` or `::`), which is no address a
    /// browser can be sent to. Returns the URL when it points at this machine only, while
    /// the server listens beyond it: portal links then reach no one else.
    pub fn settle_public_url(&mut self, listening: SocketAddr) -> Option<String> {
        if self.public_url.is_some() {
            return None;
        }
        let everywhere = listening.ip().is_unspecified();
        let host = match listening.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let base = format!("http://{}", SocketAddr::new(host, listening.port()));
        self.public_url = url::Url::parse(&base).ok();
        everywhere.then_some(base)
    }

    /// How deliveries are retried: the listed schedule when COURIER_RETRY_SCHEDULE is set,
    /// doubling when COURIER_MAX_ATTEMPTS or COURIER_RETRY_BASE_MS is, and otherwise
    /// [`crate::worker::schedule::DEFAULT_SCHEDULE`].
    pub fn retry_policy(&self) -> RetryPolicy {
        let max = Duration::from_millis(self.retry_max_ms);
        match (&self.retry_schedule, self.max_attempts, self.retry_base_ms) {
            (Some(schedule), ..) => RetryPolicy::listed(&schedule.0, max),
            (None, None, None) => RetryPolicy::listed(&DEFAULT_DELAYS, max),
            (None, attempts, base) => RetryPolicy::doubling(
                base.map_or(DEFAULT_DOUBLING_BASE, Duration::from_millis),
                max,
                attempts.unwrap_or(DEFAULT_DOUBLING_ATTEMPTS),
            ),
        }
    }

    /// The lease length as a duration.
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_secs)
    }

    /// The keys signing secrets are sealed with (none when `COURIER_ENCRYPTION_KEY` is unset).
    pub fn secret_keys(&self) -> SecretKeys {
        self.encryption_key.clone().unwrap_or_default()
    }

    /// The shutdown grace period as a duration.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }

    /// The limits HTTP connections are served under.
    pub fn connection_limits(&self) -> crate::http::connections::ConnectionLimits {
        crate::http::connections::ConnectionLimits {
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            shutdown_grace: self.shutdown_grace(),
            refusal_shared: self.cors_origins == CorsOrigins::Any,
        }
    }
}

/// The delays of `COURIER_RETRY_SCHEDULE`, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule(pub Vec<Duration>);

/// `COURIER_RETRY_SCHEDULE`: see [`parse_schedule`].
fn parse_retry_schedule(value: &str) -> Result<RetrySchedule, String> {
    parse_schedule(value, Duration::from_millis(MAX_RETRY_DELAY_MS)).map(RetrySchedule)
}

/// `COURIER_BIND`: `IP:PORT`, or `HOST:PORT` resolved now, taking its first IPv4 address
/// (else its first).
fn parse_bind(value: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = value.parse() {
        return Ok(addr);
    }
    let resolved: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(value)
        .map_err(|err| format!("{err}; expected IP:PORT or HOST:PORT, e.g. 127.0.0.1:8080"))?
        .collect();
    resolved
        .iter()
        .find(|addr| addr.is_ipv4())
        .or(resolved.first())
        .copied()
        .ok_or_else(|| format!("{value} resolves to no address"))
}

/// `COURIER_RATE_LIMIT`: a positive number. Zero would refuse every submission, which is
/// never what an operator means; leaving the setting unset means unlimited.
fn parse_rate_limit(value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(0) => Err(
            "0 would refuse every submission; set at least 1, or unset COURIER_RATE_LIMIT for no limit"
                .to_owned(),
        ),
        Ok(limit) => Ok(limit),
        Err(err) => Err(format!("{err}; expected a whole number of submissions per window")),
    }
}

#[cfg(test)]
mod tests;
