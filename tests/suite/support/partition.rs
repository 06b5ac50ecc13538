//! A TCP proxy between an app and PostgreSQL that can cut the network without closing it:
//! partitioned, every socket stays open but no byte moves either way, as when packets are
//! lost; healed, what was held back flows on, as TCP would retransmit it. It can also lose
//! the answer to one statement: the statement reaches the server and completes there, then
//! its connection drops before the client hears back.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Which connections may move bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Gate {
    partitioned: bool,
    /// Connections numbered below this never move another byte (their peer is gone for good).
    stranded_below: u64,
}

impl Gate {
    fn open_for(&self, connection: u64) -> bool {
        !self.partitioned && connection >= self.stranded_below
    }
}

/// The statement whose answer is to be lost, and how many answers were.
#[derive(Default)]
struct LostAnswers {
    /// Bytes that mark the statement (e.g. a value bound to it); taken when seen.
    armed: Mutex<Option<Vec<u8>>>,
    lost: AtomicUsize,
}

/// A running proxy on `127.0.0.1`, port 0.
pub struct PartitionProxy {
    addr: SocketAddr,
    gate: watch::Sender<Gate>,
    accepted: Arc<AtomicU64>,
    lost_answers: Arc<LostAnswers>,
    shutdown: CancellationToken,
}

impl PartitionProxy {
    /// Starts a proxy to the server of `database_url`.
    pub async fn start(database_url: &str) -> PartitionProxy {
        let url = url::Url::parse(database_url).expect("a database URL");
        let host = url.host_str().expect("a host").to_owned();
        let port = url.port().unwrap_or(5432);
        let upstream = tokio::net::lookup_host((host.as_str(), port))
            .await
            .expect("resolve the database host")
            .next()
            .expect("an address for the database host");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let (gate, _) = watch::channel(Gate::default());
        let accepted = Arc::new(AtomicU64::new(0));
        let lost_answers = Arc::new(LostAnswers::default());
        let shutdown = CancellationToken::new();
        let (gates, counter, stop) = (gate.clone(), accepted.clone(), shutdown.clone());
        let losing = lost_answers.clone();
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    () = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => client,
                        Err(_) => continue,
                    },
                };
                let id = counter.fetch_add(1, Ordering::SeqCst);
                let (gate, stop, losing) = (gates.subscribe(), stop.clone(), losing.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = relay(client, upstream, id, gate, losing) => {}
                    }
                });
            }
        });
        PartitionProxy {
            addr,
            gate,
            accepted,
            lost_answers,
            shutdown,
        }
    }

    /// Loses the answer to the next statement whose bytes contain `marker`: the statement
    /// runs (and commits) on the server, then the client's connection is closed before
    /// any of the server's answer reaches it. Only connections without TLS can be read
    /// ([`PartitionProxy::plain_url_for`]).
    pub fn lose_answer_to(&self, marker: &str) {
        *self.lost_answers.armed.lock().expect("lock") = Some(marker.as_bytes().to_vec());
    }

    /// How many answers were lost so far.
    pub fn answers_lost(&self) -> usize {
        self.lost_answers.lost.load(Ordering::SeqCst)
    }

    /// `database_url` with its host and port replaced by this proxy's.
    pub fn url_for(&self, database_url: &str) -> String {
        let mut url = url::Url::parse(database_url).expect("a database URL");
        url.set_host(Some(&self.addr.ip().to_string()))
            .expect("set the host");
        url.set_port(Some(self.addr.port())).expect("set the port");
        url.to_string()
    }

    /// [`PartitionProxy::url_for`] without TLS, so the proxy can read what passes (see
    /// [`PartitionProxy::lose_answer_to`]).
    pub fn plain_url_for(&self, database_url: &str) -> String {
        let mut url = url::Url::parse(&self.url_for(database_url)).expect("a database URL");
        let kept: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(name, _)| name != "sslmode")
            .map(|(name, value)| (name.into_owned(), value.into_owned()))
            .collect();
        url.query_pairs_mut()
            .clear()
            .extend_pairs(kept)
            .append_pair("sslmode", "disable");
        url.to_string()
    }

    /// Stops every byte in both directions, on open connections and new ones alike.
    pub fn partition(&self) {
        self.gate.send_modify(|gate| gate.partitioned = true);
    }

    /// Lets bytes flow again, including what was held back.
    pub fn heal(&self) {
        self.gate.send_modify(|gate| gate.partitioned = false);
    }

    /// The database moved (a failover): the connections open now never move another byte
    /// and are never closed, while new connections reach the database.
    pub fn fail_over(&self) {
        let next = self.accepted.load(Ordering::SeqCst);
        self.gate.send_modify(|gate| {
            gate.partitioned = false;
            gate.stranded_below = next;
        });
    }
}

impl Drop for PartitionProxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Connects to `upstream` once the gate opens for `id`, then pumps both ways.
async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    id: u64,
    mut gate: watch::Receiver<Gate>,
    lost_answers: Arc<LostAnswers>,
) {
    if gate.wait_for(|g| g.open_for(id)).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let losing = Arc::new(AtomicBool::new(false));
    tokio::join!(
        pump(
            client_read,
            server_write,
            id,
            gate.clone(),
            Watch::Requests(lost_answers, losing.clone())
        ),
        pump(server_read, client_write, id, gate, Watch::Answers(losing)),
    );
}

/// What a pump looks for on the way.
enum Watch {
    /// Client to server: the armed marker, which makes this connection lose its next answer.
    Requests(Arc<LostAnswers>, Arc<AtomicBool>),
    /// Server to client: once losing, swallow the answer up to `ReadyForQuery` (sent after
    /// the statement's commit), then close the client's side.
    Answers(Arc<AtomicBool>),
}

/// Copies `from` to `to`, each chunk (and the end of the stream) only while the gate is open.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    id: u64,
    mut gate: watch::Receiver<Gate>,
    watch: Watch,
) {
    let mut buffer = vec![0_u8; 16 * 1024];
    let mut seen: Vec<u8> = Vec::new();
    loop {
        let read = from.read(&mut buffer).await.unwrap_or(0);
        if gate.wait_for(|g| g.open_for(id)).await.is_err() {
            return;
        }
        if read == 0 {
            let _ = to.shutdown().await;
            return;
        }
        let chunk = &buffer[..read];
        match &watch {
            Watch::Requests(lost_answers, losing) => {
                let mut armed = lost_answers.armed.lock().expect("lock");
                if let Some(marker) = armed.clone() {
                    // Keep a marker's length of history, for a marker split between chunks.
                    seen.extend_from_slice(chunk);
                    if seen.windows(marker.len()).any(|w| w == marker.as_slice()) {
                        *armed = None;
                        losing.store(true, Ordering::SeqCst);
                        lost_answers.lost.fetch_add(1, Ordering::SeqCst);
                    }
                    let keep = seen.len().saturating_sub(marker.len());
                    seen.drain(..keep);
                }
            }
            Watch::Answers(losing) if losing.load(Ordering::SeqCst) => {
                // `ReadyForQuery`: 'Z', length 5, transaction status.
                let ready = read >= 6 && chunk[read - 6..read - 1] == [b'Z', 0, 0, 0, 5];
                if ready {
                    let _ = to.shutdown().await;
                    return;
                }
                continue;
            }
            Watch::Answers(_) => {}
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}
