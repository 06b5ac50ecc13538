//! Taking work in: `submit` (idempotency, validation, group commit, rate limits) and
//! `publish` (routing and fan-out).

mod fanout;
mod group_commit;
mod rate_limit;
mod submit;
