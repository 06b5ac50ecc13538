//! Instructions per `submit`, counted by valgrind's callgrind in the API process: unlike
//! time, the count is the same on a busy machine and a quiet one, so two builds compare
//! in any state of the machine.

use std::process::Command;
use std::sync::Arc;

use crate::process::{admin_token, Scratch, Server};
use crate::workloads::{create_endpoint, submit_one};

/// What one count found.
pub struct Instructions {
    /// Submissions counted (after a warm-up).
    pub submits: usize,
    /// Instructions the `courier serve` process executed for them, every thread.
    pub total: u64,
}

/// Counts the instructions `courier serve` (API only, default settings otherwise) executes
/// for `submits` submissions over `connections` connections, after 200 uncounted ones.
/// `None` when valgrind is not installed (it says so).
pub async fn per_submit(
    server_url: &str,
    submits: usize,
    connections: usize,
) -> Option<Instructions> {
    if Command::new("callgrind_control")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("instructions per submit: not counted, valgrind is not installed (apt-get install valgrind)");
        return None;
    }
    let scratch = Scratch::create(server_url, "instructions").await;
    let token = admin_token(&scratch.url);
    let out = std::env::temp_dir().join(format!("courier-callgrind-{}", scratch.name));
    let out_arg = format!("--callgrind-out-file={}", out.display());
    let server = Server::start_under(
        &["valgrind", "--tool=callgrind", &out_arg],
        &scratch.url,
        &[
            ("COURIER_WORKER_CONCURRENCY", "0".into()),
            ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into()),
        ],
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()
        .expect("client");
    let endpoint = create_endpoint(&client, &server, &token, "http://127.0.0.1:9/hook").await;
    let server = Arc::new(server);
    let send = |count: usize, connections: usize| {
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
                task.await.expect("submitter");
            }
        }
    };
    send(200, 8).await;
    let pid = server.pid().to_string();
    control(&["-z", &pid]);
    send(submits, connections).await;
    control(&["-d", &pid]);
    let dump = format!("{}.1", out.display());
    let total = std::fs::read_to_string(&dump)
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("summary:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
        .expect("callgrind's dump has a summary");
    match Arc::try_unwrap(server) {
        Ok(server) => server.stop(),
        Err(server) => {
            let _ = Command::new("kill")
                .args(["-TERM", &server.pid().to_string()])
                .status();
        }
    }
    for file in [out.display().to_string(), dump] {
        let _ = std::fs::remove_file(file);
    }
    scratch.drop_now().await;
    Some(Instructions { submits, total })
}

/// Runs `callgrind_control` with `args`, which must succeed.
fn control(args: &[&str]) {
    let status = Command::new("callgrind_control")
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run callgrind_control");
    assert!(status.success(), "callgrind_control {args:?} failed");
}
