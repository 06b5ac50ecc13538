//! The built binary, run as users run it: its commands, a first run, clocks that disagree,
//! a database that goes away, and the toolchain it needs.

mod cli;
mod clock_skew;
mod database_outage;
mod first_run;
mod toolchain;
