//! Which GraphQL WebSocket subprotocol a session speaks: the first of the client's that
//! Courier speaks, over every `Sec-WebSocket-Protocol` header, spelt exactly as Courier does.

use async_graphql_axum::GraphQLProtocol;
use axum::extract::FromRequestParts as _;
use axum::http::{header, HeaderMap};

/// The legacy protocol's name (subscriptions-transport-ws).
pub const LEGACY: &str = "graphql-ws";

/// The protocol the session speaks, as the handshake names it and as the GraphQL session
/// takes it: the first the client lists, over every `Sec-WebSocket-Protocol` header, that
/// Courier speaks, spelt exactly as Courier does (the handshake echoes the name as
/// Courier spells it, and a client checks the echo against what it sent).
pub async fn chosen(headers: &HeaderMap) -> Option<(&'static str, GraphQLProtocol)> {
    let chosen = offered_protocol(headers)?;
    // async-graphql's type for it is made only from a request's headers.
    let (mut parts, ()) = axum::http::Request::builder()
        .header(header::SEC_WEBSOCKET_PROTOCOL, chosen)
        .body(())
        .ok()?
        .into_parts();
    let protocol = GraphQLProtocol::from_request_parts(&mut parts, &())
        .await
        .ok()?;
    Some((chosen, protocol))
}

/// The first protocol of [`chosen`], by name.
fn offered_protocol(headers: &HeaderMap) -> Option<&'static str> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|protocols| protocols.split(','))
        .find_map(|protocol| match protocol.trim() {
            "graphql-transport-ws" => Some("graphql-transport-ws"),
            LEGACY => Some(LEGACY),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protocol_is_the_first_known_one_the_client_lists() {
        let offered = |values: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(
                    header::SEC_WEBSOCKET_PROTOCOL,
                    header::HeaderValue::from_static(value),
                );
            }
            offered_protocol(&headers)
        };
        assert_eq!(offered(&["graphql-ws"]), Some(LEGACY));
        assert_eq!(
            offered(&["chat, graphql-ws, graphql-transport-ws"]),
            Some(LEGACY)
        );
        assert_eq!(
            offered(&["graphql-transport-ws, graphql-ws"]),
            Some("graphql-transport-ws")
        );
        assert_eq!(
            offered(&["chat", "graphql-transport-ws"]),
            Some("graphql-transport-ws"),
            "every header counts, in order"
        );
        assert_eq!(
            offered(&["GraphQL-WS"]),
            None,
            "a name spelt otherwise could not be echoed as sent"
        );
        assert_eq!(offered(&[]), None);
    }
}
