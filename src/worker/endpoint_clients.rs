//! The HTTP clients webhooks go out through: one per endpoint, so kept-alive connections
//! are never shared between endpoints, even on one host. A receiver that breaks HTTP on a
//! connection (a second response after the first, an answer before the request's body was
//! read) then spoils only its own endpoint's next request, never another endpoint's: a
//! connection shared across endpoints handed the stray bytes to the next request on it,
//! whatever its endpoint, so a `500` could be recorded as another endpoint's success.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reqwest::dns::Resolve;
use reqwest::redirect::Policy;
use uuid::Uuid;

/// The most headers a receiver's answer may carry (its head stays within hyper's buffer
/// limit however many there are).
const MAX_RESPONSE_HEADERS: usize = 1_000;

/// Endpoints whose clients (and idle connections) are kept; the least recently used beyond
/// it is dropped, its idle connections closed.
const CLIENTS_KEPT: NonZeroUsize = match NonZeroUsize::new(1_024) {
    Some(kept) => kept,
    None => NonZeroUsize::MIN,
};

/// How long an idle kept-alive connection stays open.
const IDLE_FOR: Duration = Duration::from_secs(60);

/// Each endpoint's client, made on first use, with what they all share.
pub(super) struct EndpointClients {
    clients: Mutex<lru::LruCache<Uuid, reqwest::Client>>,
    timeout: Duration,
    resolver: Arc<dyn Resolve>,
    tls: rustls::ClientConfig,
}

impl std::fmt::Debug for EndpointClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointClients")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl EndpointClients {
    /// Clients with `timeout` for connecting and for the whole request, resolving names
    /// through `resolver`. Settings a client refuses are told now, not at the first webhook.
    pub(super) fn new(
        timeout: Duration,
        resolver: Arc<dyn Resolve>,
    ) -> Result<Self, super::dispatch::DispatcherError> {
        crate::crypto::install_tls_provider();
        let clients = EndpointClients {
            clients: Mutex::new(lru::LruCache::new(CLIENTS_KEPT)),
            timeout,
            resolver,
            tls: tls_config()?,
        };
        clients.build()?;
        Ok(clients)
    }

    /// `endpoint_id`'s client, made on first use.
    pub(super) fn client_for(&self, endpoint_id: Uuid) -> Result<reqwest::Client, reqwest::Error> {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = clients.get(&endpoint_id) {
            return Ok(client.clone());
        }
        let client = self.build()?;
        clients.put(endpoint_id, client.clone());
        Ok(client)
    }

    /// One endpoint's client: the shared settings, resolver and TLS configuration (one
    /// certificate store, one session cache), its own connection pool. No redirects, no
    /// proxies.
    fn build(&self) -> Result<reqwest::Client, reqwest::Error> {
        reqwest::Client::builder()
            .user_agent(concat!("Courier/", env!("CARGO_PKG_VERSION")))
            .redirect(Policy::none())
            .no_proxy()
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .pool_idle_timeout(IDLE_FOR)
            .tcp_nodelay(true)
            // Any 2xx is a success, however the answer's head is dressed: many headers
            // (hyper's own limit is 100), or a malformed one, do not fail it.
            .http1_max_headers(MAX_RESPONSE_HEADERS)
            .http1_ignore_invalid_headers_in_responses(true)
            .dns_resolver(self.resolver.clone())
            .tls_backend_preconfigured(self.tls.clone())
            .build()
    }
}

/// The TLS configuration every endpoint's client shares, as reqwest makes its own: the
/// process's crypto provider, its safe protocol versions, the platform's certificate
/// verifier, HTTP/1.1.
fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = match rustls::crypto::CryptoProvider::get_default() {
        Some(provider) => provider.clone(),
        None => Arc::new(rustls::crypto::ring::default_provider()),
    };
    let verifier = rustls_platform_verifier::Verifier::new(provider.clone())?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_endpoint_keeps_one_client_of_its_own() {
        let resolver: Arc<dyn Resolve> = Arc::new(reqwest_resolver());
        let clients = EndpointClients::new(Duration::from_secs(1), resolver).unwrap();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        clients.client_for(a).unwrap();
        clients.client_for(b).unwrap();
        clients.client_for(a).unwrap();
        let kept = clients.clients.lock().unwrap();
        assert_eq!(kept.len(), 2, "one client per endpoint, made once");
    }

    /// A resolver that resolves nothing (the test sends no request).
    fn reqwest_resolver() -> impl Resolve {
        struct Nothing;
        impl Resolve for Nothing {
            fn resolve(&self, _: reqwest::dns::Name) -> reqwest::dns::Resolving {
                Box::pin(async { Ok(Box::new(std::iter::empty()) as reqwest::dns::Addrs) })
            }
        }
        Nothing
    }
}
