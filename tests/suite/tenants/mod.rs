//! Tenants and their keys: scope enforced on every operation across two instances, a key's
//! scope growing with its tenant, tenants' keys managing their own endpoints, and portal
//! links that expire on every process.

mod growth;
mod portal;
mod scope;
