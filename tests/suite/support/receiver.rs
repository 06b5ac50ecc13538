//! An in-process webhook receiver on port 0 that verifies every request with the official
//! Standard Webhooks library and answers as each test scripts it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How the receiver answers the `n`th request (from 1) for one `webhook-id`, given its
/// parsed body.
pub type Script = Arc<dyn Fn(&serde_json::Value, usize) -> Reply + Send + Sync>;

/// One scripted answer.
#[derive(Clone, Debug)]
pub struct Reply {
    /// Status to answer with.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// What the body is.
    pub body: ReplyBody,
}

/// The body of a scripted answer.
#[derive(Clone, Debug, Default)]
pub enum ReplyBody {
    /// None.
    #[default]
    Empty,
    /// These bytes.
    Bytes(Vec<u8>),
    /// 64 KiB chunks of `x`, as fast as they are read, for ever.
    Endless,
}

impl Reply {
    /// A plain status.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            delay: Duration::ZERO,
            body: ReplyBody::Empty,
        }
    }
}

/// A receiver's script: 200 after `delay`, to every request.
pub fn answering_after(delay: Duration) -> impl Fn(usize) -> Reply + Send + Sync + 'static {
    move |_| Reply {
        delay,
        ..Reply::status(200)
    }
}

/// A receiver's script: 200, to the first attempt of each webhook after `delay`, to the
/// rest at once.
pub fn slow_first_attempt(delay: Duration) -> impl Fn(usize) -> Reply + Send + Sync + 'static {
    move |attempt| Reply {
        delay: if attempt == 1 { delay } else { Duration::ZERO },
        ..Reply::status(200)
    }
}

/// One request as received.
#[derive(Clone, Debug)]
pub struct Received {
    /// The path it was sent to (which endpoint).
    pub path: String,
    /// `webhook-id`.
    pub webhook_id: String,
    /// The parsed body.
    pub body: serde_json::Value,
    /// The body exactly as sent.
    pub raw_body: String,
    /// Whether the official verifier accepted it with the path's secret.
    pub verified: bool,
    /// `content-type`.
    pub content_type: String,
    /// `webhook-timestamp`, as sent.
    pub timestamp: String,
    /// `webhook-timestamp`: the sender's clock, in Unix seconds.
    pub timestamp_secs: i64,
    /// When it arrived (this process's monotonic clock).
    pub at: std::time::Instant,
    /// `webhook-signature`: one or more space-separated `v1,<base64>`.
    pub signature: String,
    /// `webhook-ordering-key`, if sent.
    pub ordering_key: Option<String>,
    /// `traceparent`, if sent.
    pub traceparent: Option<String>,
    /// `tracestate`, if sent.
    pub tracestate: Option<String>,
}

impl Received {
    /// Whether the official Standard Webhooks verifier accepts this request with `secret`.
    pub fn verifies_with(&self, secret: &str) -> bool {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("webhook-id", &self.webhook_id),
            ("webhook-timestamp", &self.timestamp),
            ("webhook-signature", &self.signature),
        ] {
            headers.insert(name, value.parse().expect("a header value"));
        }
        standardwebhooks::Webhook::new(secret)
            .is_ok_and(|verifier| verifier.verify(self.raw_body.as_bytes(), &headers).is_ok())
    }
}

#[derive(Default)]
struct Shared {
    secrets: Mutex<HashMap<String, String>>,
    received: Mutex<Vec<Received>>,
    arrived: Notify,
    /// Per path (and per path and ordering key, as `path#key`): requests being answered
    /// now, and the most there ever were at once.
    in_flight: Mutex<HashMap<String, (usize, usize)>>,
}

/// Counts a request in flight to its path until dropped.
struct InFlight {
    shared: Arc<Shared>,
    path: String,
}

impl InFlight {
    fn start(shared: &Arc<Shared>, path: &str) -> InFlight {
        let mut flights = shared.in_flight.lock().expect("lock");
        let (now, most) = flights.entry(path.to_owned()).or_default();
        *now += 1;
        *most = (*most).max(*now);
        InFlight {
            shared: shared.clone(),
            path: path.to_owned(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut flights = self.shared.in_flight.lock().expect("lock");
        if let Some((now, _)) = flights.get_mut(&self.path) {
            *now -= 1;
        }
    }
}

/// A running receiver.
pub struct Receiver {
    base_url: String,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
}

impl Receiver {
    /// Starts a receiver that answers by `script`.
    pub async fn start(script: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Receiver {
        Self::start_by_body(move |_, nth| script(nth)).await
    }

    /// Starts a receiver that answers by `script`, which sees each request's body.
    pub async fn start_by_body(
        script: impl Fn(&serde_json::Value, usize) -> Reply + Send + Sync + 'static,
    ) -> Receiver {
        let shared = Arc::new(Shared::default());
        let script: Script = Arc::new(script);
        let router = Router::new()
            .route("/{path}", post(receive))
            .with_state((shared.clone(), script));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
        });
        Receiver {
            base_url: format!("http://{addr}"),
            shared,
            shutdown,
        }
    }

    /// A receiver that answers `healthy` while the flag it returns is set, and `down`
    /// (a status) until then: a receiver that is out, then recovers.
    pub async fn switchable(
        down: u16,
        healthy: impl Fn() -> Reply + Send + Sync + 'static,
    ) -> (Receiver, Arc<std::sync::atomic::AtomicBool>) {
        use std::sync::atomic::{AtomicBool, Ordering};
        let up = Arc::new(AtomicBool::new(false));
        let flag = up.clone();
        let receiver = Self::start(move |_| {
            if flag.load(Ordering::SeqCst) {
                healthy()
            } else {
                Reply::status(down)
            }
        })
        .await;
        (receiver, up)
    }

    /// A receiver that accepts everything.
    pub async fn accepting() -> Receiver {
        Self::start(|_| Reply::status(200)).await
    }

    /// The URL of one endpoint on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base_url)
    }

    /// The secret to verify requests to `path` with.
    pub fn set_secret(&self, path: &str, secret: &str) {
        self.shared
            .secrets
            .lock()
            .expect("lock")
            .insert(path.to_owned(), secret.to_owned());
    }

    /// The most requests to `path` with ordering key `key` that were being answered at once.
    pub fn most_in_flight_of_line(&self, path: &str, key: &str) -> usize {
        self.most_in_flight(&format!("{path}#{key}"))
    }

    /// Requests to `path` being answered now.
    pub fn in_flight(&self, path: &str) -> usize {
        let flights = self.shared.in_flight.lock().expect("lock");
        flights.get(path).map_or(0, |(now, _)| *now)
    }

    /// The most requests to `path` that were being answered at once.
    pub fn most_in_flight(&self, path: &str) -> usize {
        let flights = self.shared.in_flight.lock().expect("lock");
        flights.get(path).map_or(0, |(_, most)| *most)
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().expect("lock").clone()
    }

    /// Waits until at least `count` requests arrived, or panics after `timeout`.
    pub async fn wait_for(&self, count: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let arrived = self.shared.arrived.notified();
            let received = self.received();
            if received.len() >= count {
                return received;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                panic!("expected {count} webhooks, received {}", received.len());
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(200)), arrived).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn receive(
    State((shared, script)): State<(Arc<Shared>, Script)>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let webhook_id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let secret = shared.secrets.lock().expect("lock").get(&path).cloned();
    let verified = secret
        .and_then(|secret| standardwebhooks::Webhook::new(&secret).ok())
        .is_some_and(|verifier| verifier.verify(&body, &headers).is_ok());
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let ordering_key = headers
        .get("webhook-ordering-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let _in_flight = InFlight::start(&shared, &path);
    let _line_in_flight = ordering_key
        .as_ref()
        .map(|key| InFlight::start(&shared, &format!("{path}#{key}")));
    let parsed: serde_json::Value =
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    let nth = {
        let mut received = shared.received.lock().expect("lock");
        received.push(Received {
            path,
            webhook_id: webhook_id.clone(),
            body: parsed.clone(),
            raw_body: String::from_utf8_lossy(&body).into_owned(),
            verified,
            content_type: headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            timestamp: header("webhook-timestamp"),
            signature: header("webhook-signature"),
            ordering_key,
            traceparent: headers
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            tracestate: headers
                .get("tracestate")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            at: std::time::Instant::now(),
            timestamp_secs: headers
                .get("webhook-timestamp")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or_default(),
        });
        received
            .iter()
            .filter(|r| r.webhook_id == webhook_id)
            .count()
    };
    shared.arrived.notify_waiters();
    let reply = script(&parsed, nth);
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    let mut response = match reply.body {
        ReplyBody::Empty => status.into_response(),
        ReplyBody::Bytes(bytes) => (status, bytes).into_response(),
        ReplyBody::Endless => {
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let chunks = futures_util::stream::repeat_with(move || {
                Ok::<_, std::convert::Infallible>(chunk.clone())
            });
            (status, axum::body::Body::from_stream(chunks)).into_response()
        }
    };
    for (name, value) in reply.headers {
        if let Ok(value) = value.parse() {
            response.headers_mut().insert(name, value);
        }
    }
    response
}
