//! The worker's stop: in-flight deliveries finish within the grace period, then the
//! recorder writes the last outcomes (for a moment more, if need be) and stops.

use std::sync::PoisonError;
use std::time::Duration;

use super::running::Running;
use super::Worker;

/// On shutdown, how long the outcomes of finished requests may take to be recorded, past
/// the grace period if need be; a silent database gets no longer.
const RECORD_LAST_OUTCOMES_WITHIN: Duration = Duration::from_secs(5);

impl Worker {
    /// Lets in-flight deliveries finish, and their outcomes be recorded, within the grace period.
    pub(super) async fn drain(&self, running: &Running, recorder: tokio::task::JoinHandle<()>) {
        let grace = self.state.config.shutdown_grace();
        let deadline = tokio::time::Instant::now() + grace;
        running.reservations_settled(deadline).await;
        running.tasks.close();
        let remaining = running.tasks.len();
        if remaining > 0 {
            tracing::info!(
                remaining,
                ?grace,
                "delivery worker stopping: letting in-flight deliveries finish"
            );
        }
        if tokio::time::timeout_at(deadline, running.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                unfinished = running.tasks.len(),
                "grace period over; unfinished deliveries will be reclaimed after their lease"
            );
            running.abandon.cancel();
            running.tasks.wait().await;
        }
        // Every sender is gone now: the recorder writes what it holds and stops.
        running
            .results
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let flush = deadline.max(tokio::time::Instant::now() + RECORD_LAST_OUTCOMES_WITHIN);
        let mut recorder = recorder;
        if tokio::time::timeout_at(flush, &mut recorder).await.is_err() {
            // Stopped, so the connections it holds go back and the process can exit.
            recorder.abort();
            tracing::warn!(
                "recording the last outcomes took too long; they will be retried after their lease"
            );
        }
        tracing::info!("delivery worker stopped");
    }
}
