//! Courier's integration suite: every test builds its own database through the real migrations
//! and talks to real app instances over HTTP and WebSocket.

// Tests fail loudly: a panic with a message is the assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth;
mod claims;
mod cli;
mod clock_skew;
mod console;
mod database_outage;
mod delivery;
mod destinations;
mod endpoint_race;
mod endpoints;
mod exact_numbers;
mod failures;
mod fanout;
mod first_run;
mod flow_control;
mod graphiql;
mod group_commit;
mod hostile_documents;
mod http_hardening;
mod lifecycle;
mod listings;
mod notifications;
mod parking;
mod rate_limit;
mod replay;
mod revocation;
mod schema_drift;
mod submissions;
mod subscriptions;
mod support;
mod toolchain;
mod websocket;
mod worker_pipeline;
