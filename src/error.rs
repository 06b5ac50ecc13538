//! The service-layer error type: database errors classified once, each variant given its client-facing code.

use sea_orm::ActiveEnum as _;
use sea_orm::DbErr;

use crate::db;

/// What `Retry-After` advises when the database did not answer: about one request deadline,
/// long enough for a network blip or a failover to pass, short enough not to stall clients.
pub const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 5;

/// Result of a service operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a domain operation can answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No credentials, or credentials that match no live API key.
    #[error("a valid API key is required")]
    Unauthenticated,
    /// The key a session or subscription was opened with has since been revoked, or has
    /// expired (a portal link's).
    #[error("the API key was revoked or has expired")]
    KeyRevoked,
    /// The caller is known but may not do this.
    #[error("{0}")]
    Forbidden(&'static str),
    /// The thing named does not exist.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The input cannot be accepted as given.
    #[error("{0}")]
    BadInput(String),
    /// The idempotency key was used before with different content: another payload or
    /// ordering key (and for `publish`, another event type).
    #[error("idempotency key already used with different content")]
    IdempotencyConflict,
    /// The caller is over its rate limit.
    #[error("rate limit exceeded; retry in {retry_after_secs}s")]
    RateLimited {
        /// Seconds until the current window ends.
        retry_after_secs: u64,
    },
    /// Only `failed` deliveries may be replayed, and only `delivered` ones resent.
    #[error(
        "delivery is {}, only {} deliveries can be {}",
        state.to_value(),
        needs.to_value(),
        restarted_as(needs)
    )]
    NotReplayable {
        /// The state the delivery is in.
        state: entity::webhook_delivery::DeliveryState,
        /// The state the operation restarts deliveries from.
        needs: entity::webhook_delivery::DeliveryState,
    },
    /// A subscriber fell behind (or events may have been lost) and must refetch.
    #[error("the subscriber fell behind and missed events; resubscribe and refetch")]
    Lagged,
    /// The database could not be reached, did not answer in time, or had no room for the
    /// work. The operation may or may not have taken effect (a reply can be lost after a
    /// commit): retry it, with the same idempotency key where there is one.
    #[error("the database is unavailable for now; retry later")]
    Unavailable(#[source] DbErr),
    /// A signing secret could not be sealed or opened (see [`crate::crypto::sealing`]).
    #[error("signing secret unavailable")]
    Secret(#[source] crate::crypto::sealing::SecretError),
    /// Anything the caller cannot fix: logged in full, reported generically.
    #[error("database error")]
    Database(#[source] DbErr),
}

/// What restarting a delivery from `needs` is called: replaying a failed one, resending a
/// delivered one.
fn restarted_as(needs: &entity::webhook_delivery::DeliveryState) -> &'static str {
    match needs {
        entity::webhook_delivery::DeliveryState::Delivered => "resent",
        _ => "replayed",
    }
}

impl Error {
    /// Shorthand for [`Error::BadInput`].
    pub fn bad_input(message: impl Into<String>) -> Self {
        Error::BadInput(message.into())
    }

    /// The stable code clients see in `extensions.code`.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Unauthenticated | Error::KeyRevoked => "UNAUTHENTICATED",
            Error::Forbidden(_) => "FORBIDDEN",
            Error::NotFound(_) => "NOT_FOUND",
            Error::BadInput(_) => "BAD_USER_INPUT",
            Error::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
            Error::RateLimited { .. } => "RATE_LIMITED",
            Error::NotReplayable { .. } => "DELIVERY_NOT_REPLAYABLE",
            Error::Lagged => "SUBSCRIPTION_LAGGED",
            Error::Unavailable(_) => "SERVICE_UNAVAILABLE",
            Error::Secret(_) | Error::Database(_) => "INTERNAL_SERVER_ERROR",
        }
    }

    /// Seconds after which a retry may succeed, for errors that say so (`Retry-After`).
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Error::RateLimited { retry_after_secs } => Some(*retry_after_secs),
            Error::Unavailable(_) => Some(UNAVAILABLE_RETRY_AFTER_SECS),
            _ => None,
        }
    }
}

impl From<DbErr> for Error {
    /// Database errors by [`db::classify`]: an unreachable or silent database becomes
    /// [`Error::Unavailable`]; everything else is internal (races are settled by the SQL,
    /// whose outcomes are values, never errors).
    fn from(err: DbErr) -> Self {
        if db::is_unavailable(&err) {
            Error::Unavailable(err)
        } else {
            Error::Database(err)
        }
    }
}

/// Renders an error with every `source()` below it, for logs and fatal messages. A
/// database error is told by its driver's own message (PostgreSQL's server source line
/// left out), and a cause that only repeats what its parent said is not repeated.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    let mut link = Some(err);
    while let Some(current) = link {
        let (part, last) = match current.downcast_ref::<DbErr>() {
            // The driver error inside is the whole story; the links below only repeat it.
            Some(db_err) => (db::describe(db_err), true),
            None => (current.to_string(), false),
        };
        if !text.contains(part.as_str()) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        link = if last { None } else { current.source() };
    }
    text
}
