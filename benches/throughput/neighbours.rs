//! Fair share as users meet it: endpoint A's receiver is slow (answers after a second) or
//! hangs past the request timeout, with a backlog of thousands built through the API; one
//! default `courier serve` drains it; meanwhile endpoint B, whose receiver is fast, gets
//! submissions 100 ms apart. Measured: B's submit-to-arrival, and how many requests A's
//! receiver was ever made to hold at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;

use crate::drain::fill;
use crate::process::{admin_token, Scratch, Server};
use crate::receiver;
use crate::workloads::{create_endpoint, percentile, submit_one};

/// A's backlog.
const BACKLOG: usize = 3_000;
/// B's submissions.
const SAMPLES: usize = 30;

pub struct Neighbours {
    pub backlog: usize,
    pub samples: usize,
    pub p50_ms: f64,
    pub max_ms: f64,
    pub most_in_flight: usize,
}

#[derive(Default)]
struct Held {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// A receiver that holds every request for `hold`, counting how many it holds at once.
async fn slow_receiver(hold: Duration) -> (String, Arc<Held>) {
    let held = Arc::new(Held::default());
    let router = Router::new()
        .route("/slow", post(hold_request))
        .with_state((held.clone(), hold));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (format!("http://{addr}/slow"), held)
}

async fn hold_request(State((held, hold)): State<(Arc<Held>, Duration)>) -> StatusCode {
    let now = held.now.fetch_add(1, Ordering::SeqCst) + 1;
    held.most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(hold).await;
    held.now.fetch_sub(1, Ordering::SeqCst);
    StatusCode::NO_CONTENT
}

/// Runs the scenario with A slow (`hang` false: a 1 s answer) or hanging (60 s, past the
/// default 10 s request timeout).
pub async fn slow_neighbour(server_url: &str, hang: bool) -> Neighbours {
    let scratch = Scratch::create(server_url, "neighbours").await;
    let token = admin_token(&scratch.url);
    let hold = if hang {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(1)
    };
    let (slow_url, held) = slow_receiver(hold).await;
    let (fast_url, arrivals) = receiver::start().await;
    fill(&scratch.url, &token, &slow_url, BACKLOG, 32, 1).await;

    let server = Server::start(
        &scratch.url,
        &[("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into())],
    );
    let client = reqwest::Client::new();
    let fast = create_endpoint(&client, &server, &token, &fast_url).await;
    // A's receiver is busy before B's first submission.
    let started = Instant::now();
    while held.now.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "A is never served"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut waited = Vec::with_capacity(SAMPLES);
    for n in 0..SAMPLES {
        let sent = Instant::now();
        let id = submit_one(&client, &server, &token, &fast, n).await;
        let arrived = arrivals.wait_for(&id, sent, Duration::from_secs(120)).await;
        waited.push(arrived.saturating_duration_since(sent).as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.kill();
    scratch.drop_now().await;
    waited.sort_by(f64::total_cmp);
    Neighbours {
        backlog: BACKLOG,
        samples: SAMPLES,
        p50_ms: percentile(&waited, 0.5),
        max_ms: percentile(&waited, 1.0),
        most_in_flight: held.most.load(Ordering::SeqCst),
    }
}
