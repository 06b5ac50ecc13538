//! Where a database URL points and, when it cannot be opened, why, in words that name what to change.

use std::path::PathBuf;
use std::str::FromStr as _;
use std::time::Duration;

use sea_orm::DbErr;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _};

use super::{redact, sqlx_cause, Timeouts};

/// Longest the second look at an unreachable PostgreSQL may take, after the pool gave up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// SQLite's `SQLITE_CANTOPEN`: the file or its directory cannot be opened or created.
const SQLITE_CANTOPEN: i32 = 14;

/// Where `url` points, for logs: the absolute path of a SQLite file (the default is
/// relative to the working directory, so a key made from elsewhere lands elsewhere), or
/// the URL without its password.
pub fn location(url: &str) -> String {
    sqlite_path(url).map_or_else(
        || redact(url),
        |path| format!("sqlite://{}", path.display()),
    )
}

/// Whether `url` names an in-memory SQLite database: one per connection, gone when it closes.
pub fn sqlite_in_memory(url: &str) -> bool {
    url.starts_with("sqlite:") && (url.contains(":memory:") || url.contains("mode=memory"))
}

/// The absolute path of a SQLite database file, or `None` for other URLs and in-memory databases.
pub fn sqlite_path(url: &str) -> Option<PathBuf> {
    if !url.starts_with("sqlite:") || sqlite_in_memory(url) {
        return None;
    }
    let options = SqliteConnectOptions::from_str(url).ok()?;
    let filename = options.get_filename();
    if filename.as_os_str().is_empty() {
        return None;
    }
    std::path::absolute(filename).ok()
}

/// Refuses a `DATABASE_URL` that cannot be read, before any connection is tried: an
/// unknown scheme, or a PostgreSQL or SQLite URL that does not parse. The reason never
/// repeats the URL, which may hold a password.
pub fn check_url(url: &str) -> Result<(), String> {
    let parsed = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        PgConnectOptions::from_str(url).map(drop)
    } else if url.starts_with("sqlite:") {
        match SqliteConnectOptions::from_str(url) {
            // SQLite would read such a name as a URI of its own, naming another file than
            // the one Courier locks and reports. (An in-memory database is named so by sqlx
            // itself, and has no file.)
            Ok(options)
                if !sqlite_in_memory(url)
                    && options
                        .get_filename()
                        .to_string_lossy()
                        .starts_with("file:") =>
            {
                return Err("DATABASE_URL names the SQLite file as a file: URI; give its path \
                     instead (e.g. sqlite://courier.db?mode=rwc or sqlite:///var/lib/courier/courier.db)"
                    .to_owned());
            }
            parsed => parsed.map(drop),
        }
    } else {
        return Err(
            "DATABASE_URL must start with postgres://, postgresql:// or sqlite: \
             (e.g. sqlite://courier.db?mode=rwc)"
                .to_owned(),
        );
    };
    parsed.map_err(|err| format!("DATABASE_URL cannot be read: {}", sqlx_message(&err)))
}

/// One line saying why `url` could not be opened and what to change. A PostgreSQL pool
/// that timed out is asked once more, directly, so the real cause (connection refused,
/// an unknown host, a wrong password) is told instead of "pool timed out".
pub async fn explain_connect_error(url: &str, err: &DbErr, timeouts: Timeouts) -> String {
    let cause = sqlx_cause(err);
    if url.starts_with("sqlite:") {
        return explain_sqlite(url, err, cause);
    }
    let Ok(options) = super::pg_options(url) else {
        return describe(err);
    };
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return describe(err);
    }
    // A `host` (or `?host=`) that is a directory names the server's Unix socket there.
    let at = match options.get_socket() {
        Some(dir) => format!(
            "the socket {}",
            dir.join(format!(".s.PGSQL.{}", options.get_port()))
                .display()
        ),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    let target = format!(
        "PostgreSQL at {at} (database {:?}, user {:?})",
        options.get_database().unwrap_or(options.get_username()),
        options.get_username(),
    );
    let reason = match cause {
        Some(sqlx::Error::PoolTimedOut) => {
            let probe =
                tokio::time::timeout(timeouts.acquire.min(PROBE_TIMEOUT), options.connect()).await;
            let waited = timeouts.acquire.as_millis();
            let reason = match probe {
                Ok(Err(probe)) => sqlx_message(&probe),
                Ok(Ok(connection)) => {
                    let _ = connection.close().await;
                    "it accepted no connection in time (it answers now: was it starting up?)"
                        .to_owned()
                }
                Err(_) => {
                    return format!(
                        "cannot connect to {target}: no answer in {waited} ms \
                         (COURIER_DB_ACQUIRE_TIMEOUT_MS), nor on a second look as long (a \
                         firewall, or a host that is down?); check DATABASE_URL and that the \
                         server is running and reachable"
                    )
                }
            };
            return format!(
                "cannot connect to {target}: {reason}, for {waited} ms (COURIER_DB_ACQUIRE_TIMEOUT_MS); \
                 check DATABASE_URL and that the server is running and reachable"
            );
        }
        Some(cause) => sqlx_message(cause),
        None => describe(err),
    };
    format!("cannot connect to {target}: {reason}; check DATABASE_URL")
}

fn explain_sqlite(url: &str, err: &DbErr, cause: Option<&sqlx::Error>) -> String {
    let path = sqlite_path(url).map_or_else(|| redact(url), |path| path.display().to_string());
    let reason = cause.map_or_else(|| describe(err), sqlx_message);
    let cannot_open = matches!(cause, Some(sqlx::Error::Database(db))
        if db.code().and_then(|code| code.parse::<i32>().ok()).map(|code| code & 0xff) == Some(SQLITE_CANTOPEN));
    let query = url.split_once('?').map_or("", |(_, query)| query);
    let parent = std::path::Path::new(&path)
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty());
    let directory = parent.map_or_else(|| ".".to_owned(), |dir| dir.display().to_string());
    let hint = if !cannot_open {
        "check DATABASE_URL".to_owned()
    } else if std::path::Path::new(&path).is_dir() {
        "that is a directory: DATABASE_URL must name the database file".to_owned()
    } else if parent.is_some_and(|dir| !dir.is_dir()) {
        format!("the directory {directory} does not exist: create it (Courier creates the database file, not its directory)")
    } else if !query.split('&').any(|pair| pair.starts_with("mode=")) {
        "to create the file when it does not exist, add ?mode=rwc to DATABASE_URL \
         (e.g. sqlite://courier.db?mode=rwc)"
            .to_owned()
    } else {
        format!(
            "check that the directory {directory} is writable, and that DATABASE_URL has ?mode=rwc"
        )
    };
    format!("cannot open the SQLite database {path}: {reason}; {hint}")
}

/// A driver error as a person wants to read it: the database's own message (without the
/// PostgreSQL server's source line), or the I/O error behind a connection failure.
pub fn sqlx_message(err: &sqlx::Error) -> String {
    match err {
        sqlx::Error::Database(db) => db.message().to_owned(),
        sqlx::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// A SeaORM error in one readable piece: the driver's cause when there is one.
pub fn describe(err: &DbErr) -> String {
    match (err, sqlx_cause(err)) {
        (_, Some(cause)) => sqlx_message(cause),
        (DbErr::Custom(message) | DbErr::Migration(message), None) => message.clone(),
        (other, None) => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_sqlite_file_is_located_from_the_working_directory() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            sqlite_path("sqlite://courier.db?mode=rwc"),
            Some(cwd.join("courier.db"))
        );
        assert_eq!(
            sqlite_path("sqlite:///var/lib/courier.db"),
            Some(PathBuf::from("/var/lib/courier.db"))
        );
        assert_eq!(sqlite_path("sqlite::memory:"), None);
        assert!(sqlite_in_memory("sqlite::memory:"));
        assert!(sqlite_in_memory("sqlite://file?mode=memory"));
        assert!(!sqlite_in_memory("sqlite://courier.db?mode=rwc"));
        assert!(!sqlite_in_memory("postgres://u@h/memory"));
        assert_eq!(sqlite_path("postgres://u@h/db"), None);
        assert_eq!(
            location("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        // A SQLite name SQLite itself would read as a URI naming another file is refused.
        for uri in [
            "sqlite://file:courier.db?mode=rwc",
            "sqlite:file:courier.db",
            "sqlite://file:/tmp/courier.db?mode=rw",
        ] {
            assert!(
                check_url(uri).is_err_and(|why| why.contains("file: URI")),
                "{uri}"
            );
        }
        assert_eq!(check_url("sqlite://courier.db?mode=rwc"), Ok(()));
        assert_eq!(check_url("sqlite://files/courier.db"), Ok(()));
        // In memory, as the README offers it.
        for memory in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://x.db?mode=memory",
        ] {
            assert_eq!(check_url(memory), Ok(()), "{memory}");
        }
        // A URL that does not parse still hides its password.
        assert_eq!(
            location("postgres://u:se:cr@et@127.0.0.1:notaport/db"),
            "postgres://u:***@127.0.0.1:notaport/db"
        );
    }
}
