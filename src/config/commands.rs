//! The arguments of Courier's management commands (`courier api-key ...`, `courier tenant ...`,
//! `courier endpoint ...`).

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

/// `courier endpoint ...`
#[derive(Debug, Subcommand)]
pub enum EndpointCommand {
    /// Give an endpoint a new signing secret and print it, once, alone on stdout: how an
    /// endpoint whose secret no key opens (its key lost) is recovered when no process
    /// starts, with `--grace-seconds 0` (a secret that cannot be opened cannot sign on).
    RotateSecret(RotateSecretArgs),
}

/// Arguments of `courier endpoint rotate-secret`.
#[derive(Debug, Args)]
pub struct RotateSecretArgs {
    /// The endpoint's id.
    pub id: uuid::Uuid,
    /// How long the replaced secret keeps signing beside the new one, in seconds (0 to
    /// 2592000); 0 to replace a secret that cannot be opened.
    #[arg(long, default_value_t = crate::service::rotation::DEFAULT_ROTATION_GRACE_SECS,
        value_parser = clap::value_parser!(i64).range(0..=crate::service::rotation::MAX_ROTATION_GRACE_SECS))]
    pub grace_seconds: i64,
    /// The keys signing secrets are sealed with, as `courier serve` takes them: the new
    /// secret is sealed with the first.
    #[arg(long, env = "COURIER_ENCRYPTION_KEY", hide_env_values = true, value_parser = crate::crypto::sealing::parse_keys)]
    pub encryption_key: Option<crate::crypto::sealing::SecretKeys>,
}
