//! The command line: what each command does, and how a fatal error is told.

pub mod commands;
pub mod fatal;
mod serve_lock;
mod signals;
