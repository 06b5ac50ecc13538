//! The built binary, run as users run it: its commands, a first run, clocks that disagree,
//! a database that goes away, the toolchain it needs, and the traces it exports.

mod cli;
mod clock_skew;
mod database_outage;
mod first_run;
mod toolchain;
mod tracing;
