//! When the due-queue gauge is measured: at most one count at a time, and none sooner than
//! [`DUE_MEASURE_INTERVAL`] after the last began, however often `/metrics` is scraped, so
//! that anonymous scrapes cannot queue counts of a large backlog on the database.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

/// The least time between two counts of the due queue; a scrape sooner than this after the
/// last count began is answered with what that count found.
pub const DUE_MEASURE_INTERVAL: Duration = Duration::from_secs(1);

/// The moment the last count began, held while a count runs.
#[derive(Debug, Clone, Default)]
pub struct MeasureGate {
    began: Arc<Mutex<Option<Instant>>>,
}

impl MeasureGate {
    /// Runs `measure` unless a count began less than `interval` ago; a caller arriving
    /// while a count runs waits for it and then measures nothing. A count that fails or is
    /// dropped (its scrape timed out) still counts as begun: the database is not asked
    /// again until `interval` has passed, whatever became of the statement it was sent.
    pub async fn measure<F, T, E>(&self, interval: Duration, measure: F) -> Result<Option<T>, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        let mut began = self.began.lock().await;
        if began.is_some_and(|at| at.elapsed() < interval) {
            return Ok(None);
        }
        *began = Some(Instant::now());
        measure.await.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scrapes_at_once_share_one_count() {
        let gate = MeasureGate::default();
        let counts = Arc::new(AtomicUsize::new(0));
        let scrapes = (0..20).map(|_| {
            let gate = gate.clone();
            let counts = Arc::clone(&counts);
            tokio::spawn(async move {
                gate.measure(Duration::from_secs(60), async {
                    counts.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, ()>(7)
                })
                .await
            })
        });
        let mut measured = 0;
        for scrape in scrapes {
            if let Ok(Ok(Some(7))) = scrape.await {
                measured += 1;
            }
        }
        assert_eq!(counts.load(Ordering::SeqCst), 1, "one count for 20 scrapes");
        assert_eq!(
            measured, 1,
            "the others are answered with that count's value"
        );
    }

    #[tokio::test]
    async fn a_dropped_count_still_holds_the_next_one_off() {
        let gate = MeasureGate::default();
        let hanging = gate.measure(
            Duration::from_secs(60),
            std::future::pending::<Result<i64, ()>>(),
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(20), hanging)
                .await
                .is_err(),
            "the count hangs and its scrape gives up"
        );
        let next = gate
            .measure(Duration::from_secs(60), async { Ok::<_, ()>(1) })
            .await;
        assert_eq!(
            next,
            Ok(None),
            "no second count while the first may still run"
        );
    }

    #[tokio::test]
    async fn a_count_is_taken_again_after_the_interval() {
        let gate = MeasureGate::default();
        let first = gate.measure(Duration::ZERO, async { Ok::<_, ()>(1) }).await;
        let second = gate.measure(Duration::ZERO, async { Ok::<_, ()>(2) }).await;
        assert_eq!((first, second), (Ok(Some(1)), Ok(Some(2))));
    }
}
