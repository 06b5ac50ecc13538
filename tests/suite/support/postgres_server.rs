//! Where the PostgreSQL tests find a server: `TEST_DATABASE_URL` (default: the local server),
//! or else a throwaway cluster started from the local binaries for this test process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio::sync::OnceCell;

/// The server every PostgreSQL test of this process uses, resolved once.
static SERVER_URL: OnceCell<String> = OnceCell::const_new();

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The URL of a PostgreSQL server's maintenance database, starting one if none answers.
pub async fn url() -> String {
    SERVER_URL
        .get_or_init(|| async {
            let url = std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
            if answers(&url).await {
                return url;
            }
            eprintln!(
                "no PostgreSQL answers at {url}; starting a throwaway server for this test run"
            );
            let url = tokio::task::spawn_blocking(start_throwaway)
                .await
                .expect("the start-up task ran")
                .unwrap_or_else(|why| panic!("PostgreSQL tests cannot run: {why}"));
            for _ in 0..300 {
                if answers(&url).await {
                    return url;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("the throwaway PostgreSQL server did not start at {url}");
        })
        .await
        .clone()
}

async fn answers(url: &str) -> bool {
    match tokio::time::timeout(Duration::from_secs(5), courier::db::Db::connect(url, 1)).await {
        Ok(Ok(db)) => {
            let _ = db.close().await;
            true
        }
        _ => false,
    }
}

/// Initialises and starts a cluster in a temporary directory. A watchdog shell stops it and
/// removes the directory once this test process has exited.
fn start_throwaway() -> Result<String, String> {
    let bin = find_binaries().ok_or(
        "no server at TEST_DATABASE_URL and no PostgreSQL server binaries (initdb, postgres) found; \
         install them (Debian/Ubuntu: `apt-get install postgresql`) or point TEST_DATABASE_URL at a server",
    )?;
    let dir = std::env::temp_dir().join(format!("courier-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let as_root = is_root();
    if as_root {
        run(Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir))?;
    }
    let data = dir.join("data");
    run(as_postgres(as_root, &bin.join("initdb"))
        .args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
            "-D",
        ])
        .arg(&data))?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("find a free port: {e}"))?;
    let script = format!(
        "'{postgres}' -D '{data}' -p {port} -k '{dir}' -c listen_addresses=127.0.0.1 \
         -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400 \
         > '{dir}/server.log' 2>&1 & pg=$!; \
         while [ -d /proc/{parent} ]; do sleep 1; done; \
         kill -INT $pg; wait $pg; rm -rf '{dir}'",
        postgres = bin.join("postgres").display(),
        data = data.display(),
        dir = dir.display(),
        parent = std::process::id(),
    );
    as_postgres(as_root, Path::new("sh"))
        .args(["-c", &script])
        .spawn()
        .map_err(|e| format!("start postgres: {e}"))?;
    Ok(format!("postgres://postgres@127.0.0.1:{port}/postgres"))
}

fn find_binaries() -> Option<PathBuf> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    let mut candidates: Vec<PathBuf> = from_pg_config.into_iter().collect();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin"))
            .collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev());
    }
    candidates
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// PostgreSQL refuses to run as root: run as the `postgres` user when we are root.
fn as_postgres(as_root: bool, program: &Path) -> Command {
    if as_root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
