//! A fast local webhook receiver: answers 204 at once and notes when each `webhook-id` arrived.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;

#[derive(Clone, Default)]
pub struct Arrivals(Arc<Mutex<HashMap<String, Instant>>>);

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
            if let Some(at) = self.at(webhook_id) {
                return at;
            }
            assert!(
                since.elapsed() < limit,
                "delivery {webhook_id} never arrived"
            );
            tokio::time::sleep(Duration::from_micros(100)).await;
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
    }
    StatusCode::NO_CONTENT
}
