//! The signals that stop `serve`: the first SIGTERM or Ctrl-C shuts down gracefully, a
//! second stops at once.

use tokio_util::sync::CancellationToken;

/// SIGTERM, listened for from now on (so it no longer ends the process by default), or
/// why it cannot be.
#[cfg(unix)]
pub(super) type Terminate = std::io::Result<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
pub(super) type Terminate = ();

/// Starts listening for SIGTERM at once (see [`Terminate`]).
pub(super) fn terminate_signal() -> Terminate {
    #[cfg(unix)]
    {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    }
}

/// The signals that stop `serve`: SIGTERM and Ctrl-C, each as often as it comes.
struct StopSignals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn new(terminate: Terminate) -> Self {
        #[cfg(unix)]
        {
            let terminate = terminate
                .map_err(|err| tracing::error!(error = %err, "cannot listen for SIGTERM"))
                .ok();
            Self { terminate }
        }
        #[cfg(not(unix))]
        {
            let () = terminate;
            Self {}
        }
    }

    /// The next stop signal: its name and the exit code its default action would give.
    async fn next(&mut self) -> (&'static str, i32) {
        let ctrl_c = async {
            if let Err(err) = tokio::signal::ctrl_c().await {
                tracing::error!(error = %err, "cannot listen for Ctrl-C");
                std::future::pending::<()>().await;
            }
        };
        #[cfg(unix)]
        let terminate = async {
            match self.terminate.as_mut() {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let terminate = std::future::pending::<()>();
        tokio::select! {
            () = ctrl_c => ("Ctrl-C", 130),
            () = terminate => ("SIGTERM", 143),
        }
    }
}

/// Cancels `shutdown` on the first SIGTERM or Ctrl-C. A second one ends the process at
/// once, with the code the signal's default action gives (130 or 143): whatever was in
/// flight is sent again after its lease, by this process's successor or another.
pub(super) async fn cancel_on_signal(shutdown: CancellationToken, terminate: Terminate) {
    let mut signals = StopSignals::new(terminate);
    let (signal, _) = signals.next().await;
    shutdown.cancel();
    tracing::info!(signal, "shutting down; a second signal stops at once");
    let (signal, code) = signals.next().await;
    tracing::warn!(
        signal,
        "stopping at once; deliveries in flight are sent again after their lease"
    );
    crate::telemetry::sink::flush();
    std::process::exit(code);
}
