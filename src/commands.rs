//! The CLI commands: what `courier serve`, `migrate`, `schema` and `api-key create` do.

use std::io::Write as _;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::auth::{self, Role};
use crate::config::{
    ApiKeyCommand, Cli, Command, CreateApiKeyArgs, DatabaseArgs, RoleArg, ServeArgs,
};
use crate::db::{self, Db};
use crate::error::Error;
use crate::schema;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Settings could not be read.
    #[error("invalid configuration")]
    Config(#[from] clap::Error),
    /// The database could not be reached or migrated.
    #[error("database error")]
    Database(#[from] sea_orm::DbErr),
    /// A domain operation refused.
    #[error(transparent)]
    Service(#[from] Error),
    /// Binding or serving failed.
    #[error("I/O error")]
    Io(#[from] std::io::Error),
}

/// Runs the command the command line names (`serve` when none).
pub async fn run(cli: Cli) -> Result<(), CommandError> {
    match cli.command {
        None => serve(&cli.database, ServeArgs::from_env()?).await,
        Some(Command::Serve(args)) => serve(&cli.database, *args).await,
        Some(Command::Migrate) => {
            connect(&cli.database).await?.close().await?;
            tracing::info!("migrations applied");
            Ok(())
        }
        Some(Command::Schema) => {
            print_stdout(&schema::sdl())?;
            Ok(())
        }
        Some(Command::ApiKey(ApiKeyCommand::Create(args))) => {
            create_api_key(&cli.database, args).await
        }
    }
}

/// Connects and applies pending migrations.
async fn connect(database: &DatabaseArgs) -> Result<Db, CommandError> {
    let db = Db::connect_with(
        &database.database_url,
        database.db_pool_size,
        database.timeouts(),
    )
    .await?;
    db.migrate().await?;
    Ok(db)
}

async fn serve(database: &DatabaseArgs, config: ServeArgs) -> Result<(), CommandError> {
    tracing::info!(database = %db::redact(&database.database_url), "starting");
    let db = connect(database).await?;
    let listener = TcpListener::bind(config.bind).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    App::new(db.clone(), config, shutdown)
        .serve(listener)
        .await?;
    db.close().await?;
    tracing::info!("stopped");
    Ok(())
}

async fn create_api_key(
    database: &DatabaseArgs,
    args: CreateApiKeyArgs,
) -> Result<(), CommandError> {
    let db = connect(database).await?;
    let role = match args.role {
        RoleArg::Admin => Role::Admin,
        RoleArg::Partner => Role::Partner,
    };
    let key = auth::create_api_key(&db, &args.name, role, &args.endpoints).await?;
    db.close().await?;
    tracing::info!(api_key_id = %key.id, role = role.as_str(), "API key created; the token is shown once");
    print_stdout(&key.token)?;
    Ok(())
}

/// Prints a line on stdout, reporting a closed pipe as an error rather than panicking.
fn print_stdout(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", text.trim_end())?;
    stdout.flush()
}

/// Cancels `shutdown` on SIGTERM or Ctrl-C.
async fn cancel_on_signal(shutdown: CancellationToken) {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    let signal = tokio::select! {
        () = ctrl_c => "Ctrl-C",
        () = terminate => "SIGTERM",
    };
    shutdown.cancel();
    tracing::info!(signal, "shutting down");
}
