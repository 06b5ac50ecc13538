//! `/graphql/ws`: GraphQL over WebSocket in both protocols (`graphql-transport-ws` and the legacy `graphql-ws`),
//! authenticated by the `connection_init` payload.

use async_graphql::http::ALL_WEBSOCKET_PROTOCOLS;
use async_graphql::Data;
use async_graphql_axum::{GraphQLProtocol, GraphQLWebSocket};
use axum::extract::{State, WebSocketUpgrade};
use axum::http::{header, HeaderMap};
use axum::response::Response;

use super::HttpState;
use crate::schema::ApiError;

/// How long a new WebSocket may take to send an accepted `connection_init`.
const CONNECTION_INIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Upgrades to a GraphQL WebSocket session; it ends when the client leaves or the process shuts down.
pub async fn upgrade(
    State(state): State<HttpState>,
    protocol: GraphQLProtocol,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    // Clients that can set headers on the upgrade request may authenticate there;
    // `connection_init` takes precedence.
    let upgrade_authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    upgrade
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .on_upgrade(move |socket| async move {
            let db = state.app.db.clone();
            let keys = state.app.keys.clone();
            let shutdown = state.app.shutdown.clone();
            let (initialised, init_done) = tokio::sync::oneshot::channel::<()>();
            let session = GraphQLWebSocket::new(socket, state.schema.clone(), protocol)
                .on_connection_init(move |payload| async move {
                    let authorization = authorization_of(&payload).or(upgrade_authorization);
                    let identity = db
                        .within_deadline(keys.authenticate(&db, authorization.as_deref()))
                        .await
                        .map_err(|err| async_graphql::Error::from(ApiError::from(err)))?;
                    let _ = initialised.send(());
                    let mut data = Data::default();
                    data.insert(identity);
                    Ok(data)
                })
                .serve();
            // A client that never authenticates does not get to hold a connection.
            let init_deadline = async {
                if tokio::time::timeout(CONNECTION_INIT_TIMEOUT, init_done).await.is_ok() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = session => {}
                () = init_deadline => tracing::debug!("WebSocket closed: no connection_init in time"),
                () = shutdown.cancelled() => {}
            }
        })
}

/// The `Authorization` entry of a `connection_init` payload, its key matched case-insensitively.
fn authorization_of(payload: &serde_json::Value) -> Option<String> {
    payload.as_object().and_then(|object| {
        object
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case("authorization"))
            .and_then(|(_, value)| value.as_str().map(str::to_owned))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorization_key_is_case_insensitive() {
        let payload = serde_json::json!({ "authorization": "Bearer x" });
        assert_eq!(authorization_of(&payload).as_deref(), Some("Bearer x"));
        let payload = serde_json::json!({ "Authorization": "Bearer y" });
        assert_eq!(authorization_of(&payload).as_deref(), Some("Bearer y"));
        assert_eq!(authorization_of(&serde_json::json!(null)), None);
    }
}
