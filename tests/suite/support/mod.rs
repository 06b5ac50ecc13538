//! Shared test support: fresh databases (SQLite files, PostgreSQL databases), app instances on port 0,
//! a GraphQL client, and a proxy that cuts the network to the database.

pub mod app;
pub mod browser;
pub mod collector;
pub mod console;
pub mod database;
pub mod endpoints;
pub mod fixtures;
pub mod gatekeeper;
pub mod history;
pub mod operational;
pub mod ordering;
pub mod partition;
pub mod postgres_server;
pub mod prefix_proxy;
pub mod process;
pub mod receiver;
pub mod seeding;
pub mod sets;
pub mod subscribed;
pub mod tenants;
pub mod websocket;

pub use app::{gql_error_code, response_error_code, TestApp};
pub use browser::{TestBrowser, TestPage};
pub use database::{Backend, TestDb};
pub use partition::PartitionProxy;
pub use receiver::{Receiver, Reply, ReplyBody};

/// An HTTP client for talking to test servers. reqwest is built without a bundled TLS
/// crypto provider (Courier installs ring), so install it here before building clients.
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// Runs one async test body against both backends: `mod sqlite` is the fast suite,
/// `mod postgres` proves the same behaviour on the production database.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Backend::Postgres).await;
                }
            )*
        }
    };
}

/// Runs a race test on every backend: SQLite, PostgreSQL at the server default, and
/// PostgreSQL with `default_transaction_isolation = 'repeatable read'`, where only
/// Courier's own transaction policy keeps the races settled.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        $crate::on_both_backends!($($name),*);
        mod postgres_repeatable_read {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Backend::PostgresRepeatableRead).await;
                }
            )*
        }
    };
}

/// Runs a PostgreSQL-only race test at the server default isolation and at REPEATABLE READ.
#[macro_export]
macro_rules! on_postgres {
    ($($name:ident),* $(,)?) => {
        mod postgres_only {
            mod default_isolation {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $name() {
                        super::super::$name($crate::support::Backend::Postgres).await;
                    }
                )*
            }
            mod repeatable_read {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $name() {
                        super::super::$name($crate::support::Backend::PostgresRepeatableRead).await;
                    }
                )*
            }
        }
    };
}
