//! The signals that stop `serve`: the first SIGTERM, SIGHUP (its terminal went away) or
//! Ctrl-C shuts down gracefully, a second stops at once.

use tokio_util::sync::CancellationToken;

/// SIGTERM and SIGHUP, listened for from now on (so they no longer end the process by
/// default), or why each cannot be.
#[cfg(unix)]
pub(super) struct Terminate {
    terminate: std::io::Result<tokio::signal::unix::Signal>,
    hangup: std::io::Result<tokio::signal::unix::Signal>,
}
#[cfg(not(unix))]
pub(super) type Terminate = ();

/// Starts listening for SIGTERM and SIGHUP at once (see [`Terminate`]).
pub(super) fn terminate_signal() -> Terminate {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        Terminate {
            terminate: signal(SignalKind::terminate()),
            hangup: signal(SignalKind::hangup()),
        }
    }
}

/// The signals that stop `serve`: SIGTERM, SIGHUP and Ctrl-C, each as often as it comes.
struct StopSignals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
}

/// The next occurrence of `signal`, or never if it could not be listened for.
#[cfg(unix)]
async fn next_of(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

impl StopSignals {
    fn new(terminate: Terminate) -> Self {
        #[cfg(unix)]
        {
            let listened = |signal: std::io::Result<_>, name: &str| {
                signal
                    .map_err(|err| tracing::error!(error = %err, "cannot listen for {name}"))
                    .ok()
            };
            Self {
                terminate: listened(terminate.terminate, "SIGTERM"),
                hangup: listened(terminate.hangup, "SIGHUP"),
            }
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
        let (terminate, hangup) = (
            next_of(self.terminate.as_mut()),
            next_of(self.hangup.as_mut()),
        );
        #[cfg(not(unix))]
        let (terminate, hangup) = (std::future::pending::<()>(), std::future::pending::<()>());
        tokio::select! {
            () = ctrl_c => ("Ctrl-C", 130),
            () = terminate => ("SIGTERM", 143),
            () = hangup => ("SIGHUP", 129),
        }
    }
}

/// Cancels `shutdown` on the first SIGTERM, SIGHUP or Ctrl-C. A second one ends the
/// process at once, with the code the signal's default action gives (130, 143 or 129):
/// whatever was in flight is sent again after its lease, by this process's successor or
/// another.
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
