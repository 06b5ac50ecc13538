//! The endpoint and key lifecycle: secret rotation with overlap, endpoint health (410,
//! failure runs, manual disabling), API keys over GraphQL and the CLI, secrets encrypted at
//! rest (and an endpoint whose key was lost, recovered), and retention.

mod encryption;
mod health;
mod lost_key;
mod rotation;
