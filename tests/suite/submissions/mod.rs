//! Taking work in: `submit` (idempotency, validation, group commit, rate limits) and
//! `publish` (routing and fan-out), and the statements that store them prepared at start-up.

mod fanout;
mod group_commit;
mod rate_limit;
mod submit;
mod warm_up;
