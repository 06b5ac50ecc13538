//! The built binary, run as users run it: its commands, a first run, clocks that disagree
//! or step, a database that goes away, migrations beside live traffic, a log nobody reads,
//! the toolchain it needs, and the traces it exports.

mod cli;
mod clock_skew;
mod clock_step;
mod database_outage;
mod disk_full;
mod first_run;
mod held_outcomes;
mod logs;
mod migration_locks;
mod orphaned_transaction;
mod outage_under_load;
mod shutdown;
mod silent_migration;
mod stalled_log;
mod toolchain;
mod tracing;
