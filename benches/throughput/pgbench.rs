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

/// pgbench's simple-update script, eight clients for `duration`, then one for five seconds.
pub async fn measure(server: &str, duration: Duration) -> Budget {
    let scratch = Scratch::create(server, "pgbench").await;
    let pgbench = find_pgbench();
    // pgbench with `args` on the scratch database, which must succeed: its output.
    let pgbench_with = |args: &[&str]| {
        let run = Command::new(&pgbench)
            .args(args)
            .arg(&scratch.url)
            .output()
            .expect("run pgbench");
        assert!(
            run.status.success(),
            "pgbench {args:?} failed: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        String::from_utf8_lossy(&run.stdout).into_owned()
    };
    pgbench_with(&["-i", "-q", "-s", "10"]);
    let run = |clients: &str, seconds: u64| {
        let seconds = seconds.max(1).to_string();
        pgbench_with(&["-N", "-c", clients, "-j", "2", "-T", &seconds])
    };
    let eight = run("8", duration.as_secs());
    let one = run("1", 5);
    scratch.drop_now().await;
    Budget {
        tps: figure(&eight, "tps = "),
        one_client_ms: figure(&one, "latency average = "),
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
