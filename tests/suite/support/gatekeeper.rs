//! A database made to refuse connections, as one restarting or failing over does: `ALTER
//! DATABASE ... ALLOW_CONNECTIONS false` and every open connection to it terminated, from
//! an operator's session on the server's own database (a database cannot refuse its own
//! session); then allowed again.

use courier::db::Db;
use sea_orm::ConnectionTrait;

use super::TestDb;

/// The operator's session that refuses and allows connections to one test database.
pub struct Gatekeeper {
    operator: Db,
    name: String,
}

impl Gatekeeper {
    /// A session on the server of `db` (PostgreSQL).
    pub async fn of(db: &TestDb) -> Gatekeeper {
        let (server, name) = db.on_server().expect("PostgreSQL");
        let operator = Db::connect(server, 1)
            .await
            .expect("the server's own database");
        Gatekeeper {
            operator,
            name: name.to_owned(),
        }
    }

    /// Refuses new connections to the database and terminates every open one.
    pub async fn refuse(&self) {
        self.allow_connections(false).await;
        let name = &self.name;
        self.operator
            .conn()
            .execute_unprepared(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
            ))
            .await
            .expect("terminate its connections");
    }

    /// Refuses new connections to the database and ends the idle ones, leaving those in
    /// use (in a transaction, or waiting) be: as a server out of connection slots answers
    /// a new connection with an error while the work already connected goes on.
    pub async fn refuse_new(&self) {
        self.allow_connections(false).await;
        let name = &self.name;
        self.operator
            .conn()
            .execute_unprepared(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = '{name}' AND state = 'idle'"
            ))
            .await
            .expect("terminate its idle connections");
    }

    /// Accepts connections to the database again.
    pub async fn allow(&self) {
        self.allow_connections(true).await;
    }

    async fn allow_connections(&self, allowed: bool) {
        let name = &self.name;
        self.operator
            .conn()
            .execute_unprepared(&format!(
                "ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS {allowed}"
            ))
            .await
            .expect("change whether the database allows connections");
    }
}
