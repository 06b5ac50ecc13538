//! The database's clock as this process measures it against its own (PostgreSQL; on
//! SQLite, one host, it is this host's): what new ids and the times Courier stamps on rows,
//! attempts and webhooks carry, so that hosts whose clocks disagree stamp alike. Decisions
//! about time are the database's own, in the statements (see [`super::clock`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sea_orm::{ConnectionTrait as _, DbBackend, DbErr, Statement};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Db;

/// The database's clock less this host's, in microseconds, as last measured (0 until then,
/// and on SQLite).
static OFFSET_MICROS: AtomicI64 = AtomicI64::new(0);

/// The database's clock, in microseconds since the epoch, less [`steady_micros`] at the
/// same moment, as last measured ([`UNMEASURED`] until then, and on SQLite): the database's
/// time now is that plus [`steady_micros`] now. The steady clock only moves forward and
/// counts the host's sleep, so neither a step of this host's wall clock (an NTP
/// correction) nor a host suspended and resumed moves the stamps.
static DATABASE_MICROS_AT_BASE: AtomicI64 = AtomicI64::new(UNMEASURED);

/// [`DATABASE_MICROS_AT_BASE`] before any measurement.
const UNMEASURED: i64 = i64::MIN;

/// Wakes [`keep_measuring`] early: the wall clock and the steady one disagree about how
/// much time passed (the wall clock was stepped).
static CLOCKS_DISAGREE: Notify = Notify::const_new();

/// How far the wall clock may move from the steady one between measurements before
/// the database's clock is measured again at once.
const STEP_BEYOND: Duration = Duration::from_secs(1);

/// How often a serving process measures the database's clock against its own again: hosts'
/// clocks drift slowly, and NTP steps them rarely (a step is noticed when it happens).
pub const REMEASURE_EVERY: Duration = Duration::from_secs(60);

/// Samples per measurement: the one with the shortest round trip is kept, its midpoint the
/// closest to when the database read its clock.
const SAMPLES: usize = 3;

/// How far off this host's clock may be before each measurement warns.
const WARN_BEYOND: Duration = Duration::from_secs(5);

/// Microseconds on a clock that only moves forward and counts the host's sleep (Linux's
/// `CLOCK_BOOTTIME`; elsewhere the time since this process first asked, on the monotonic
/// clock, which may not count a sleep).
fn steady_micros() -> i64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Ok(now) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        return now.tv_sec() * 1_000_000 + now.tv_nsec() / 1_000;
    }
    static BASE: OnceLock<Instant> = OnceLock::new();
    i64::try_from(BASE.get_or_init(Instant::now).elapsed().as_micros()).unwrap_or(i64::MAX)
}

/// Microseconds since the epoch of `at` (0 before it).
fn epoch_micros(at: SystemTime) -> i64 {
    i64::try_from(
        at.duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros(),
    )
    .unwrap_or(i64::MAX)
}

/// Now, on the database's clock as last measured: its reading then, moved on by the
/// steady clock (this host's wall clock until a measurement, and on SQLite, where the
/// database's clock is this host's).
pub fn database_now() -> SystemTime {
    let here = SystemTime::now();
    let at_base = DATABASE_MICROS_AT_BASE.load(Ordering::Relaxed);
    if at_base == UNMEASURED {
        return here;
    }
    let database = at_base.saturating_add(steady_micros());
    let by_wall_clock = epoch_micros(here).saturating_add(OFFSET_MICROS.load(Ordering::Relaxed));
    if database.abs_diff(by_wall_clock) > STEP_BEYOND.as_micros() as u64 {
        CLOCKS_DISAGREE.notify_one();
    }
    UNIX_EPOCH + Duration::from_micros(database.max(0).unsigned_abs())
}

/// Takes `database`, the database's clock in microseconds since the epoch, read when this
/// host's wall clock read `here` and [`steady_micros`] read `steady`, as the measurement
/// from now.
fn anchor(database: i64, here: SystemTime, steady: i64) {
    OFFSET_MICROS.store(
        database.saturating_sub(epoch_micros(here)),
        Ordering::Relaxed,
    );
    DATABASE_MICROS_AT_BASE.store(database.saturating_sub(steady), Ordering::Relaxed);
}

/// Measures the database's clock against this host's (PostgreSQL; nothing to measure on
/// SQLite): new ids and stamps carry it from now on. A host found more than
/// [`WARN_BEYOND`] off is logged as a warning, with how far.
pub async fn measure(db: &Db) -> Result<(), DbErr> {
    if db.backend() != DbBackend::Postgres {
        return Ok(());
    }
    // The shortest round trip: its midpoint, on both of this host's clocks, and the
    // database's reading.
    let mut best: Option<(Duration, SystemTime, i64, i64)> = None;
    for _ in 0..SAMPLES {
        let sent = SystemTime::now();
        let sent_steady = steady_micros();
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
        if best.is_none_or(|(shortest, ..)| round_trip < shortest) {
            let half = round_trip / 2;
            let half_micros = i64::try_from(half.as_micros()).unwrap_or(i64::MAX);
            best = Some((
                round_trip,
                sent + half,
                sent_steady.saturating_add(half_micros),
                database,
            ));
        }
    }
    if let Some((_, here, at, database)) = best {
        anchor(database, here, at);
        let offset = database.saturating_sub(epoch_micros(here));
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

/// Measures the database's clock every [`REMEASURE_EVERY`], and at once when this host's
/// wall clock steps, until `shutdown`; a measurement that fails keeps the last one.
pub async fn keep_measuring(db: Db, shutdown: CancellationToken) {
    if db.backend() != DbBackend::Postgres {
        return;
    }
    let mut measured_at = Instant::now();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(REMEASURE_EVERY) => {}
            () = CLOCKS_DISAGREE.notified() => {
                tracing::info!("this host's wall clock moved apart from its steady clock \
                    (stepped): measuring the database's clock again");
                // At most once a second, should the measurement keep failing.
                tokio::time::sleep_until((measured_at + STEP_BEYOND).into()).await;
            }
        }
        measured_at = Instant::now();
        if let Err(err) = db.within_deadline(measure(&db)).await {
            tracing::debug!(error = %crate::error::error_chain(&err),
                "measuring the database's clock failed; the last measurement stands");
        }
    }
}

/// Takes the database's clock as `offset` microseconds ahead of this host's (behind if
/// negative), as a measurement would.
#[cfg(test)]
pub(crate) fn set_offset_micros(offset: i64) {
    let (here, steady) = (SystemTime::now(), steady_micros());
    anchor(epoch_micros(here).saturating_add(offset), here, steady);
}
