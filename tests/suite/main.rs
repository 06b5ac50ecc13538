//! Courier's integration suite: every test builds its own database through the real migrations
//! and talks to real app instances over HTTP and WebSocket.

// Tests fail loudly: a panic with a message is the assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth;
mod console;
mod deliveries;
mod endpoints;
mod http;
mod operational;
mod ordering;
mod parking;
mod process;
mod retention;
mod schema;
mod submissions;
mod support;
mod tenants;
mod worker;
