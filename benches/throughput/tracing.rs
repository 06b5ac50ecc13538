//! What tracing costs, and what a dead collector adds to it: submit throughput and
//! submit-to-arrival latency with tracing off (the default), exporting to a collector that
//! answers at once, and exporting to one that accepts connections and never answers, each
//! in a fresh database.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::process::{admin_token, Scratch};
use crate::workloads::{latency_in, submit_throughput_in, Latency, Throughput};

/// One run's figures.
pub struct Traced {
    pub submit: Throughput,
    pub latency: Latency,
}

/// Submit throughput and latency with `settings`, in a scratch database of their own.
pub async fn measure(
    server_url: &str,
    connections: usize,
    duration: Duration,
    samples: usize,
    settings: &[(&str, String)],
) -> Traced {
    let scratch = Scratch::create(server_url, "tracing").await;
    let token = admin_token(&scratch.url);
    let submit = submit_throughput_in(&scratch.url, &token, connections, duration, settings).await;
    let latency = latency_in(&scratch.url, &token, samples, settings).await;
    scratch.drop_now().await;
    Traced { submit, latency }
}

/// A collector that accepts every connection and never answers; returns its base URL.
pub async fn dead_collector(stop: CancellationToken) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((socket, _)) => held.push(socket),
                    Err(_) => break,
                },
            }
        }
    });
    format!("http://{addr}")
}

/// A collector that takes every export and answers 200 at once; returns its base URL and
/// how many bytes it was sent.
pub async fn live_collector(stop: CancellationToken) -> (String, Arc<AtomicU64>) {
    let received = Arc::new(AtomicU64::new(0));
    let counted = received.clone();
    let router = Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(body.len() as u64, Ordering::Relaxed);
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    });
    (format!("http://{addr}"), received)
}
