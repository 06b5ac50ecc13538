//! One `courier serve` per SQLite file: a second is refused at start-up. Each process tells
//! its own subscribers of its own changes only (PostgreSQL's notifications carry them
//! between processes; SQLite has none), so a second process on the file would leave the
//! first one's dashboards blind to what it delivered.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use crate::db;

/// The lock a serving process holds on its SQLite file, released when it exits (however it
/// exits: the system drops the lock with the process).
#[derive(Debug)]
pub struct ServeLock {
    /// The lock file, open and locked.
    file: File,
    /// Its path.
    path: PathBuf,
    /// The database it locks.
    database: PathBuf,
}

impl Drop for ServeLock {
    /// A start that ended before the database was made (a mistyped name, say) leaves no lock
    /// file for it. The file goes while still locked (and only while the path names it), and
    /// a process that opened it meanwhile finds, once it has its lock, that the path names
    /// another file, and takes that one (see [`hold`]): one lock for the path, whatever the
    /// order.
    fn drop(&mut self) {
        if !self.database.exists() && names(&self.path, &self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Why a process may not serve this SQLite file.
#[derive(Debug, thiserror::Error)]
pub enum ServeLockError {
    /// Another process holds the file's serving lock.
    #[error(
        "another `courier serve` is using the SQLite database {}: run one process per SQLite \
         file (several processes on one database need PostgreSQL)",
        database.display()
    )]
    AlreadyServed {
        /// The database file.
        database: PathBuf,
    },
    /// The serving lock cannot be taken at all: serving without it could let a second
    /// process serve the file unnoticed.
    #[error(
        "cannot take the serving lock {}: {reason}; it must be a file this user may open \
         (left by a `courier serve` run as another user, change its owner, or remove it \
         while no `courier serve` runs on the database)",
        path.display()
    )]
    Unusable {
        /// The lock file.
        path: PathBuf,
        /// Why it cannot be opened or locked.
        reason: std::io::Error,
    },
    /// There is no serving lock, and it cannot be made.
    #[error(
        "cannot create the serving lock {}: {reason}; the database's directory must be \
         writable by this user (SQLite writes its journal there too)",
        path.display()
    )]
    Uncreatable {
        /// The lock file.
        path: PathBuf,
        /// Why it cannot be created.
        reason: std::io::Error,
    },
}

/// Takes the serving lock of the SQLite file `database_url` names (`None` for PostgreSQL,
/// an in-memory database, or a file system that takes no such locks, which is warned of).
/// A lock file this user may read but not write (left by a process run as another user)
/// still locks: the lock needs no write access.
pub fn hold(database_url: &str) -> Result<Option<ServeLock>, ServeLockError> {
    let Some(database) = db::sqlite_path(database_url) else {
        return Ok(None);
    };
    let database = resolved(&database);
    let path = lock_path(&database);
    // A lock on a file that has since been removed from the path locks nothing anyone else
    // will open: taken again on the file the path now names (each retry needs another
    // process to have let go of that file meanwhile, so a few are plenty).
    for _ in 0..LOCK_TRIES {
        match lock(&database, &path)? {
            Some(held) if !names(&path, &held.file) => continue,
            held => return Ok(held),
        }
    }
    let reason = std::io::Error::other("it kept being replaced while it was locked");
    Err(ServeLockError::Unusable { path, reason })
}

/// Tries at taking the lock on the file its path names.
const LOCK_TRIES: usize = 10;

/// Opens (or creates) the lock file `path` of `database` and takes its lock.
fn lock(database: &Path, path: &Path) -> Result<Option<ServeLock>, ServeLockError> {
    let opened = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .or_else(|err| match err.kind() {
            std::io::ErrorKind::PermissionDenied => File::open(path).map_err(|_| err),
            _ => Err(err),
        });
    let path = path.to_owned();
    let file = match opened {
        Ok(file) if file.metadata().is_ok_and(|meta| meta.is_file()) => file,
        Ok(_) => {
            let reason = std::io::Error::other("it is not a regular file");
            return Err(ServeLockError::Unusable { path, reason });
        }
        Err(reason) if !path.exists() => {
            return Err(ServeLockError::Uncreatable { path, reason });
        }
        Err(reason) => return Err(ServeLockError::Unusable { path, reason }),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(ServeLock {
            file,
            path,
            database: database.to_owned(),
        })),
        Err(TryLockError::WouldBlock) => Err(ServeLockError::AlreadyServed {
            database: database.to_owned(),
        }),
        // A file system without such locks (some network mounts): SQLite's own locking still
        // keeps the file whole; only a second server would go unnoticed.
        Err(TryLockError::Error(reason)) if locks_unsupported(&reason) => {
            tracing::warn!(path = %path.display(), error = %reason,
                "this file system takes no serving lock: make sure no other `courier serve` uses the database");
            Ok(None)
        }
        Err(TryLockError::Error(reason)) => Err(ServeLockError::Unusable { path, reason }),
    }
}

/// Whether `path` still names the open `file` (not removed, nor replaced by another).
fn names(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(named), Ok(open)) => named.dev() == open.dev() && named.ino() == open.ino(),
        _ => false,
    }
}

/// Whether a lock failed because the file system takes none (`ENOLCK`, `EOPNOTSUPP`).
fn locks_unsupported(err: &std::io::Error) -> bool {
    err.kind() == std::io::ErrorKind::Unsupported
        || matches!(err.raw_os_error(), Some(code) if code == nix::libc::ENOLCK || code == nix::libc::EOPNOTSUPP)
}

/// `database` with every symbolic link resolved (in its directories and, once it exists,
/// the file itself), so that every name of one file takes one lock. A hard link is another
/// name the system cannot tell apart: SQLite itself must not be used through one.
fn resolved(database: &Path) -> PathBuf {
    if let Ok(file) = std::fs::canonicalize(database) {
        return file;
    }
    match (database.parent(), database.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|dir| dir.join(name))
            .unwrap_or_else(|_| database.to_owned()),
        _ => database.to_owned(),
    }
}

/// The lock file beside `database`: its name with `.serve-lock` added.
fn lock_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(".serve-lock");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_of_one_file_is_refused_until_the_first_lets_go() {
        let dir = std::env::temp_dir().join(format!("courier-lock-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.join("courier.db").display());
        let first = hold(&url).unwrap();
        assert!(first.is_some());
        let refused = hold(&url).unwrap_err();
        assert!(
            refused.to_string().contains("one process per SQLite file"),
            "{refused}"
        );
        let other = format!("sqlite://{}?mode=rwc", dir.join("other.db").display());
        assert!(
            hold(&other).unwrap().is_some(),
            "another file is another lock"
        );
        std::fs::write(dir.join("courier.db"), b"").unwrap();
        std::os::unix::fs::symlink(dir.join("courier.db"), dir.join("link.db")).unwrap();
        let link = format!("sqlite://{}?mode=rwc", dir.join("link.db").display());
        assert!(hold(&link).is_err(), "a symbolic link names the same file");
        drop(first);
        assert!(hold(&url).unwrap().is_some());
        // A lock file that cannot be opened refuses to serve rather than serving unlocked.
        std::fs::create_dir(dir.join("dir.db.serve-lock")).unwrap();
        let unusable = format!("sqlite://{}?mode=rwc", dir.join("dir.db").display());
        assert!(
            matches!(hold(&unusable), Err(ServeLockError::Unusable { .. })),
            "a directory in the lock's place"
        );
        // A lock taken for a database never made goes with the process; one whose database
        // exists stays.
        let never = format!("sqlite://{}?mode=rwc", dir.join("never.db").display());
        drop(hold(&never).unwrap());
        assert!(!dir.join("never.db.serve-lock").exists());
        drop(hold(&url).unwrap());
        assert!(dir.join("courier.db.serve-lock").exists());
        // A lock whose file was removed from under it (by a holder letting go) is taken again
        // on the file the path names now, so two holders never hold different files.
        let taken = hold(&never).unwrap();
        std::fs::remove_file(dir.join("never.db.serve-lock")).unwrap();
        let again = hold(&never).unwrap();
        assert!(again.is_some(), "the path's new file is free");
        drop(taken);
        assert!(matches!(
            hold(&never),
            Err(ServeLockError::AlreadyServed { .. })
        ));
        drop(again);
        assert!(hold("sqlite::memory:").unwrap().is_none());
        assert!(hold("postgres://localhost/courier").unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
