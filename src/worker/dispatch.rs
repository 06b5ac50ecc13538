//! Sending one webhook: Standard Webhooks signature, an HTTP client per endpoint (its own
//! kept-alive connections) with strict timeouts and no redirects or proxies, and the SSRF
//! guard applied at connect time.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{HeaderValue, CONTENT_TYPE};
use uuid::Uuid;

use super::answer::ReceiverAnswer;
use super::endpoint_clients::EndpointClients;
use super::retry_after;
use crate::destination;
use crate::service::lines;
use crate::telemetry::context::{TraceHeaders, TRACEPARENT_HEADER, TRACESTATE_HEADER};

/// What an attempt produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptOutcome {
    /// The HTTP status, if a response arrived.
    pub status: Option<u16>,
    /// Why the attempt failed; `None` on 2xx.
    pub error: Option<String>,
    /// A `Retry-After` the endpoint asked for (429 and 503 only).
    pub retry_after: Option<Duration>,
    /// Wall time of the request.
    pub duration: Duration,
    /// A coarse label for metrics.
    pub kind: OutcomeKind,
    /// What the receiver answered, if a response arrived.
    pub answer: Option<ReceiverAnswer>,
}

impl AttemptOutcome {
    /// Whether the endpoint accepted the webhook.
    pub fn succeeded(&self) -> bool {
        self.kind == OutcomeKind::Success
    }
}

/// Coarse classification of an attempt, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    /// 2xx.
    Success,
    /// Any other status.
    HttpStatus,
    /// No answer in time.
    Timeout,
    /// Could not connect, or the connection broke.
    Connection,
    /// The destination resolves to an address Courier may not contact.
    RefusedDestination,
    /// No request: the cycle's attempts were spent, the last one's outcome never recorded
    /// within its lease. Not an attempt of its own: it ends the delivery `FAILED`, adding
    /// nothing to the cycle's attempts and leaving no attempt row.
    LeaseSpent,
}

impl OutcomeKind {
    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Success => "success",
            OutcomeKind::HttpStatus => "http_status",
            OutcomeKind::Timeout => "timeout",
            OutcomeKind::Connection => "connection",
            OutcomeKind::RefusedDestination => "refused_destination",
            OutcomeKind::LeaseSpent => "lease_spent",
        }
    }
}

/// The webhook to send.
#[derive(Debug, Clone)]
pub struct Webhook<'a> {
    /// Stable across retries and replays: the receiver's dedupe key.
    pub id: Uuid,
    /// The endpoint it goes to: its connections are its own.
    pub endpoint_id: Uuid,
    /// The endpoint URL.
    pub url: &'a str,
    /// The endpoint's `whsec_` secret, as read just before sending.
    pub secret: &'a str,
    /// The secret a rotation replaced, while its grace period lasts: it signs too.
    pub previous_secret: Option<&'a str>,
    /// The JSON body.
    pub body: &'a [u8],
    /// The delivery's ordering key, sent as [`lines::ORDERING_KEY_HEADER`].
    pub ordering_key: Option<&'a str>,
    /// The attempt's trace context, sent as `traceparent` and `tracestate` (tracing on
    /// only).
    pub trace: Option<&'a TraceHeaders>,
}

/// Sends webhooks, each endpoint through an HTTP client of its own (see
/// [`super::endpoint_clients`]).
#[derive(Clone, Debug)]
pub struct Dispatcher {
    clients: Arc<EndpointClients>,
    allow_private: bool,
}

/// Why the dispatcher could not be built.
#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    /// The HTTP client refused its settings.
    #[error("cannot build the webhook HTTP client")]
    Client(#[from] reqwest::Error),
    /// The TLS settings could not be made (no usable certificate verifier).
    #[error("cannot set up TLS for webhooks: {0}")]
    Tls(#[from] rustls::Error),
}

impl Dispatcher {
    /// A dispatcher with `timeout` for connecting and for the whole request.
    pub fn new(timeout: Duration, allow_private: bool) -> Result<Self, DispatcherError> {
        let resolver: Arc<dyn Resolve> = Arc::new(GuardedResolver { allow_private });
        Ok(Dispatcher {
            clients: Arc::new(EndpointClients::new(timeout, resolver)?),
            allow_private,
        })
    }

    /// Signs and POSTs one webhook. Never fails: every problem is an outcome to record.
    pub async fn send(&self, webhook: &Webhook<'_>) -> AttemptOutcome {
        let started = Instant::now();
        let finish = |kind, status, error: Option<String>, retry_after, answer| AttemptOutcome {
            status,
            error,
            retry_after,
            duration: started.elapsed(),
            kind,
            answer,
        };

        if let Some(refusal) = self.refuse_literal_address(webhook.url) {
            return finish(
                OutcomeKind::RefusedDestination,
                None,
                Some(refusal),
                None,
                None,
            );
        }
        let headers = match signed_headers(webhook) {
            Ok(headers) => headers,
            Err(err) => return finish(OutcomeKind::Connection, None, Some(err), None, None),
        };
        let client = match self.clients.client_for(webhook.endpoint_id) {
            Ok(client) => client,
            Err(err) => {
                let (kind, message) = classify(err);
                return finish(kind, None, Some(message), None, None);
            }
        };
        let request = client
            .post(webhook.url)
            .headers(headers)
            .body(webhook.body.to_vec());
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(err) => {
                let (kind, message) = classify(err);
                return finish(kind, None, Some(message), None, None);
            }
        };
        let status = response.status();
        let retry_after = match status.as_u16() {
            429 | 503 => {
                retry_after::wait_asked(response.headers(), crate::db::measured::database_now())
            }
            _ => None,
        };
        let answer = Some(ReceiverAnswer::read(&mut response).await);
        if status.is_success() {
            finish(
                OutcomeKind::Success,
                Some(status.as_u16()),
                None,
                None,
                answer,
            )
        } else {
            let reason = status.canonical_reason().unwrap_or("");
            let mut message = format!("HTTP {} {reason}", status.as_u16())
                .trim_end()
                .to_owned();
            if status.is_redirection() {
                message.push_str(" (redirects are not followed)");
            }
            finish(
                OutcomeKind::HttpStatus,
                Some(status.as_u16()),
                Some(message),
                retry_after,
                answer,
            )
        }
    }

    /// URLs with a literal IP never reach the resolver, so they are checked here.
    fn refuse_literal_address(&self, url: &str) -> Option<String> {
        if self.allow_private {
            return None;
        }
        let parsed = url::Url::parse(url).ok()?;
        let ip = match parsed.host()? {
            url::Host::Ipv4(ip) => IpAddr::V4(ip),
            url::Host::Ipv6(ip) => IpAddr::V6(ip),
            url::Host::Domain(_) => return None,
        };
        destination::non_public(ip).map(|block| {
            format!(
                "destination refused: {ip} is not a public address, it is in {block} \
                 (set COURIER_ALLOW_PRIVATE_DESTINATIONS=true to allow it)"
            )
        })
    }
}

/// The Standard Webhooks headers for `webhook`, signed now: `v1,<sig>` with the current
/// secret, followed (space-separated) by one with the previous secret during its grace period.
fn signed_headers(webhook: &Webhook<'_>) -> Result<reqwest::header::HeaderMap, String> {
    let id = webhook.id.to_string();
    // The database's time as measured, not this host's: a host whose clock is off still
    // sends a timestamp the receiver's verifier accepts.
    let timestamp = crate::db::now().timestamp();
    let mut signatures = Vec::with_capacity(2);
    for secret in std::iter::once(webhook.secret).chain(webhook.previous_secret) {
        let signer = standardwebhooks::Webhook::new(secret)
            .map_err(|err| format!("the endpoint's signing secret is unusable: {err}"))?;
        signatures.push(
            signer
                .sign(&id, timestamp, webhook.body)
                .map_err(|err| format!("signing failed: {err}"))?,
        );
    }
    let signature = signatures.join(" ");
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in [
        (standardwebhooks::HEADER_WEBHOOK_ID, id),
        (
            standardwebhooks::HEADER_WEBHOOK_TIMESTAMP,
            timestamp.to_string(),
        ),
        (standardwebhooks::HEADER_WEBHOOK_SIGNATURE, signature),
    ] {
        let value =
            HeaderValue::from_str(&value).map_err(|err| format!("bad {name} header: {err}"))?;
        headers.insert(name, value);
    }
    if let Some(key) = webhook.ordering_key {
        let value = HeaderValue::from_str(&lines::header_value(key))
            .map_err(|err| format!("bad {} header: {err}", lines::ORDERING_KEY_HEADER))?;
        headers.insert(lines::ORDERING_KEY_HEADER, value);
    }
    if let Some(trace) = webhook.trace {
        let values = [
            (TRACEPARENT_HEADER, Some(&trace.traceparent)),
            (TRACESTATE_HEADER, trace.tracestate.as_ref()),
        ];
        for (name, value) in values {
            if let Some(value) = value {
                let value = HeaderValue::from_str(value)
                    .map_err(|err| format!("bad {name} header: {err}"))?;
                headers.insert(name, value);
            }
        }
    }
    Ok(headers)
}

/// Describes a transport error without the URL (which may carry tokens in its query).
fn classify(err: reqwest::Error) -> (OutcomeKind, String) {
    let err = err.without_url();
    let chain = crate::error::error_chain(&err);
    if chain.contains("destination refused") {
        let detail = chain
            .split("destination refused")
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        return (
            OutcomeKind::RefusedDestination,
            format!("destination refused{detail}"),
        );
    }
    if err.is_timeout() {
        (OutcomeKind::Timeout, format!("timed out: {chain}"))
    } else if err.is_connect() {
        (
            OutcomeKind::Connection,
            format!("connection failed: {chain}"),
        )
    } else {
        (OutcomeKind::Connection, format!("request failed: {chain}"))
    }
}

/// Resolves names with the system resolver and drops every address Courier may not
/// contact; a name with none left fails to resolve, so no connection is ever opened.
struct GuardedResolver {
    allow_private: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed = screen_resolved(&host, resolved, allow_private)?;
            let addrs: Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

/// The addresses of `host` Courier may connect to; an error naming the first refused one
/// when none is left.
fn screen_resolved(
    host: &str,
    resolved: Vec<SocketAddr>,
    allow_private: bool,
) -> Result<Vec<SocketAddr>, String> {
    if allow_private {
        return Ok(resolved);
    }
    let first = resolved.first().copied();
    let allowed: Vec<SocketAddr> = resolved
        .into_iter()
        .filter(|addr| destination::is_public(addr.ip()))
        .collect();
    if !allowed.is_empty() {
        return Ok(allowed);
    }
    Err(match first {
        Some(addr) => {
            let ip = addr.ip();
            let block = destination::non_public(ip)
                .map(|block| format!(", it is in {block}"))
                .unwrap_or_default();
            format!(
                "destination refused: {host} resolves to {ip}, not a public address{block} \
                 (set COURIER_ALLOW_PRIVATE_DESTINATIONS=true to allow it)"
            )
        }
        None => format!("destination refused: {host} resolves to no address"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_non_public_range_is_refused_at_connect_time() {
        use crate::destination::tests::{literal_url, NON_PUBLIC_SAMPLES};
        let timeout = Duration::from_secs(1);
        let strict = Dispatcher::new(timeout, false).unwrap();
        let permissive = Dispatcher::new(timeout, true).unwrap();
        for (range, samples) in NON_PUBLIC_SAMPLES {
            for addr in *samples {
                // A literal address in the URL never reaches the resolver.
                let url = literal_url(addr);
                let refusal = strict.refuse_literal_address(&url).unwrap_or_default();
                assert!(
                    refusal.starts_with("destination refused"),
                    "{range}: {url} -> {refusal:?}"
                );
                assert_eq!(permissive.refuse_literal_address(&url), None, "{url}");
                // A name that resolves to it.
                let resolved = vec![SocketAddr::new(addr.parse().unwrap(), 443)];
                let refusal =
                    screen_resolved("hooks.example.com", resolved.clone(), false).expect_err(addr);
                assert!(
                    refusal.starts_with("destination refused: hooks.example.com resolves to"),
                    "{range}: {refusal}"
                );
                assert_eq!(
                    screen_resolved("hooks.example.com", resolved.clone(), true),
                    Ok(resolved)
                );
            }
        }
    }

    #[test]
    fn a_name_keeps_only_its_public_addresses() {
        let public: SocketAddr = "[2606:4700:4700::1111]:443".parse().unwrap();
        let resolved = vec![
            "[2002:7f00:1::]:443".parse().unwrap(),
            public,
            "100.64.0.1:443".parse().unwrap(),
        ];
        assert_eq!(
            screen_resolved("mixed.example.com", resolved, false),
            Ok(vec![public])
        );
        let refusal = screen_resolved("nothing.example.com", Vec::new(), false).unwrap_err();
        assert!(refusal.starts_with("destination refused"), "{refusal}");
    }

    #[test]
    fn refusals_name_the_block() {
        let strict = Dispatcher::new(Duration::from_secs(1), false).unwrap();
        let refusal = strict
            .refuse_literal_address("http://[2002:7f00:1::]/hook")
            .unwrap_or_default();
        assert!(refusal.contains("6to4 (2002::/16)"), "{refusal}");
        let refusal = screen_resolved(
            "cgnat.example.com",
            vec!["100.64.0.1:80".parse().unwrap()],
            false,
        )
        .unwrap_err();
        assert!(
            refusal.contains("Shared Address Space (100.64.0.0/10)"),
            "{refusal}"
        );
    }

    #[test]
    fn signatures_verify_with_the_official_library() {
        let secret = crate::crypto::signing::mint_secret();
        let webhook = Webhook {
            id: Uuid::now_v7(),
            endpoint_id: Uuid::now_v7(),
            url: "https://example.com",
            secret: &secret,
            previous_secret: None,
            body: br#"{"a":1}"#,
            ordering_key: None,
            trace: None,
        };
        let headers = signed_headers(&webhook).unwrap();
        let verifier = standardwebhooks::Webhook::new(&secret).unwrap();
        assert!(verifier.verify(webhook.body, &headers).is_ok());
        assert!(verifier.verify(br#"{"a":2}"#, &headers).is_err());
    }

    #[test]
    fn during_a_rotation_both_secrets_sign() {
        let (new, old) = (
            crate::crypto::signing::mint_secret(),
            crate::crypto::signing::mint_secret(),
        );
        let webhook = Webhook {
            id: Uuid::now_v7(),
            endpoint_id: Uuid::now_v7(),
            url: "https://example.com",
            secret: &new,
            previous_secret: Some(&old),
            body: br#"{"a":1}"#,
            ordering_key: None,
            trace: None,
        };
        let headers = signed_headers(&webhook).unwrap();
        let signature = headers[standardwebhooks::HEADER_WEBHOOK_SIGNATURE]
            .to_str()
            .unwrap();
        let parts: Vec<&str> = signature.split(' ').collect();
        assert_eq!(parts.len(), 2, "{signature}");
        assert!(parts.iter().all(|part| part.starts_with("v1,")));
        for secret in [&new, &old] {
            let verifier = standardwebhooks::Webhook::new(secret).unwrap();
            assert!(verifier.verify(webhook.body, &headers).is_ok());
        }
        let stranger =
            standardwebhooks::Webhook::new(&crate::crypto::signing::mint_secret()).unwrap();
        assert!(stranger.verify(webhook.body, &headers).is_err());
    }
}
