//! Courier: a webhook delivery service.
//!
//! # Map
//! - [`config`]: every tunable (flags backed by `COURIER_*` variables).
//! - [`cli`]: what each command does, and how a fatal error is told once on one line;
//!   [`app`] assembles a running instance; [`state`] is the cheap-to-clone application state
//!   every handler and task shares.
//! - `http`: routes: the operator console (`/`, `/assets/*`), `/graphql` (HTTP and WebSocket),
//!   `/healthz`, `/readyz`, `/metrics`; the one place responses get `Retry-After`.
//! - [`schema`]: GraphQL types and resolvers, one module per domain; no SQL.
//! - [`service`]: domain operations and their transactions; no GraphQL. `submit` and `publish`
//!   share one intake (`service::submissions::intake`); storing reports its outcome as a value;
//!   disabling and re-enabling an endpoint live in `service::switch`; the fair-share rules in
//!   `service::flow`; ordering lines (one delivery of a key at a time) in `service::lines`; the operational
//!   events Courier publishes about endpoints and deliveries in `service::operational`.
//! - [`auth`]: API keys, roles and scopes, the cache of recently authenticated keys, when each
//!   key was last used, and revocation felt by every process.
//! - [`bus`]: delivery state changes, staged in the transaction that makes them and published
//!   on commit; every `NOTIFY`; the `LISTEN` connection that brings every process's changes to
//!   this process's subscribers (PostgreSQL); the hints that wake the worker.
//! - [`crypto`]: signing secrets sealed at rest under `COURIER_ENCRYPTION_KEY`, and `whsec_`
//!   secrets minted.
//! - `destination`: which webhook URLs are allowed.
//! - [`db`]: connecting, migrating, and the one place PostgreSQL and SQLite differ: whose clock
//!   decides, SQL templates and row sets, the transaction and retry policy, deadlines, the one
//!   classifier of database errors, warm-up, the parking rule.
//! - [`error`]: the service error type and its mapping to GraphQL error codes; [`labels`]: the one
//!   rule for names people give endpoints, tenants and API keys.
//! - [`worker`]: claims due deliveries, round robin across endpoints within each endpoint's
//!   cap, rate limit and pause (claims take turns on a row per endpoint, so they hold across
//!   processes), signs and sends them (with both secrets during a rotation's grace period),
//!   records each attempt under its claim's fence and, in the same transaction, its endpoint's
//!   health (410 Gone, failure runs, `Retry-After` pauses); prunes history past retention.
//! - [`metrics`], [`telemetry`]: Prometheus metrics and structured logs.
//!
//! # How a request flows
//! HTTP -> `http` (media type, body limit, API key, database deadline) -> [`schema`] resolver ->
//! [`service`] operation (one transaction; races settled by the database) -> database.
//! Errors travel back as [`error::Error`] and are mapped once to `extensions.code`.
//!
//! # How a delivery flows
//! `submit` commits a submission, its `pending` delivery and the creation event together
//! (on PostgreSQL, concurrent submissions share one statement and one commit), and wakes
//! its endpoint's turn and the workers of every process. A [`worker`] locks the turns of the
//! ready endpoints, least recently served first, and claims each one's due rows up to its
//! free slots (`FOR UPDATE SKIP LOCKED` plus a guarded UPDATE that sets a fresh claim token
//! and lease), sends each webhook signed per Standard
//! Webhooks with no transaction open, and records the attempt and the transition
//! (`delivered`, a retry back to `pending`, or `failed`) only while its token still holds,
//! many outcomes per transaction. Each state change reaches subscribers after its commit.
//! A delivery with an ordering key waits, without a due time, behind the head of its line
//! until the head's outcome is recorded and hands the line on in the same transaction.

pub mod app;
pub mod auth;
pub mod bus;
pub mod cli;
pub mod config;
pub mod crypto;
pub mod db;
mod destination;
pub mod error;
mod http;
pub mod labels;
pub mod metrics;
pub mod schema;
pub mod service;
pub mod state;
pub mod telemetry;
pub mod worker;
