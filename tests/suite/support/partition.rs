//! A TCP proxy between an app and PostgreSQL that can cut the network without closing it:
//! partitioned, every socket stays open but no byte moves either way, as when packets are
//! lost; healed, what was held back flows on, as TCP would retransmit it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

/// A running proxy on `127.0.0.1`, port 0.
pub struct PartitionProxy {
    addr: SocketAddr,
    gate: watch::Sender<Gate>,
    accepted: Arc<AtomicU64>,
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
        let shutdown = CancellationToken::new();
        let (gates, counter, stop) = (gate.clone(), accepted.clone(), shutdown.clone());
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
                let (gate, stop) = (gates.subscribe(), stop.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = relay(client, upstream, id, gate) => {}
                    }
                });
            }
        });
        PartitionProxy {
            addr,
            gate,
            accepted,
            shutdown,
        }
    }

    /// `database_url` with its host and port replaced by this proxy's.
    pub fn url_for(&self, database_url: &str) -> String {
        let mut url = url::Url::parse(database_url).expect("a database URL");
        url.set_host(Some(&self.addr.ip().to_string()))
            .expect("set the host");
        url.set_port(Some(self.addr.port())).expect("set the port");
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
async fn relay(client: TcpStream, upstream: SocketAddr, id: u64, mut gate: watch::Receiver<Gate>) {
    if gate.wait_for(|g| g.open_for(id)).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, id, gate.clone()),
        pump(server_read, client_write, id, gate),
    );
}

/// Copies `from` to `to`, each chunk (and the end of the stream) only while the gate is open.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    id: u64,
    mut gate: watch::Receiver<Gate>,
) {
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        let read = from.read(&mut buffer).await.unwrap_or(0);
        if gate.wait_for(|g| g.open_for(id)).await.is_err() {
            return;
        }
        if read == 0 {
            let _ = to.shutdown().await;
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
