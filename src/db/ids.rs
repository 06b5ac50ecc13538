//! New ids: UUIDv7, ordered by when they were made, which is the order of every newest-first
//! listing and its cursors. On PostgreSQL their time is the database's clock as this process
//! last measured it against its own, so that rows made by hosts whose clocks disagree list
//! in the order the database saw them; on SQLite (one host) it is this host's clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sea_orm::{ConnectionTrait as _, DbBackend, DbErr, Statement};
use tokio_util::sync::CancellationToken;
use uuid::timestamp::context::ContextV7;
use uuid::{Timestamp, Uuid};

use super::Db;

/// Keeps the ids this process makes in order, within a millisecond too.
static CONTEXT: Mutex<ContextV7> = Mutex::new(ContextV7::new());

/// The database's clock less this host's, in microseconds, as last measured (0 until then,
/// and on SQLite).
static OFFSET_MICROS: AtomicI64 = AtomicI64::new(0);

/// How often a serving process measures the database's clock against its own again: hosts'
/// clocks drift slowly, and NTP steps them rarely.
pub const REMEASURE_EVERY: Duration = Duration::from_secs(60);

/// Samples per measurement: the one with the shortest round trip is kept, its midpoint the
/// closest to when the database read its clock.
const SAMPLES: usize = 3;

/// A new id, stamped now on the database's clock (see the module docs).
pub fn new_id() -> Uuid {
    let offset = OFFSET_MICROS.load(Ordering::Relaxed);
    let here = SystemTime::now();
    let now = if offset >= 0 {
        here.checked_add(Duration::from_micros(offset.unsigned_abs()))
    } else {
        here.checked_sub(Duration::from_micros(offset.unsigned_abs()))
    }
    .unwrap_or(here);
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    Uuid::new_v7(Timestamp::from_unix(
        &CONTEXT,
        since_epoch.as_secs(),
        since_epoch.subsec_nanos(),
    ))
}

/// Measures the database's clock against this host's (PostgreSQL; nothing to measure on
/// SQLite) and stamps new ids with it from now on.
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
                "measuring the database's clock failed; new ids keep the last measurement");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_measured_clock_and_stay_in_order() {
        let before = new_id();
        // The database ten minutes behind this host: ids made now still sort after those
        // made before (the order within the process holds), and carry the database's time.
        OFFSET_MICROS.store(-600_000_000, Ordering::Relaxed);
        let after = new_id();
        OFFSET_MICROS.store(0, Ordering::Relaxed);
        assert!(after > before);
        let stamped = |id: Uuid| {
            let (secs, _) = id.get_timestamp().expect("a v7 id").to_unix();
            secs
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        assert!(stamped(before).abs_diff(now) <= 1);
    }
}
