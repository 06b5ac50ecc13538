//! The HTTP surface: connection limits and timeouts, cross-origin calls, hardening against
//! slow or hostile clients, hostile GraphQL documents, control characters in arguments,
//! documents served from the parse cache, persisted queries (not kept), the routes open
//! without a key, GraphQL over WebSocket (and what one connection's subscriptions may
//! cost), and the GraphiQL page.

mod connections;
mod control_characters;
mod cors;
mod expect_continue;
mod graphiql;
mod hostile_documents;
mod http_hardening;
mod known_documents;
mod open_routes;
mod persisted_queries;
mod subscription_limits;
mod websocket;
mod websocket_framing;
mod websocket_legacy;
mod websocket_operations;
mod websocket_protocols;
