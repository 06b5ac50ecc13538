//! The database's clock as this process measures it against its own (PostgreSQL; on
//! SQLite, one host, it is this host's): what new ids and the times Courier stamps on rows,
//! attempts and webhooks carry, so that hosts whose clocks disagree stamp alike. Decisions
//! about time are the database's own, in the statements (see [`super::clock`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sea_orm::{ConnectionTrait as _, DbBackend, DbErr, Statement};
use tokio_util::sync::CancellationToken;

use super::Db;

/// The database's clock less this host's, in microseconds, as last measured (0 until then,
/// and on SQLite).
static OFFSET_MICROS: AtomicI64 = AtomicI64::new(0);

/// How often a serving process measures the database's clock against its own again: hosts'
/// clocks drift slowly, and NTP steps them rarely.
pub const REMEASURE_EVERY: Duration = Duration::from_secs(60);

/// Samples per measurement: the one with the shortest round trip is kept, its midpoint the
/// closest to when the database read its clock.
const SAMPLES: usize = 3;

/// How far off this host's clock may be before each measurement warns.
const WARN_BEYOND: Duration = Duration::from_secs(5);

/// Now, on the database's clock as last measured.
pub fn database_now() -> SystemTime {
    let offset = OFFSET_MICROS.load(Ordering::Relaxed);
    let here = SystemTime::now();
    let off_by = Duration::from_micros(offset.unsigned_abs());
    if offset >= 0 {
        here.checked_add(off_by)
    } else {
        here.checked_sub(off_by)
    }
    .unwrap_or(here)
}

/// Measures the database's clock against this host's (PostgreSQL; nothing to measure on
/// SQLite): new ids and stamps carry it from now on. A host found more than
/// [`WARN_BEYOND`] off is logged as a warning, with how far.
pub async fn measure(db: &Db) -> Result<(), DbErr> {
    if db.backend() != DbBackend::Postgres {
        return Ok(());
    }
    let mut best: Option<(Duration, i64)> = None;
    for _ in 0..SAMPLES {
        let sent = SystemTime::now();
        let began = Instant::now();
        let row = db
            .conn()
            .query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::int8 AS micros",
            ))
            .await?;
        let round_trip = began.elapsed();
        let Some(database) = row
            .map(|row| row.try_get::<i64>("", "micros"))
            .transpose()?
        else {
            continue;
        };
        let midpoint = sent + round_trip / 2;
        let here = i64::try_from(
            midpoint
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_micros(),
        )
        .unwrap_or(i64::MAX);
        if best.is_none_or(|(shortest, _)| round_trip < shortest) {
            best = Some((round_trip, database.saturating_sub(here)));
        }
    }
    if let Some((_, offset)) = best {
        OFFSET_MICROS.store(offset, Ordering::Relaxed);
        let off_by = Duration::from_micros(offset.unsigned_abs());
        if off_by > WARN_BEYOND {
            tracing::warn!(
                offset_secs = offset as f64 / 1e6,
                "this host's clock is {:.1} s {} the database's: fix its time synchronisation \
                 (Courier stamps and decides by the database's clock)",
                off_by.as_secs_f64(),
                if offset > 0 { "behind" } else { "ahead of" },
            );
        }
    }
    Ok(())
}

/// Measures the database's clock every [`REMEASURE_EVERY`] until `shutdown`; a measurement
/// that fails keeps the last one.
pub async fn keep_measuring(db: Db, shutdown: CancellationToken) {
    if db.backend() != DbBackend::Postgres {
        return;
    }
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(REMEASURE_EVERY) => {}
        }
        if let Err(err) = db.within_deadline(measure(&db)).await {
            tracing::debug!(error = %crate::error::error_chain(&err),
                "measuring the database's clock failed; the last measurement stands");
        }
    }
}

#[cfg(test)]
pub(crate) fn set_offset_micros(offset: i64) {
    OFFSET_MICROS.store(offset, Ordering::Relaxed);
}
