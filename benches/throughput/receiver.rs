//! A fast local webhook receiver: answers 204 at once and notes when each `webhook-id` arrived.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use tokio::sync::Notify;

/// Arrival times by `webhook-id`, and a signal for whoever waits for one (so a waiting
/// bench sleeps until an arrival rather than polling beside the measured process).
#[derive(Clone, Default)]
pub struct Arrivals(Arc<Mutex<HashMap<String, Instant>>>, Arc<Notify>);

impl Arrivals {
    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The `webhook-id` of every arrival so far.
    pub fn ids(&self) -> Vec<String> {
        self.0.lock().unwrap().keys().cloned().collect()
    }

    /// Every arrival time so far.
    pub fn times(&self) -> Vec<Instant> {
        self.0.lock().unwrap().values().copied().collect()
    }

    pub fn at(&self, webhook_id: &str) -> Option<Instant> {
        self.0.lock().unwrap().get(webhook_id).copied()
    }

    /// Waits for `webhook_id` to arrive (panics after `limit` from `since`) and returns
    /// when it did.
    pub async fn wait_for(&self, webhook_id: &str, since: Instant, limit: Duration) -> Instant {
        loop {
            // Listening before looking, so an arrival in between is not missed.
            let arrived = self.1.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if let Some(at) = self.at(webhook_id) {
                return at;
            }
            let left = limit.saturating_sub(since.elapsed());
            assert!(!left.is_zero(), "delivery {webhook_id} never arrived");
            let _ = tokio::time::timeout(left, arrived).await;
        }
    }
}

/// Starts the receiver; returns its URL and the arrivals it records.
pub async fn start() -> (String, Arrivals) {
    let arrivals = Arrivals::default();
    let router = Router::new()
        .route("/hook", post(receive))
        .with_state(arrivals.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (format!("http://{addr}/hook"), arrivals)
}

async fn receive(State(arrivals): State<Arrivals>, headers: HeaderMap) -> StatusCode {
    let now = Instant::now();
    if let Some(id) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) {
        arrivals
            .0
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_insert(now);
        arrivals.1.notify_waiters();
    }
    StatusCode::NO_CONTENT
}
