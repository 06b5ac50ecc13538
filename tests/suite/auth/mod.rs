//! API keys and who may do what: authentication, roles and scopes, the key lifecycle
//! (create, list, last used, revoke), and revocation felt by every process.

mod api_keys;
mod keys;
mod revocation;
