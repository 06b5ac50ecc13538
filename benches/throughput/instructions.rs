//! Instructions per `submit`, counted by valgrind's callgrind in the API process: unlike
//! time, the count is the same on a busy machine and a quiet one, so two builds compare
//! in any state of the machine. What the process does on its own clock meanwhile (its
//! timers and polls, which run longer under callgrind) is counted over an idle window as
//! long as the measured one and taken off.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::process::{admin_token, Scratch, Server};
use crate::workloads::{create_endpoint, submit_one};

/// What one count found.
pub struct Instructions {
    /// Submissions counted (after a warm-up).
    pub submits: usize,
    /// Instructions the `courier serve` process executed for them, every thread, less
    /// what it executed idle for as long.
    pub total: u64,
    /// What it executed idle over a window as long, taken off `total`.
    pub idle: u64,
}

/// Counts the instructions `courier serve` (API only, default settings otherwise) executes
/// for `submits` submissions over `connections` connections, after as many uncounted ones
/// as open them. `None` when valgrind is not installed, or the count failed (it says why).
pub async fn per_submit(
    server_url: &str,
    submits: usize,
    connections: usize,
) -> Option<Instructions> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("instructions per submit: not counted, valgrind is not installed (apt-get install valgrind)");
        return None;
    }
    let scratch = Scratch::create(server_url, "instructions").await;
    let dumps = Dumps(std::env::temp_dir().join(format!("courier-callgrind-{}", scratch.name)));
    let counted = count(&scratch, &dumps, submits, connections).await;
    drop(dumps);
    scratch.drop_now().await;
    match counted {
        Ok(counted) => Some(counted),
        Err(why) => {
            println!("instructions per submit: not counted, {why}");
            None
        }
    }
}

/// Starts the server under callgrind, sends the warm-up, then the counted submissions, then
/// waits as long idle, dumping the counts between each.
async fn count(
    scratch: &Scratch,
    dumps: &Dumps,
    submits: usize,
    connections: usize,
) -> Result<Instructions, String> {
    let token = admin_token(&scratch.url);
    let out = format!("--callgrind-out-file={}", dumps.0.display());
    let server = Arc::new(Server::start_under(
        &["valgrind", "--tool=callgrind", &out],
        Duration::from_secs(180),
        &scratch.url,
        &[
            ("COURIER_WORKER_CONCURRENCY", "0".into()),
            ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into()),
        ],
    ));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()
        .map_err(|err| err.to_string())?;
    let endpoint = create_endpoint(&client, &server, &token, "http://127.0.0.1:9/hook").await;
    let send = |count: usize| {
        let tasks: Vec<_> = (0..connections)
            .map(|worker| {
                let (client, server, token, endpoint) = (
                    client.clone(),
                    server.clone(),
                    token.clone(),
                    endpoint.clone(),
                );
                tokio::spawn(async move {
                    for n in (worker..count).step_by(connections) {
                        submit_one(&client, &server, &token, &endpoint, n).await;
                    }
                })
            })
            .collect();
        async move {
            for task in tasks {
                task.await
                    .map_err(|err| format!("a submitter failed: {err}"))?;
            }
            Ok::<(), String>(())
        }
    };
    // Every connection opened before counting starts.
    send(200.max(connections)).await?;
    let pid = server.pid();
    // Each dump holds what ran since the one before it.
    dumps.take(pid, 1)?;
    let started = Instant::now();
    send(submits).await?;
    let total = dumps.take(pid, 2)?;
    tokio::time::sleep(started.elapsed()).await;
    let idle = dumps.take(pid, 3)?;
    drop(client);
    if let Ok(server) = Arc::try_unwrap(server) {
        server.stop();
    }
    Ok(Instructions {
        submits,
        total: total.saturating_sub(idle),
        idle,
    })
}

/// Callgrind's output file for one count, and its numbered dumps, removed when dropped.
struct Dumps(PathBuf);

impl Dumps {
    /// Asks callgrind in process `pid` for dump `number` and returns its instruction count.
    fn take(&self, pid: u32, number: u32) -> Result<u64, String> {
        // callgrind_control exits 0 whatever happened: the dump's file tells.
        let _ = Command::new("callgrind_control")
            .args(["-d", &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .status();
        let path = format!("{}.{number}", self.0.display());
        let text = std::fs::read_to_string(&path)
            .map_err(|err| format!("callgrind wrote no dump {path}: {err}"))?;
        text.lines()
            .find_map(|line| line.strip_prefix("summary:"))
            .and_then(|counts| counts.split_whitespace().next())
            .and_then(|first| first.parse::<u64>().ok())
            .ok_or_else(|| format!("dump {path} has no summary"))
    }
}

impl Drop for Dumps {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        for number in 1..=3 {
            let _ = std::fs::remove_file(format!("{}.{number}", self.0.display()));
        }
    }
}
