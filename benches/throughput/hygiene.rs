//! Connection hygiene as a careless crowd of clients would test it: many connections that
//! each send half a request header and stop, against one default `courier serve`. Reports
//! how many the server had closed, and when, and whether a normal request was still served
//! meanwhile.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::process::{Scratch, Server};

/// What became of the half-sent requests.
pub struct HalfHeaders {
    pub connections: usize,
    /// Connections the server closed within the wait.
    pub closed: usize,
    /// When the last of those was closed, from when the last was opened.
    pub last_closed_after: Duration,
    /// Whether a health check on a new connection was answered 200 while they were open.
    pub served_meanwhile: bool,
}

/// Opens `connections` connections that each send half a header, then waits up to `wait`
/// for the server to close them.
pub async fn half_headers(server_url: &str, connections: usize, wait: Duration) -> HalfHeaders {
    let scratch = Scratch::create(server_url, "hygiene").await;
    let server = Server::start(&scratch.url, &[("COURIER_WORKER_CONCURRENCY", "0".into())]);
    let addr = server.base_url.trim_start_matches("http://").to_owned();
    let mut streams = Vec::with_capacity(connections);
    for _ in 0..connections {
        let mut stream = TcpStream::connect(&addr).await.expect("connect");
        stream
            .write_all(b"POST /graphql HTTP/1.1\r\nhost: courier\r\ncontent-ty")
            .await
            .expect("send half a header");
        streams.push(stream);
    }
    let opened = Instant::now();
    let served_meanwhile = health(&addr).await;
    let closings = streams.into_iter().map(|mut stream| async move {
        let mut sink = [0u8; 256];
        let read = tokio::time::timeout(wait, stream.read(&mut sink)).await;
        matches!(read, Ok(Ok(0)) | Ok(Err(_))).then(|| opened.elapsed())
    });
    let closed: Vec<Duration> = futures_util::future::join_all(closings)
        .await
        .into_iter()
        .flatten()
        .collect();
    server.stop();
    scratch.drop_now().await;
    HalfHeaders {
        connections,
        closed: closed.len(),
        last_closed_after: closed.into_iter().max().unwrap_or_default(),
        served_meanwhile,
    }
}

/// Whether a health check on a fresh connection is answered 200.
async fn health(addr: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return false;
    };
    if stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: courier\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut answer = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer)).await;
    matches!(read, Ok(Ok(n)) if answer[..n].starts_with(b"HTTP/1.1 200"))
}
