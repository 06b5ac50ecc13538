//! Logging: structured `tracing` to stderr, as text or JSON, filtered by `RUST_LOG`.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Default filter when `RUST_LOG` is unset: Courier at info, noisy dependencies at warn.
/// Per-request access lines (method, URI, status, latency) come from `tower_http` at
/// debug: `RUST_LOG=info,tower_http=debug` turns them on.
const DEFAULT_FILTER: &str = "info,sqlx=warn,sea_orm=warn,sea_orm_migration=warn,tower_http=warn";

/// Installs the global subscriber. Logs go to stderr so stdout stays for command output.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only for a person at a terminal: files, pipes and journals get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| LossyStderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Stderr that never fails: if the log sink is gone (a closed pipe), log lines are
/// dropped instead of surfacing an error, which the subscriber would report with a
/// panicking `eprintln!` and take down whatever task was logging.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}
