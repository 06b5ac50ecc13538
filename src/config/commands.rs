//! The arguments of Courier's management commands (`courier api-key ...`, `courier tenant ...`).

use clap::{Args, Subcommand};

/// `courier tenant ...`
#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its id, alone on stdout.
    Create(CreateTenantArgs),
    /// Print every tenant, one per line.
    List,
}

/// Arguments of `courier tenant create`.
#[derive(Debug, clap::Args)]
pub struct CreateTenantArgs {
    /// The tenant's name, 1 to 200 characters.
    #[arg(long)]
    pub name: String,
}

/// `courier api-key ...`
#[derive(Debug, Subcommand)]
pub enum ApiKeyCommand {
    /// Create a key and print its token, once, alone on stdout.
    Create(CreateApiKeyArgs),
    /// Print every key, one per line (never tokens or hashes).
    List,
    /// Revoke a key: every running process refuses it within a second.
    Revoke(RevokeApiKeyArgs),
}

/// Arguments of `courier api-key revoke`.
#[derive(Debug, Args)]
pub struct RevokeApiKeyArgs {
    /// The key's id (as `courier api-key list` prints it).
    pub id: uuid::Uuid,
}

/// Arguments of `courier api-key create`.
#[derive(Debug, Args)]
pub struct CreateApiKeyArgs {
    /// A label for the key.
    #[arg(long)]
    pub name: String,
    /// `admin` may do everything; `partner` only what its endpoints allow.
    #[arg(long, value_parser = role_parser())]
    pub role: crate::auth::Role,
    /// An endpoint id the key may use (partner keys; repeat for several).
    #[arg(long = "endpoint", value_name = "ID", conflicts_with = "tenant")]
    pub endpoints: Vec<uuid::Uuid>,
    /// The tenant whose endpoints the key may use and manage, those created later
    /// included (partner keys, instead of `--endpoint`).
    #[arg(long, value_name = "ID")]
    pub tenant: Option<uuid::Uuid>,
}

/// Parses `--role` into a role by its stored value (`admin`, `partner`).
fn role_parser() -> impl clap::builder::TypedValueParser<Value = crate::auth::Role> {
    use clap::builder::TypedValueParser as _;
    use sea_orm::ActiveEnum as _;
    clap::builder::PossibleValuesParser::new(["admin", "partner"])
        .try_map(|name| crate::auth::Role::try_from_value(&name))
}
