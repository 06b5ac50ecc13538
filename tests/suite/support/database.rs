//! A fresh database per test, built by the real migrations and dropped afterwards.

use courier::db::Db;
use sea_orm::ConnectionTrait;
use uuid::Uuid;

use super::postgres_server;

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A temporary SQLite file.
    Sqlite,
    /// A freshly created PostgreSQL database.
    Postgres,
    /// A freshly created PostgreSQL database whose default isolation is REPEATABLE READ
    /// (a common server setting): Courier must pin what it needs itself.
    PostgresRepeatableRead,
}

/// One test's database. Several independent pools can be opened on it with [`TestDb::connect`].
pub struct TestDb {
    /// Connection URL of this database.
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    SqliteFile(std::path::PathBuf),
    PostgresDatabase { server_url: String, name: String },
}

impl TestDb {
    /// The PostgreSQL server's own URL and this database's name (`None` on SQLite): for
    /// an operator's session outside the database, which can change what the database
    /// itself cannot (refuse connections, say).
    pub fn on_server(&self) -> Option<(&str, &str)> {
        match &self.cleanup {
            Cleanup::PostgresDatabase { server_url, name } => Some((server_url, name)),
            Cleanup::SqliteFile(_) => None,
        }
    }

    /// The database's file, on SQLite (`None` on PostgreSQL).
    pub fn sqlite_path(&self) -> Option<&std::path::Path> {
        match &self.cleanup {
            Cleanup::SqliteFile(path) => Some(path),
            Cleanup::PostgresDatabase { .. } => None,
        }
    }

    /// Creates an empty database and applies the migrations to it.
    pub async fn new(backend: Backend) -> TestDb {
        let test_db = Self::new_unmigrated(backend).await;
        let db = test_db.connect(1).await;
        db.migrate().await.expect("migrate the test database");
        db.close().await.expect("close the migration pool");
        test_db
    }

    /// Creates an empty database without running the migrations.
    pub async fn new_unmigrated(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir()
                    .join(format!("courier-test-{}.db", Uuid::new_v4().simple()));
                TestDb {
                    url: format!("sqlite://{}?mode=rwc", path.display()),
                    cleanup: Cleanup::SqliteFile(path),
                }
            }
            Backend::Postgres | Backend::PostgresRepeatableRead => {
                let server_url = postgres_server::url().await;
                let name = format!("courier_test_{}", Uuid::new_v4().simple());
                let admin = Db::connect(&server_url, 1)
                    .await
                    .expect("connect to the PostgreSQL server");
                admin
                    .conn()
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("create the test database");
                if backend == Backend::PostgresRepeatableRead {
                    admin
                        .conn()
                        .execute_unprepared(&format!(
                            "ALTER DATABASE {name} SET default_transaction_isolation = 'repeatable read'"
                        ))
                        .await
                        .expect("make REPEATABLE READ the database default");
                }
                admin.close().await.expect("close the admin connection");
                TestDb {
                    url: with_database(&server_url, &name),
                    cleanup: Cleanup::PostgresDatabase { server_url, name },
                }
            }
        }
    }

    /// Deadlocks PostgreSQL broke in this database so far (read on a connection of its own).
    pub async fn deadlocks(&self) -> i64 {
        let conn = self.connect(1).await;
        let sql = "SELECT deadlocks AS n FROM pg_stat_database WHERE datname = current_database()";
        super::fixtures::count(&conn, sql, vec![]).await
    }

    /// Opens a new, independent pool of `size` connections on this database.
    pub async fn connect(&self, size: u32) -> Db {
        Db::connect(&self.url, size)
            .await
            .expect("connect to the test database")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::SqliteFile(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Cleanup::PostgresDatabase { server_url, name } => {
                let (server_url, name) = (server_url.clone(), name.clone());
                // Drop runs inside the test's runtime; a separate thread with its own runtime can block.
                let _ = std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build();
                    if let Ok(runtime) = runtime {
                        runtime.block_on(async {
                            if let Ok(admin) = Db::connect(&server_url, 1).await {
                                let _ = admin
                                    .conn()
                                    .execute_unprepared(&format!(
                                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                                    ))
                                    .await;
                                let _ = admin.close().await;
                            }
                        });
                    }
                })
                .join();
            }
        }
    }
}

/// `server_url` with its database path replaced by `name`.
fn with_database(server_url: &str, name: &str) -> String {
    let mut url = url::Url::parse(server_url).expect("TEST_DATABASE_URL is a URL");
    url.set_path(&format!("/{name}"));
    url.to_string()
}
