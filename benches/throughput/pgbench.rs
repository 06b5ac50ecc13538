//! The machine's durable-commit budget: `pgbench -N -c 8 -j 2` on a scratch database, and
//! the time of one client's transaction (`pgbench -N -c 1`), the floor under any latency
//! that waits for a commit.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::process::Scratch;

/// What pgbench measured.
pub struct Budget {
    /// TPS of eight clients.
    pub tps: f64,
    /// Milliseconds of one client's transaction, on average.
    pub one_client_ms: f64,
}

/// pgbench's database, initialised once and kept for the run, so that the budget can be
/// measured again right beside each part: on a shared host it moves from one minute to
/// the next.
pub struct Pgbench {
    scratch: Scratch,
    binary: PathBuf,
}

impl Pgbench {
    /// A scratch database initialised for pgbench (scale 10).
    pub async fn open(server: &str) -> Pgbench {
        let pgbench = Pgbench {
            scratch: Scratch::create(server, "pgbench").await,
            binary: find_pgbench(),
        };
        pgbench.run(&["-i", "-q", "-s", "10"]);
        pgbench
    }

    /// pgbench with `args` on the scratch database, which must succeed: its output.
    fn run(&self, args: &[&str]) -> String {
        let run = Command::new(&self.binary)
            .args(args)
            .arg(&self.scratch.url)
            .output()
            .expect("run pgbench");
        assert!(
            run.status.success(),
            "pgbench {args:?} failed: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        String::from_utf8_lossy(&run.stdout).into_owned()
    }

    /// pgbench's simple-update script (`-N`) with `clients` for `duration`: its output.
    fn simple_update(&self, clients: &str, duration: Duration) -> String {
        let seconds = duration.as_secs().max(1).to_string();
        self.run(&["-N", "-c", clients, "-j", "2", "-T", &seconds])
    }

    /// TPS of eight clients over `duration`.
    pub fn tps(&self, duration: Duration) -> f64 {
        figure(&self.simple_update("8", duration), "tps = ")
    }

    /// Milliseconds of one client's transaction, on average over `duration`.
    pub fn one_client_ms(&self, duration: Duration) -> f64 {
        figure(&self.simple_update("1", duration), "latency average = ")
    }

    /// Eight clients for `duration`, then one for five seconds.
    pub fn budget(&self, duration: Duration) -> Budget {
        Budget {
            tps: self.tps(duration),
            one_client_ms: self.one_client_ms(Duration::from_secs(5)),
        }
    }

    /// Drops the scratch database.
    pub async fn close(self) {
        self.scratch.drop_now().await;
    }
}

/// The number after `label` on the line of pgbench's output that starts with it.
fn figure(out: &str, label: &str) -> f64 {
    out.lines()
        .find_map(|line| line.strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} in pgbench output: {out}"))
}

fn find_pgbench() -> PathBuf {
    if Command::new("pgbench")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return PathBuf::from("pgbench");
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin/pgbench"))
                .collect()
        })
        .unwrap_or_default();
    candidates.sort();
    candidates
        .into_iter()
        .rev()
        .find(|path| path.is_file())
        .expect(
            "pgbench not found: install the PostgreSQL client tools (Debian: postgresql-client)",
        )
}
