//! Retention: settled deliveries past `COURIER_RETENTION_DAYS` go with their attempts and
//! submissions, events left with no submission go after them, and so do
//! ordering lines idle as long with nothing open, and API keys expired as long.

mod deliveries;
mod events;
mod keys;
mod lines;
