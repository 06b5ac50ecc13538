//! The machine's durable-commit budget: `pgbench -N -c 8 -j 2` on a scratch database.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::process::Scratch;

/// TPS of pgbench's simple-update script, measured for `duration`.
pub async fn tps(server: &str, duration: Duration) -> f64 {
    let scratch = Scratch::create(server, "pgbench").await;
    let pgbench = find_pgbench();
    let init = Command::new(&pgbench)
        .args(["-i", "-q", "-s", "10"])
        .arg(&scratch.url)
        .output()
        .expect("run pgbench -i");
    assert!(
        init.status.success(),
        "pgbench -i failed: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    let run = Command::new(&pgbench)
        .args(["-N", "-c", "8", "-j", "2", "-T"])
        .arg(duration.as_secs().max(1).to_string())
        .arg(&scratch.url)
        .output()
        .expect("run pgbench");
    assert!(
        run.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let out = String::from_utf8_lossy(&run.stdout);
    scratch.drop_now().await;
    out.lines()
        .find(|line| line.starts_with("tps = "))
        .and_then(|line| line.trim_start_matches("tps = ").split_whitespace().next())
        .and_then(|tps| tps.parse().ok())
        .unwrap_or_else(|| panic!("no TPS in pgbench output: {out}"))
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
