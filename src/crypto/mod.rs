//! Cryptography: signing secrets sealed at rest, and minting the secrets webhooks are signed with.

pub mod sealing;
pub mod signing;

/// Makes ring the process's TLS crypto provider (reqwest is built without a bundled one),
/// once, before any HTTP client is built: the webhook dispatcher's and the trace exporter's.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
