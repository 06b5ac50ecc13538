//! Operational events: Courier publishes `courier.endpoint.disabled`, `.enabled`, `.paused`
//! and `courier.delivery.failed` itself, in the transaction that makes the change, to the
//! endpoints that list the type, scoped by tenant, never to the endpoint they are about,
//! and without storms.

mod events;
mod scope;
