//! Serving HTTP connections with limits a hostile or careless client cannot outstay: at most
//! `COURIER_MAX_CONNECTIONS` at once (WebSockets included; one more is answered 503 and
//! closed), a request's header must arrive within `COURIER_HEADER_TIMEOUT_MS` of its first
//! byte (and its body may pause no longer), and a kept-alive connection with no request for
//! `COURIER_IDLE_TIMEOUT_MS` is closed. On shutdown every connection finishes the request it is serving.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tower_http::timeout::TimeoutBody;

use crate::metrics::Metrics;

/// The limits every connection is served under.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections open at once, WebSockets included.
    pub max_connections: usize,
    /// From a request's first byte to the end of its header.
    pub header_timeout: Duration,
    /// A kept-alive connection with no request in flight, and no byte of a new one.
    pub idle_timeout: Duration,
    /// How long shutdown waits for connections to finish their requests.
    pub shutdown_grace: Duration,
    /// Whether the refusal of a connection over the limit is readable by a page of any
    /// origin (`COURIER_CORS_ORIGINS=*`): it says nothing but "retry".
    pub refusal_shared: bool,
}

/// Refusals being written at once; a connection past even these is closed unanswered.
const MAX_REFUSING: usize = 64;

/// How long a refusal may take: reading the request's header, answering, and reading what
/// else the client sends before closing, so the 503 is read rather than lost to a reset.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// The most of a refused request's header that is read before answering.
const REFUSAL_READ_LIMIT: usize = 16 * 1024;

/// The body a connection over the limit is answered with.
const REFUSAL_BODY: &str = "{\"errors\":[{\"message\":\"too many connections; retry\",\"extensions\":{\"code\":\"SERVICE_UNAVAILABLE\"}}]}";

/// What a connection over the limit is told, in full: HTTP/1.1 with `Retry-After` and, as
/// every answer, a `Date` by Courier's clock; readable by a page of any origin when `shared`.
fn refusal(shared: bool) -> String {
    let cors = if shared {
        "access-control-allow-origin: *\r\naccess-control-expose-headers: retry-after\r\n"
    } else {
        ""
    };
    let date = super::date::now_header()
        .and_then(|date| date.to_str().ok().map(|date| format!("date: {date}\r\n")))
        .unwrap_or_default();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\n\
         content-type: application/json; charset=utf-8\r\n\
         {date}\
         retry-after: 1\r\n\
         {cors}\
         connection: close\r\n\
         content-length: {}\r\n\
         \r\n\
         {REFUSAL_BODY}",
        REFUSAL_BODY.len()
    )
}

/// Serves `router` on `listener` under `limits` until `shutdown` fires, then waits (at most
/// the grace period) for open connections to finish what they are serving.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of file descriptors, most likely: wait rather than spin.
                tracing::warn!(error = %err, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let open = Open::new(permit, metrics.clone());
                connections.spawn(serve_connection(
                    stream,
                    open,
                    router.clone(),
                    limits,
                    shutdown.clone(),
                ));
            }
            Err(_) => {
                metrics.connections_refused.inc();
                if let Ok(slot) = refusing.clone().try_acquire_owned() {
                    tokio::spawn(refuse(stream, slot, limits.refusal_shared));
                }
            }
        }
    }
    drop(listener);
    let finished = tokio::time::timeout(limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            unfinished = connections.len(),
            "connections still open after the grace period are closed"
        );
        connections.abort_all();
    }
    Ok(())
}

/// An open connection: its place under the cap, and its count in the open-connections
/// gauge, both given back when the stream is dropped (after a WebSocket upgrade too).
struct Open {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Open {
    fn new(permit: OwnedSemaphorePermit, metrics: Arc<Metrics>) -> Self {
        metrics.connections_open.inc();
        Open {
            _permit: permit,
            metrics,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.connections_open.dec();
    }
}

/// At start-up, raises the process's soft limit on open files to its hard limit (each
/// connection is one, and the usual soft default of 1,024 would refuse connections long
/// before `COURIER_MAX_CONNECTIONS`), then warns when `max_connections`, with the process's
/// other descriptors (`others`: the worker's webhook connections and the database pool),
/// could still need more open files than the process may have.
pub fn raise_file_limit(max_connections: u64, others: u64) {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(open_file_limit = limit, "open file limit"),
        Err(err) => tracing::debug!(error = %err, "the open file limit could not be raised"),
    }
    let Some(limit) = open_file_limit() else {
        return;
    };
    // Listeners, log files and the like.
    const SPARE: u64 = 64;
    if max_connections.saturating_add(others).saturating_add(SPARE) > limit {
        tracing::warn!(
            max_connections,
            open_file_limit = limit,
            "COURIER_MAX_CONNECTIONS, with the worker's connections and the database pool, may \
             need more open files than this process may have: raise its hard limit (ulimit -Hn, \
             LimitNOFILE=) or lower COURIER_MAX_CONNECTIONS"
        );
    }
}

/// The soft limit on open files, from `/proc/self/limits` (Linux; elsewhere unknown).
fn open_file_limit() -> Option<u64> {
    soft_file_limit(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

/// The soft open-file limit in the text of `/proc/self/limits` (`None` when unlimited).
fn soft_file_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Tells a connection over the limit so, then closes it.
async fn refuse(mut stream: TcpStream, _slot: OwnedSemaphorePermit, shared: bool) {
    let told = async {
        // Answer once the request's header is in (an HTTP client reads nothing sent
        // before its request), or once the client has sent all it will.
        let mut head = Vec::new();
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < REFUSAL_READ_LIMIT {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&chunk[..n]);
        }
        stream.write_all(refusal(shared).as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client still sends, so closing does not reset the connection
        // before it has read the answer.
        while stream.read(&mut chunk).await? > 0 {}
        Ok::<_, io::Error>(())
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, told).await;
}

/// Serves one connection until it ends, the watchdog finds it idle or stuck in a header,
/// or shutdown has let it finish its request.
async fn serve_connection(
    stream: TcpStream,
    open: Open,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        stream,
        activity: activity.clone(),
        _open: open,
    });
    let counted = activity.clone();
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let router = router.clone();
            // A body that stops arriving for the header timeout ends the request (and, left
            // unread, the connection), so a stalled upload holds nothing for long either.
            let request = request
                .map(|body| axum::body::Body::new(TimeoutBody::new(limits.header_timeout, body)));
            let (request, in_flight) = counted.begin(request);
            async move {
                let response = router.oneshot(request).await;
                drop(in_flight);
                response
            }
        });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The watchdog times headers (from their first byte, not from when the connection was
    // ready for one) and idleness; hyper's own header timer is off.
    builder.header_read_timeout(None);
    let connection = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(connection);
    let watchdog = activity.watch(limits);
    tokio::pin!(watchdog);
    let mut shutting_down = false;
    loop {
        tokio::select! {
            result = &mut connection => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "HTTP connection ended with an error");
                }
                break;
            }
            reason = &mut watchdog => {
                tracing::debug!(reason, "closing an HTTP connection");
                break;
            }
            () = shutdown.cancelled(), if !shutting_down => {
                connection.as_mut().graceful_shutdown();
                shutting_down = true;
            }
        }
    }
}

/// When a connection last did something, and what it is doing, on the process's
/// monotonic clock in milliseconds since the connection opened.
#[derive(Debug)]
struct Activity {
    opened: Instant,
    /// Requests being served (their response not yet produced).
    in_flight: AtomicUsize,
    /// The last byte read or written.
    last_ms: AtomicU64,
    /// The first byte of a request header not yet complete, plus one (0: none).
    head_started_ms: AtomicU64,
    /// Tells the watchdog a header has started, which brings its deadline nearer.
    head_started: Notify,
}

/// A request counted in flight while this lives.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}

impl Activity {
    fn new() -> Self {
        Activity {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            head_started_ms: AtomicU64::new(0),
            head_started: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::SeqCst);
    }

    /// Bytes arrived: the start of a header if no request is being served.
    fn read_some(&self) {
        let now = self.now_ms();
        self.last_ms.store(now, Ordering::SeqCst);
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            let started = self.head_started_ms.compare_exchange(
                0,
                now + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            if started.is_ok() {
                self.head_started.notify_one();
            }
        }
    }

    /// A request's header is complete: it is served, and counted until its response.
    fn begin<T>(self: &Arc<Self>, request: T) -> (T, InFlight) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.head_started_ms.store(0, Ordering::SeqCst);
        self.touch();
        (request, InFlight(self.clone()))
    }

    /// Resolves, with the reason, once the connection has sat in a header or idle too long.
    async fn watch(&self, limits: ConnectionLimits) -> &'static str {
        let header = u64::try_from(limits.header_timeout.as_millis()).unwrap_or(u64::MAX);
        let idle = u64::try_from(limits.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        loop {
            let now = self.now_ms();
            let (deadline, reason) = if self.in_flight.load(Ordering::SeqCst) > 0 {
                (now.saturating_add(idle), "")
            } else {
                match self.head_started_ms.load(Ordering::SeqCst) {
                    0 => (
                        self.last_ms.load(Ordering::SeqCst).saturating_add(idle),
                        "idle too long",
                    ),
                    started => (
                        (started - 1).saturating_add(header),
                        "request header not received in time",
                    ),
                }
            };
            if now >= deadline && !reason.is_empty() {
                return reason;
            }
            let wait = deadline.saturating_sub(now).max(1);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(wait)) => {}
                () = self.head_started.notified() => {}
            }
        }
    }
}

/// The TCP stream, noting its activity, and holding the connection's place for as long as
/// the stream lives (through a WebSocket upgrade too).
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
    _open: Open,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read_some();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_file_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             unlimited            unlimited            processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(soft_file_limit(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_file_limit(unlimited), None);
        assert_eq!(soft_file_limit(""), None);
    }
}
