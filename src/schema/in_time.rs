//! An operation run within the database's deadline (`COURIER_DB_TIMEOUT_MS`), whatever the
//! transport: over HTTP and over WebSocket alike, a database that stops answering ends the
//! operation with `SERVICE_UNAVAILABLE` rather than holding it.

use std::future::Future;
use std::sync::Arc;

use async_graphql::parser::types::OperationType;
use async_graphql::ServerError;
use futures_util::StreamExt as _;

use super::{ApiError, CourierSchema};
use crate::db::{Db, Progress};
use crate::error::Error;

/// Runs `request` on `schema`, ended with `SERVICE_UNAVAILABLE` once `db`'s deadline for
/// work passes without progress. Work in batches (a bulk replay) reports each committed
/// batch, which moves the deadline on.
pub async fn execute_in_time(
    schema: &CourierSchema,
    db: &Db,
    request: async_graphql::Request,
) -> async_graphql::Response {
    in_time(db, request, |request| Box::pin(schema.execute(request))).await
}

/// The answer of a query or mutation run over WebSocket (`request`, with the connection's
/// `session_data`) as [`execute_in_time`] runs one over HTTP. A subscription runs for as
/// long as it is subscribed: it is not given to this.
pub async fn execute_once_in_time(
    schema: CourierSchema,
    db: &Db,
    request: async_graphql::Request,
    session_data: Option<Arc<async_graphql::Data>>,
) -> async_graphql::Response {
    in_time(db, request, |request| {
        Box::pin(async move {
            // A query's or a mutation's stream holds its one answer.
            async_graphql::Executor::execute_stream(&schema, request, session_data)
                .next()
                .await
                .unwrap_or_default()
        })
    })
    .await
}

/// Whether the operation `request` selects is to be run as a subscription: it is one, or
/// that cannot be told here. The document is parsed only once it passed the checks made
/// before parsing (see `limits`), and only if it is small: a larger one is parsed off the
/// runtime by the limits' extension, and runs as before, with no deadline. One that does
/// not parse is left for async-graphql to report. A parsed document stays with the
/// request, so it is not parsed again.
pub fn subscribes(request: &mut async_graphql::Request) -> bool {
    if request.query.len() > super::limits::PARSE_OFF_RUNTIME_BYTES
        || super::limits::scan_text(&request.query).is_err()
    {
        return true;
    }
    let operation_name = request.operation_name.clone();
    let Ok(document) = request.parsed_query() else {
        return true;
    };
    super::single_root::selected_operation(document, operation_name.as_deref())
        .is_none_or(|(_, operation)| operation.node.ty == OperationType::Subscription)
}

/// `run(request)`, ended with `SERVICE_UNAVAILABLE` as [`execute_in_time`] says.
async fn in_time<Run, Running>(
    db: &Db,
    request: async_graphql::Request,
    run: Run,
) -> async_graphql::Response
where
    Run: FnOnce(async_graphql::Request) -> Running,
    Running: Future<Output = async_graphql::Response>,
{
    let progress = Progress::default();
    let request = request.data(progress.clone());
    let execution = async { Ok::<_, Error>(run(request).await) };
    match db
        .within_progress(db.timeouts().work, &progress, execution)
        .await
    {
        Ok(response) => response,
        Err(err) => async_graphql::Response::from_errors(vec![server_error(err)]),
    }
}

/// A service error raised outside any resolver, in its GraphQL form (no path, no location).
pub fn server_error(err: Error) -> ServerError {
    let err = async_graphql::Error::from(ApiError::from(err));
    let mut error = ServerError::new(err.message, None);
    error.extensions = err.extensions;
    error
}
