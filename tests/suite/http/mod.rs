//! The HTTP surface: hardening against slow or hostile clients, hostile GraphQL documents,
//! GraphQL over WebSocket, and the GraphiQL page.

mod graphiql;
mod hostile_documents;
mod http_hardening;
mod websocket;
