//! The CLI commands: what `courier serve`, `migrate`, `schema` and `api-key create|list|revoke` do.

use std::io::Write as _;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use sea_orm::ActiveEnum as _;

use super::{serve_lock, signals};
use crate::auth::{self, RevokeOutcome};
use crate::config::{
    ApiKeyCommand, Cli, Command, CreateApiKeyArgs, DatabaseArgs, EndpointCommand, RotateSecretArgs,
    ServeArgs, TenantCommand,
};
use crate::db::{self, Db};
use crate::error::Error;
use crate::schema;
use crate::service::pagination::{PageRequest, MAX_PAGE_SIZE};
use crate::service::sealing;
use crate::service::{api_keys, rotation, tenants};
use uuid::Uuid;

/// Why a command failed. Each message names what to change; `main` prints it once, on one line.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Settings that make no sense together.
    #[error("invalid configuration: {0}")]
    Settings(String),
    /// `DATABASE_URL` cannot be read (see [`db::check_url`]).
    #[error("{0}")]
    DatabaseUrl(String),
    /// The database could not be opened: the cause and what to change, in one line.
    #[error("{0}")]
    Connect(String),
    /// The database could not be migrated or used.
    #[error("database error")]
    Database(#[from] sea_orm::DbErr),
    /// A domain operation refused.
    #[error(transparent)]
    Service(#[from] Error),
    /// A stored signing secret cannot be opened: the process must not start.
    #[error(transparent)]
    Sealing(#[from] sealing::SealingError),
    /// The HTTP address could not be bound.
    #[error("cannot listen on {addr}: {reason}; set COURIER_BIND (or --bind) to a free address")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why it could not be had.
        reason: String,
    },
    /// Another process serves the same SQLite file, or its serving lock cannot be taken.
    #[error(transparent)]
    ServeLock(#[from] serve_lock::ServeLockError),
    /// Serving or printing failed.
    #[error("I/O error")]
    Io(#[from] std::io::Error),
}

impl CommandError {
    /// The process's exit code: 2 for a setting that cannot be read, or settings that
    /// contradict each other, as for a flag clap cannot parse; 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            CommandError::DatabaseUrl(_) | CommandError::Settings(_) => 2,
            _ => 1,
        }
    }
}

/// Runs the command the command line names (`serve` when none).
pub async fn run(cli: Cli) -> Result<(), CommandError> {
    match cli.command {
        None => serve(&cli.database, *cli.serve).await,
        Some(Command::Serve(args)) => serve(&cli.database, *args).await,
        Some(Command::Migrate) => {
            connect(&cli.database).await?.close().await?;
            tracing::info!(database = %db::location(&cli.database.database_url), "migrations applied");
            Ok(())
        }
        Some(Command::Schema) => {
            print_listing(&schema::sdl())?;
            Ok(())
        }
        Some(Command::ApiKey(ApiKeyCommand::Create(args))) => {
            create_api_key(&cli.database, args).await
        }
        Some(Command::ApiKey(ApiKeyCommand::List)) => list_api_keys(&cli.database).await,
        Some(Command::ApiKey(ApiKeyCommand::Revoke(args))) => {
            revoke_api_key(&cli.database, args.id).await
        }
        Some(Command::Tenant(TenantCommand::Create(args))) => {
            let db = connect(&cli.database).await?;
            let tenant = tenants::create(&db, &args.name).await?;
            db.close().await?;
            print_stdout(&tenant.id.to_string())?;
            Ok(())
        }
        Some(Command::Tenant(TenantCommand::List)) => list_tenants(&cli.database).await,
        Some(Command::Endpoint(EndpointCommand::RotateSecret(args))) => {
            rotate_secret(&cli.database, args).await
        }
    }
}

/// Gives an endpoint a new signing secret and prints it alone on stdout.
async fn rotate_secret(
    database: &DatabaseArgs,
    args: RotateSecretArgs,
) -> Result<(), CommandError> {
    let db = connect(database).await?;
    let keys = args.encryption_key.unwrap_or_default();
    let rotated = rotation::rotate(&db, &keys, args.id, Some(args.grace_seconds)).await;
    db.close().await?;
    let rotated = rotated?;
    tracing::info!(endpoint_id = %args.id, grace_seconds = args.grace_seconds,
        "a new signing secret: give it to the endpoint's receiver");
    print_stdout(rotated.secret.as_deref().unwrap_or_default())?;
    Ok(())
}

/// Prints every tenant, one tab-separated line each: id, name, created.
async fn list_tenants(database: &DatabaseArgs) -> Result<(), CommandError> {
    let db = connect(database).await?;
    let mut lines = vec!["id\tname\tcreated".to_owned()];
    let mut after = None;
    loop {
        let request = PageRequest {
            first: MAX_PAGE_SIZE,
            after,
            after_at: None,
        };
        let page = tenants::list(&db, request).await?;
        for tenant in &page.items {
            lines.push(format!(
                "{}\t{}\t{}",
                tenant.id,
                crate::labels::printable(&tenant.name),
                tenant.created_at.to_rfc3339()
            ));
        }
        match page.items.last() {
            Some(last) if page.has_next_page => after = Some(last.id),
            _ => break,
        }
    }
    db.close().await?;
    print_listing(&lines.join("\n"))?;
    Ok(())
}

/// Connects and applies pending migrations, saying which database it is.
async fn connect(database: &DatabaseArgs) -> Result<Db, CommandError> {
    let url = &database.database_url;
    db::check_url(url).map_err(CommandError::DatabaseUrl)?;
    let db = match Db::connect_with(url, database.db_pool_size, database.timeouts()).await {
        Ok(db) => db,
        Err(err) => {
            let message = db::explain_connect_error(url, &err, database.timeouts()).await;
            return Err(CommandError::Connect(message));
        }
    };
    db.migrate().await?;
    tracing::info!(database = %db::location(url), "database open");
    if db::sqlite_in_memory(url) {
        tracing::warn!(
            "the database is in memory: everything stored is lost when this process \
            stops, and no other process can share it"
        );
    }
    Ok(db)
}

/// How long `serve` waits at the end for the database pools to close: a connection still
/// out by then is held by work that will never give it back, and the process exits
/// without it (the operating system closes its socket).
const CLOSE_POOLS_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

async fn serve(database: &DatabaseArgs, mut config: ServeArgs) -> Result<(), CommandError> {
    config.check().map_err(CommandError::Settings)?;
    for doubt in config.doubts() {
        tracing::warn!("{doubt}");
    }
    // Listening for SIGTERM from the first moment (before saying it starts): one during
    // start-up stops it, exit 0.
    let shutdown = CancellationToken::new();
    tokio::spawn(signals::cancel_on_signal(
        shutdown.clone(),
        signals::terminate_signal(),
    ));
    db::check_url(&database.database_url).map_err(CommandError::DatabaseUrl)?;
    tracing::info!(database = %db::location(&database.database_url), "starting");
    // Held until the process exits.
    let _serving = serve_lock::hold(&database.database_url)?;
    let start = start(database, &config);
    let (db, listener) = tokio::select! {
        started = start => started?,
        () = shutdown.cancelled() => {
            tracing::info!("stopped before serving");
            return Ok(());
        }
    };
    if let Ok(listening) = listener.local_addr() {
        if let Some(base) = config.settle_public_url(listening) {
            tracing::warn!(%base, "COURIER_PUBLIC_URL is unset and the server listens on every \
                interface: portal links point at this machine only; set COURIER_PUBLIC_URL to \
                where users reach Courier");
        }
    }
    App::new(db.clone(), config, shutdown)
        .serve(listener)
        .await?;
    match tokio::time::timeout(CLOSE_POOLS_WITHIN, db.close()).await {
        Ok(closed) => closed?,
        Err(_) => tracing::warn!(
            "database connections still in use {}s after the service stopped; exiting without them",
            CLOSE_POOLS_WITHIN.as_secs()
        ),
    }
    tracing::info!("stopped");
    Ok(())
}

/// What `serve` does before it serves: warnings about the settings, the database opened and
/// migrated, its secrets checked and sealed, the address bound.
async fn start(
    database: &DatabaseArgs,
    config: &ServeArgs,
) -> Result<(Db, TcpListener), CommandError> {
    if config.allow_private_destinations {
        tracing::warn!(
            "COURIER_ALLOW_PRIVATE_DESTINATIONS is on: webhooks may reach loopback, private and \
             link-local addresses, this host and its network included"
        );
    }
    if config.max_payload_bytes > config.max_body_bytes {
        tracing::warn!(
            max_payload_bytes = config.max_payload_bytes,
            max_body_bytes = config.max_body_bytes,
            "COURIER_MAX_PAYLOAD_BYTES is above COURIER_MAX_BODY_BYTES: a request body holds \
             its payload, so no payload above COURIER_MAX_BODY_BYTES can be submitted"
        );
    }
    crate::http::connections::raise_file_limit(
        config.max_connections,
        u64::from(config.worker_concurrency).saturating_add(u64::from(database.db_pool_size)),
    );
    let db = connect(database).await?;
    // Refuse to start rather than serve a database that refuses every write.
    if let Err(err) = db.check_writable().await {
        let reason = db::sqlx_cause(&err).map_or_else(|| db::describe(&err), db::sqlx_message);
        let hint = match db::classify(&err) {
            db::Failure::Transient => {
                "another process holds its write lock: try again once it is done"
            }
            db::Failure::Unavailable | db::Failure::MaybeCommitted { .. } => {
                "its disk is full or failing: free space, or check the disk"
            }
            db::Failure::Refused => {
                "a serving process writes every submission: make the file (and its directory) \
                 writable by this user, and leave ?mode=ro out of DATABASE_URL"
            }
        };
        return Err(CommandError::Connect(format!(
            "cannot write the database {}: {reason}; {hint}",
            db::location(&database.database_url)
        )));
    }
    // Refuse to start rather than ever sign with a secret this process cannot open.
    let keys = config.secret_keys();
    let resealed = sealing::seal_at_rest(&db, &keys).await?;
    if resealed.secrets > 0 {
        tracing::info!(
            secrets = resealed.secrets,
            "signing secrets encrypted under the first COURIER_ENCRYPTION_KEY"
        );
    }
    let listener = TcpListener::bind(config.bind)
        .await
        .map_err(|err| CommandError::Bind {
            addr: config.bind,
            reason: match err.kind() {
                std::io::ErrorKind::AddrInUse => {
                    "the address is already in use (is another Courier running?)".to_owned()
                }
                _ => err.to_string(),
            },
        })?;
    Ok((db, listener))
}

async fn create_api_key(
    database: &DatabaseArgs,
    args: CreateApiKeyArgs,
) -> Result<(), CommandError> {
    // The token is shown once, on stdout: with nowhere to show it, no key is made.
    if !stdout_shows_anything() {
        return Err(CommandError::Io(std::io::Error::other(
            "stdout is closed or /dev/null: the new key's token, shown only once, would be \
             lost; no key was created",
        )));
    }
    let role = args.role;
    let limits = auth::KeyLimits {
        endpoints: &args.endpoints,
        tenant: args.tenant,
        expires_in: None,
    };
    // Flags that contradict each other are a usage error, told before the database is
    // opened.
    if let Err(refused) = limits.scope(role) {
        return Err(CommandError::Settings(refused.to_string()));
    }
    let db = connect(database).await?;
    let key = auth::create_api_key(&db, &args.name, role, limits).await?;
    if let Err(err) = print_stdout(&key.token) {
        // Nobody will ever hold this token: the key must not stay usable.
        auth::revoke_api_key(&db, key.id).await?;
        db.close().await?;
        tracing::warn!(api_key_id = %key.id, "the token could not be shown, so the key was revoked");
        return Err(err.into());
    }
    db.close().await?;
    tracing::info!(
        api_key_id = %key.id,
        role = %role.to_value(),
        database = %db::location(&database.database_url),
        "API key created; the token is shown once"
    );
    Ok(())
}

/// Whether what is written to stdout can be seen: not when it is closed (which the Rust
/// runtime turns into `/dev/null` at start-up) nor when it is `/dev/null`.
fn stdout_shows_anything() -> bool {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd as _;
        use std::os::unix::fs::MetadataExt as _;
        let Ok(stdout) = std::io::stdout().as_fd().try_clone_to_owned() else {
            return false;
        };
        let (Ok(stdout), Ok(null)) = (
            std::fs::File::from(stdout).metadata(),
            std::fs::metadata("/dev/null"),
        ) else {
            return true;
        };
        !(stdout.file_type() == null.file_type() && stdout.rdev() == null.rdev())
    }
    #[cfg(not(unix))]
    {
        true
    }
}

/// Prints every key, one tab-separated line each: id, name, role, endpoints, created,
/// revoked, last used, expires (a portal link's key; `-` when none). Never a token or a
/// hash.
async fn list_api_keys(database: &DatabaseArgs) -> Result<(), CommandError> {
    let db = connect(database).await?;
    let mut lines = vec![[
        "id",
        "name",
        "role",
        "endpoints",
        "created",
        "revoked",
        "last_used",
        "expires",
    ]
    .join("\t")];
    let mut after = None;
    loop {
        let request = PageRequest {
            first: MAX_PAGE_SIZE,
            after,
            after_at: None,
        };
        let page = api_keys::list(&db, request).await?;
        for key in &page.items {
            let scope = auth::scope_of(key);
            let endpoints = if let Some(tenant) = key.tenant_id {
                format!("tenant:{tenant}")
            } else if scope.is_empty() {
                "-".to_owned()
            } else {
                scope
                    .iter()
                    .map(Uuid::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let time = |at: Option<chrono::DateTime<chrono::Utc>>| {
                at.map_or_else(|| "-".to_owned(), |at| at.to_rfc3339())
            };
            let name = crate::labels::printable(&key.name);
            lines.push(
                [
                    key.id.to_string(),
                    name,
                    key.role.to_value(),
                    endpoints,
                    key.created_at.to_rfc3339(),
                    time(key.revoked_at),
                    time(key.last_used_at),
                    time(key.expires_at),
                ]
                .join("\t"),
            );
        }
        match page.items.last() {
            Some(last) if page.has_next_page => after = Some(last.id),
            _ => break,
        }
    }
    db.close().await?;
    print_listing(&lines.join("\n"))?;
    Ok(())
}

async fn revoke_api_key(database: &DatabaseArgs, id: Uuid) -> Result<(), CommandError> {
    let db = connect(database).await?;
    let outcome = auth::revoke_api_key(&db, id).await;
    db.close().await?;
    match outcome? {
        RevokeOutcome::Revoked(key) => {
            tracing::info!(api_key_id = %key.id, "API key revoked; every process refuses it within a second");
        }
        RevokeOutcome::AlreadyRevoked(key) => {
            tracing::info!(api_key_id = %key.id, "API key was already revoked");
        }
    }
    print_stdout(&format!("revoked {id}"))?;
    Ok(())
}

/// Prints a line on stdout, reporting a closed pipe as an error rather than panicking:
/// for output that must reach its reader (a new key's token, a new id).
fn print_stdout(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", text.trim_end())?;
    stdout.flush()
}

/// Prints a listing on stdout. A reader that closes the pipe once it has read enough
/// (`courier tenant list | head -1`) has what it wanted: that is no error.
fn print_listing(text: &str) -> std::io::Result<()> {
    match print_stdout(text) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        printed => printed,
    }
}
