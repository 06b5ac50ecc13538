//! A reverse proxy that serves an app under a path prefix, as operators put Courier behind
//! one (`https://ops.example.com/courier/` to `http://courier:8080/`): every request's path
//! loses the prefix on its way in (a path outside it is answered 404 here), and a WebSocket
//! upgrade is piped both ways once its request is through.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};

/// A running proxy on `127.0.0.1`, port 0, serving `upstream` under `prefix`.
pub struct PrefixProxy {
    addr: SocketAddr,
    prefix: &'static str,
    task: tokio::task::JoinHandle<()>,
}

impl PrefixProxy {
    /// Serves `upstream` under `prefix` (such as `/courier`, no trailing slash).
    pub async fn start(upstream: SocketAddr, prefix: &'static str) -> PrefixProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream, prefix));
            }
        });
        PrefixProxy { addr, prefix, task }
    }

    /// The proxy's URL for `path` of the app (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}{}", self.addr, self.prefix, path)
    }
}

impl Drop for PrefixProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One client connection: each request's head rewritten, its body passed on; answers piped
/// back as they come.
async fn relay(client: TcpStream, upstream: SocketAddr, prefix: &'static str) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_in, mut client_out) = client.into_split();
    let (mut server_in, mut server_out) = server.into_split();
    let answers = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_in, &mut client_out).await;
    });
    let mut pending = Vec::new();
    while let Some(head) = read_head(&mut client_in, &mut pending).await {
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_owned();
        let mut parts = request_line.splitn(3, ' ');
        let (method, target, version) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        let Some(inner) = target
            .strip_prefix(prefix)
            .filter(|rest| rest.starts_with('/'))
        else {
            // Outside the prefix: nothing of the app is there.
            let _ = server_out.shutdown().await;
            answers.abort();
            return;
        };
        let rest: String = text[request_line.len()..].to_owned();
        let rewritten = format!("{method} {inner} {version}{rest}");
        if server_out.write_all(rewritten.as_bytes()).await.is_err() {
            break;
        }
        let lower = text.to_ascii_lowercase();
        if lower.contains("\r\nupgrade:") {
            // A WebSocket: everything after the head is the socket's own.
            let _ = server_out.write_all(&pending).await;
            let _ = tokio::io::copy(&mut client_in, &mut server_out).await;
            break;
        }
        let length: usize = lower
            .split("\r\n")
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0);
        while pending.len() < length {
            let mut chunk = [0u8; 8192];
            match client_in.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = pending.drain(..length).collect();
        if server_out.write_all(&body).await.is_err() {
            break;
        }
    }
    let _ = server_out.shutdown().await;
    let _ = answers.await;
}

/// The next request head (through its blank line) from `client`, what was read past it left
/// in `pending`; `None` once the client is done.
async fn read_head(client: &mut OwnedReadHalf, pending: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(pending.drain(..end + 4).collect());
        }
        let mut chunk = [0u8; 8192];
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
        }
    }
}
