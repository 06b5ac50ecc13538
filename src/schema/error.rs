//! The GraphQL-layer error: the one place service errors become GraphQL errors with `extensions.code`.

use async_graphql::ErrorExtensions as _;
use sea_orm::ActiveEnum as _;

use crate::error::{error_chain, Error};

/// What resolvers return on failure. It deliberately has no `Display`, so `?` can
/// only reach a GraphQL error through the mapping below, never through
/// async-graphql's message-only blanket conversion.
#[derive(Clone)]
pub struct ApiError(async_graphql::Error);

/// Result of a resolver.
pub type ApiResult<T> = Result<T, ApiError>;

impl From<ApiError> for async_graphql::Error {
    fn from(ApiError(err): ApiError) -> Self {
        err
    }
}

impl<E: Into<Error>> From<E> for ApiError {
    fn from(err: E) -> Self {
        ApiError(to_graphql(err.into()))
    }
}

/// How often a request answered `SERVICE_UNAVAILABLE` is logged: an outage under load
/// would otherwise write a line per request (tens of thousands in a few seconds).
static UNAVAILABLE_LOG: crate::telemetry::throttle::Throttle =
    crate::telemetry::throttle::Throttle::new(std::time::Duration::from_secs(1));

/// The same for storage trouble, told apart so that an outage's timeouts never hide it.
static STORAGE_LOG: crate::telemetry::throttle::Throttle =
    crate::telemetry::throttle::Throttle::new(std::time::Duration::from_secs(1));

/// Maps a service error to its GraphQL form; internal causes are logged, never sent.
fn to_graphql(err: Error) -> async_graphql::Error {
    let code = err.code();
    match &err {
        Error::Secret(_) | Error::Database(_) => {
            tracing::error!(error = %error_chain(&err), "internal error");
            async_graphql::Error::new("internal error").extend_with(|_, e| e.set("code", code))
        }
        Error::RateLimited { .. } | Error::Unavailable(_) => {
            if let Error::Unavailable(cause) = &err {
                log_unavailable(&err, cause);
            }
            let retry_after = err.retry_after_secs().unwrap_or(1);
            async_graphql::Error::new(err.to_string()).extend_with(|_, e| {
                e.set("code", code);
                e.set("retryAfter", retry_after);
            })
        }
        Error::NotReplayable { state, .. } => {
            let state = state.to_value().to_ascii_uppercase();
            async_graphql::Error::new(err.to_string()).extend_with(|_, e| {
                e.set("code", code);
                e.set("state", state.as_str());
            })
        }
        _ => async_graphql::Error::new(err.to_string()).extend_with(|_, e| e.set("code", code)),
    }
}

/// Logs a request answered `SERVICE_UNAVAILABLE`, at most once a second a kind, with how
/// many more there were: storage trouble, which an operator must mend, as an error saying
/// which; a database out of reach or too slow, which passes, as a warning.
fn log_unavailable(err: &Error, cause: &sea_orm::DbErr) {
    use crate::db::StorageTrouble;
    let error = error_chain(err);
    let trouble = crate::db::storage_trouble(cause);
    let log = if trouble.is_some() {
        &STORAGE_LOG
    } else {
        &UNAVAILABLE_LOG
    };
    let Some(also) = log.tell() else {
        return;
    };
    match trouble {
        Some(StorageTrouble::NoRoom) => tracing::error!(%error, also_unavailable = also,
            "the database has no room for the work (a full disk, or no memory): requests are \
             answered SERVICE_UNAVAILABLE until it has (told at most once a second, with how \
             many more)"),
        Some(StorageTrouble::IoError) => tracing::error!(%error, also_unavailable = also,
            "the database's disk failed the work (an I/O error: a full or failing disk): \
             requests are answered SERVICE_UNAVAILABLE until it is mended (told at most once a \
             second, with how many more)"),
        None => tracing::warn!(%error, also_unavailable = also,
            "the database did not answer in time; requests are answered SERVICE_UNAVAILABLE \
             (told at most once a second, with how many more)"),
    }
}
