//! Scratch databases and `courier serve` processes for the benchmarks.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use courier::db::Db;
use sea_orm::ConnectionTrait;

/// A database created for one measurement and dropped after it.
pub struct Scratch {
    pub url: String,
    server: String,
    pub name: String,
}

impl Scratch {
    pub async fn create(server: &str, purpose: &str) -> Scratch {
        let name = format!("courier_bench_{purpose}_{}", uuid::Uuid::new_v4().simple());
        let admin = Db::connect(server, 1).await.expect("connect to PostgreSQL");
        admin
            .conn()
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        admin.close().await.expect("close");
        let mut url = url::Url::parse(server).expect("server URL");
        url.set_path(&format!("/{name}"));
        Scratch {
            url: url.to_string(),
            server: server.to_owned(),
            name,
        }
    }

    /// Drops the database, unless `BENCH_KEEP` is set (to inspect it afterwards).
    pub async fn drop_now(self) {
        if std::env::var_os("BENCH_KEEP").is_some() {
            println!("kept {}", self.url);
            return;
        }
        let admin = Db::connect(&self.server, 1).await.expect("connect");
        let _ = admin
            .conn()
            .execute_unprepared(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await;
        let _ = admin.close().await;
    }
}

/// A `courier serve` process.
pub struct Server {
    pub child: Child,
    pub base_url: String,
}

impl Server {
    /// Starts the release binary against `database_url` with `settings`, and waits until it listens.
    pub fn start(database_url: &str, settings: &[(&str, String)]) -> Server {
        Self::start_under(&[], Duration::from_secs(60), database_url, settings)
    }

    /// [`Server::start`], run by `wrapper` (a program and its arguments, such as a profiler
    /// that then runs the binary), or directly when `wrapper` is empty, given `patience` to
    /// start listening.
    pub fn start_under(
        wrapper: &[&str],
        patience: Duration,
        database_url: &str,
        settings: &[(&str, String)],
    ) -> Server {
        let binary = env!("CARGO_BIN_EXE_courier");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command
            .arg("serve")
            .env("DATABASE_URL", database_url)
            .env("COURIER_BIND", "127.0.0.1:0")
            .env("COURIER_LOG_FORMAT", "json")
            .stderr(Stdio::piped());
        for (name, value) in settings {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("start courier serve");
        let stderr = child.stderr.take().expect("stderr");
        let (found, addr) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut found = Some(found);
            // The log is read to the end (as a terminal or journal would), at the default
            // level: one line per delivery outcome. Only the line naming the address is parsed.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if found.is_none() {
                    continue;
                }
                let entry: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                if let (Some(tx), Some(addr)) = (found.as_ref(), entry["addr"].as_str()) {
                    let _ = tx.send(addr.to_owned());
                    found = None;
                }
            }
        });
        let addr = addr.recv_timeout(patience).expect("courier serve listens");
        Server {
            child,
            base_url: format!("http://{addr}"),
        }
    }

    /// Peak resident memory so far, in MB (Linux `VmHWM`).
    pub fn peak_rss_mb(&self) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find(|line| line.starts_with("VmHWM:"))
                    .and_then(|line| line.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
            .map(|kb| kb / 1024.0)
            .unwrap_or(0.0)
    }

    /// The process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time this process has used so far, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id())
    }

    /// SIGKILL, then wait: for a process whose in-flight requests would hold a graceful
    /// stop for its whole grace period.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    /// A run that panics leaves no server behind to load the next run (a stopped one has
    /// exited already, and killing it again does nothing).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time (user and system) process `pid` has used so far, in seconds (Linux).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |n: usize| {
        fields
            .get(n)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 11 and 12 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU time used so far by the PostgreSQL backends serving database `name` on this machine.
pub fn backend_cpu_seconds(name: &str) -> f64 {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|cmd| String::from_utf8_lossy(&cmd).contains(name))
                })
                .map(cpu_seconds)
                .sum()
        })
        .unwrap_or(0.0)
}

/// Creates an admin key with the CLI and returns its token.
pub fn admin_token(database_url: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["api-key", "create", "--name", "bench", "--role", "admin"])
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .output()
        .expect("create an API key");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

/// The machine's CPU time as `/proc/stat` counts it: all of it, and the share a virtual
/// machine's host ran something else while a CPU of this machine was ready to run (steal).
#[derive(Clone, Copy)]
pub struct HostTicks {
    total: u64,
    steal: u64,
}

impl HostTicks {
    /// The counts now (zeros where `/proc/stat` cannot be read).
    pub fn now() -> HostTicks {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|n| n.parse().ok())
            .collect();
        HostTicks {
            // user nice system idle iowait irq softirq steal: guest time is within user.
            total: ticks.iter().take(8).sum(),
            steal: ticks.get(7).copied().unwrap_or(0),
        }
    }

    /// Percent of the machine's CPU time since `self` that the host took.
    pub fn stolen_percent(&self) -> f64 {
        let now = HostTicks::now();
        let total = now.total.saturating_sub(self.total);
        if total == 0 {
            return 0.0;
        }
        100.0 * now.steal.saturating_sub(self.steal) as f64 / total as f64
    }
}
