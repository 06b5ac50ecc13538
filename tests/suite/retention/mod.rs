//! Retention: settled deliveries past `COURIER_RETENTION_DAYS` go with their attempts and
//! submissions, and events left with no submission go after them.

mod deliveries;
mod events;
