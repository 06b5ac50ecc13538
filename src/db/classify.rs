//! The one classifier of database errors: what a failed piece of work means for whoever
//! retries it, reports it or checks whether it happened anyway.

use sea_orm::{DbErr, RuntimeErr};

/// What a failed piece of database work means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The server refused the work and rolled it back (a constraint, a type error, ...):
    /// doing it again as it is fails again.
    Refused,
    /// A conflict with concurrent work, rolled back: a PostgreSQL serialization failure
    /// (`40001`) or deadlock (`40P01`), or a busy or locked SQLite database. Worth retrying
    /// at once.
    Transient,
    /// The database could not be reached, or could not do the work for now, so nothing was
    /// done: no connection within the acquire timeout, a closed pool, or the server
    /// reporting a connection failure (`08xxx`), refusing our credentials (`28xxx`, as after
    /// a password rotation), refusing connections for now (see [`refuses_connections`]), or
    /// lacking disk space, memory or working storage (see [`lacks_resources`]; on SQLite, a
    /// full disk).
    Unavailable,
    /// The work was sent but its answer never came or could not be read, or the disk failed
    /// it: a connection lost or silent past its deadline, or an I/O error on the server
    /// (`unreachable`: the database is worth retrying shortly), or an answer that failed to
    /// decode. It may have committed.
    MaybeCommitted {
        /// Whether the database stopped answering, or its disk failed (rather than it
        /// answering unreadably).
        unreachable: bool,
    },
}

impl Failure {
    /// Whether the database could not be reached or did not answer in time.
    pub fn is_unavailable(self) -> bool {
        matches!(
            self,
            Failure::Unavailable | Failure::MaybeCommitted { unreachable: true }
        )
    }
}

/// Classifies `err` (see [`Failure`]).
pub fn classify(err: &DbErr) -> Failure {
    if matches!(err, DbErr::ConnectionAcquire(_)) {
        return Failure::Unavailable;
    }
    let Some(cause) = sqlx_cause(err) else {
        return Failure::MaybeCommitted { unreachable: false };
    };
    match cause {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => Failure::Unavailable,
        // A peer that does not speak PostgreSQL's protocol (`Protocol`: a proxy or pooler
        // whose server is down, answering a connection's TLS request with a stray byte or
        // a close) is a database out of reach too.
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => Failure::MaybeCommitted { unreachable: true },
        sqlx::Error::Database(db_err) => {
            let code = db_err.code().unwrap_or_default();
            match db_err.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
                Some(_) => by_sqlite_code(code.as_ref()),
                None => by_sqlstate(code.as_ref()),
            }
        }
        _ => Failure::MaybeCommitted { unreachable: false },
    }
}

/// Storage trouble an operator must mend, behind a database error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageTrouble {
    /// No room for the work: a full disk, or no memory (PostgreSQL's `53100` and `53200`,
    /// SQLite's `SQLITE_FULL`).
    NoRoom,
    /// The disk failed the work (PostgreSQL class `58`, SQLite's `SQLITE_IOERR`): failing,
    /// or full past what the database could tell.
    IoError,
}

/// The storage trouble behind `err`, if that is what it is (rather than the database being
/// out of reach for a while, or refusing the work).
pub fn storage_trouble(err: &DbErr) -> Option<StorageTrouble> {
    let Some(sqlx::Error::Database(db_err)) = sqlx_cause(err) else {
        return None;
    };
    let code = db_err.code().unwrap_or_default();
    match db_err.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
        Some(_) => sqlite_storage_trouble(code.as_ref()),
        None => sqlstate_storage_trouble(code.as_ref()),
    }
}

/// [`storage_trouble`] by a SQLite (extended) result code.
fn sqlite_storage_trouble(code: &str) -> Option<StorageTrouble> {
    match code.parse::<i32>().map(|code| code & 0xff) {
        // SQLITE_FULL.
        Ok(13) => Some(StorageTrouble::NoRoom),
        // SQLITE_IOERR.
        Ok(10) => Some(StorageTrouble::IoError),
        _ => None,
    }
}

/// [`storage_trouble`] by a PostgreSQL SQLSTATE: `disk_full`, `out_of_memory`, and the
/// operating system's I/O errors (class `58`).
fn sqlstate_storage_trouble(code: &str) -> Option<StorageTrouble> {
    if matches!(code, "53100" | "53200") {
        Some(StorageTrouble::NoRoom)
    } else if code.starts_with("58") {
        Some(StorageTrouble::IoError)
    } else {
        None
    }
}

/// What storage trouble means for the work it failed: with no room it was rolled back; an
/// I/O error may have come after its commit.
fn storage_failure(trouble: StorageTrouble) -> Failure {
    match trouble {
        StorageTrouble::NoRoom => Failure::Unavailable,
        StorageTrouble::IoError => Failure::MaybeCommitted { unreachable: true },
    }
}

/// What an error PostgreSQL answered with means, by its SQLSTATE.
fn by_sqlstate(code: &str) -> Failure {
    if let Some(trouble) = sqlstate_storage_trouble(code) {
        storage_failure(trouble)
    } else if matches!(code, "40001" | "40P01") {
        Failure::Transient
    } else if code.starts_with("08")
        || code.starts_with("28")
        || refuses_connections(code)
        || lacks_resources(code)
    {
        Failure::Unavailable
    } else {
        Failure::Refused
    }
}

/// What an error SQLite answered with means, by its (extended) result code.
fn by_sqlite_code(code: &str) -> Failure {
    if let Some(trouble) = sqlite_storage_trouble(code) {
        return storage_failure(trouble);
    }
    match code.parse::<i32>().map(|code| code & 0xff) {
        // SQLITE_BUSY and SQLITE_LOCKED.
        Ok(5 | 6) => Failure::Transient,
        _ => Failure::Refused,
    }
}

/// Whether PostgreSQL's `code` says the server lacks what the work needs, rolling it back:
/// disk space, memory or another resource (class `53`). Doing it again as it is may well
/// succeed once that is mended, so it is answered like a database out of reach (`503`
/// with `Retry-After`).
fn lacks_resources(code: &str) -> bool {
    code.starts_with("53")
}

/// Whether PostgreSQL's `code` says the server cannot take a connection now, or ended
/// this one: shutting down or starting (`57P01`-`57P03`), the database dropped (`57P04`),
/// too many connections (`53300`), the database not accepting connections (`55000`, as
/// while it is being restored or moved), or no such database (`3D000`).
fn refuses_connections(code: &str) -> bool {
    matches!(
        code,
        "57P01" | "57P02" | "57P03" | "57P04" | "53300" | "55000" | "3D000"
    )
}

/// Whether `err` is a transient conflict worth retrying ([`Failure::Transient`]).
pub fn is_transient(err: &DbErr) -> bool {
    classify(err) == Failure::Transient
}

/// Whether `err` means the database could not be reached or did not answer in time,
/// rather than that it refused the work.
pub fn is_unavailable(err: &DbErr) -> bool {
    classify(err).is_unavailable()
}

/// Whether work that failed with `err` may have committed anyway, so its effects must be
/// looked for before it is done again or reported failed.
pub fn may_have_committed(err: &DbErr) -> bool {
    matches!(classify(err), Failure::MaybeCommitted { .. })
}

/// The driver error inside a SeaORM error, if there is one.
pub fn sqlx_cause(err: &DbErr) -> Option<&sqlx::Error> {
    match err {
        DbErr::Conn(RuntimeErr::SqlxError(inner))
        | DbErr::Exec(RuntimeErr::SqlxError(inner))
        | DbErr::Query(RuntimeErr::SqlxError(inner)) => Some(inner.as_ref()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::db::deadline_missed;

    #[test]
    fn unreachable_databases_are_told_from_refusals() {
        assert!(is_unavailable(&deadline_missed(Duration::from_secs(5))));
        assert!(may_have_committed(&deadline_missed(Duration::from_secs(5))));
        let acquire = DbErr::ConnectionAcquire(sea_orm::ConnAcquireErr::Timeout);
        assert!(is_unavailable(&acquire));
        assert!(!may_have_committed(&acquire), "nothing was sent");
        let pool_timeout = DbErr::Conn(RuntimeErr::SqlxError(Arc::new(sqlx::Error::PoolTimedOut)));
        assert!(is_unavailable(&pool_timeout));
        assert!(!is_unavailable(&DbErr::RecordNotFound("x".into())));
        let decode = DbErr::Query(RuntimeErr::SqlxError(Arc::new(sqlx::Error::RowNotFound)));
        assert!(!is_unavailable(&decode));
        assert!(
            may_have_committed(&decode),
            "an unreadable answer may follow a commit"
        );
        assert!(!is_transient(&decode));
    }

    #[test]
    fn storage_trouble_is_told_from_a_database_out_of_reach() {
        use StorageTrouble::{IoError, NoRoom};
        assert_eq!(sqlstate_storage_trouble("53100"), Some(NoRoom), "disk full");
        assert_eq!(
            sqlstate_storage_trouble("53200"),
            Some(NoRoom),
            "out of memory"
        );
        assert_eq!(sqlstate_storage_trouble("58030"), Some(IoError));
        for other in ["08006", "57P01", "40001", "23505", ""] {
            assert_eq!(sqlstate_storage_trouble(other), None, "{other}");
        }
        assert_eq!(sqlite_storage_trouble("13"), Some(NoRoom), "SQLITE_FULL");
        assert_eq!(
            sqlite_storage_trouble("778"),
            Some(IoError),
            "SQLITE_IOERR_WRITE"
        );
        for other in ["5", "6", "19", "2067", ""] {
            assert_eq!(sqlite_storage_trouble(other), None, "{other}");
        }
    }

    #[test]
    fn errors_postgresql_answers_are_told_by_their_sqlstate() {
        for transient in ["40001", "40P01"] {
            assert_eq!(by_sqlstate(transient), Failure::Transient, "{transient}");
        }
        // A full disk, out of memory, a connection refused: nothing done, worth retrying.
        for unavailable in [
            "53100", "53200", "53300", "08006", "28P01", "57P01", "3D000",
        ] {
            assert_eq!(
                by_sqlstate(unavailable),
                Failure::Unavailable,
                "{unavailable}"
            );
        }
        let io = Failure::MaybeCommitted { unreachable: true };
        assert_eq!(by_sqlstate("58030"), io, "an I/O error may follow a commit");
        // All digits, but no SQLite code: 42501 and 22021 were once read as SQLite's busy
        // and locked, 22026 as its I/O error.
        for refused in ["23505", "22P02", "42P01", "42501", "22021", "22026", ""] {
            assert_eq!(by_sqlstate(refused), Failure::Refused, "{refused}");
        }
    }

    #[test]
    fn errors_sqlite_answers_are_told_by_their_result_code() {
        for transient in ["5", "517", "6", "262"] {
            assert_eq!(by_sqlite_code(transient), Failure::Transient, "{transient}");
        }
        assert_eq!(by_sqlite_code("13"), Failure::Unavailable, "a full disk");
        let io = Failure::MaybeCommitted { unreachable: true };
        assert_eq!(by_sqlite_code("10"), io);
        assert_eq!(by_sqlite_code("778"), io, "SQLITE_IOERR_WRITE");
        for refused in ["19", "2067", "1", "8", ""] {
            assert_eq!(by_sqlite_code(refused), Failure::Refused, "{refused}");
        }
    }

    #[test]
    fn a_peer_that_does_not_speak_postgresql_is_out_of_reach() {
        let stray = sqlx::Error::Protocol("unexpected response from SSLRequest: 0x00".into());
        let err = DbErr::Conn(RuntimeErr::SqlxError(Arc::new(stray)));
        assert!(is_unavailable(&err));
        assert!(
            may_have_committed(&err),
            "mid-statement, it may have committed"
        );
    }
}
