//! Wake-up hints for this process's delivery worker. Other processes learn of new work from
//! the `PENDING` state changes they receive (see [`crate::bus::listener`]). Only ever a hint:
//! workers also poll, so nothing depends on a wake-up arriving.
//!
//! Besides hints, the worker keeps the soonest moment a claim of this process set an
//! endpoint's next turn to (a rate limit's next start, a pause's end, a retry's due time),
//! so it looks again then instead of at its next poll: an endpoint limited to 20 requests a
//! second is served at 20 a second, not at the polling pace.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::Hint;

/// A cheap handle for poking the worker.
#[derive(Clone, Debug, Default)]
pub struct Wakeup {
    local: Hint,
    slots: Hint,
    turns: Arc<NextTurn>,
}

/// The soonest turn a claim of this process set, and a signal that it moved earlier.
#[derive(Debug, Default)]
struct NextTurn {
    at: Mutex<Option<Instant>>,
    moved_earlier: Notify,
}

impl Wakeup {
    /// Tells the worker there may be due work. Hints that arrive while it is busy
    /// coalesce into one.
    pub fn hint(&self) {
        self.local.give();
    }

    /// Takes a hint that arrived since the last wait, if one did, without waiting.
    pub fn take_hint(&self) -> bool {
        self.local.take_pending()
    }

    /// Resolves at the next hint (or at once if one arrived since the last wait).
    pub async fn notified(&self) {
        self.local.taken().await;
    }

    /// Tells the worker that an endpoint's turn comes round `after` from now: it looks
    /// again by then, whatever its polling interval.
    pub fn turn_after(&self, after: Duration) {
        let now = Instant::now();
        let at = now + after;
        let mut soonest = self.turns.at.lock().unwrap_or_else(PoisonError::into_inner);
        // A soonest turn already past was looked at (or is being): this one replaces it.
        if soonest.is_none_or(|current| at < current || current <= now) {
            *soonest = Some(at);
            self.turns.moved_earlier.notify_one();
        }
    }

    /// Resolves at the next hint, when the soonest turn set with [`Wakeup::turn_after`]
    /// comes (which it then forgets), or after `poll`, whichever is first.
    pub async fn notified_or_turn(&self, poll: Duration) {
        let polled = Instant::now() + poll;
        loop {
            let turn = *self.turns.at.lock().unwrap_or_else(PoisonError::into_inner);
            let until = turn.map_or(polled, |turn| turn.min(polled));
            tokio::select! {
                () = self.local.taken() => return,
                () = tokio::time::sleep_until(until) => {
                    let mut soonest = self.turns.at.lock().unwrap_or_else(PoisonError::into_inner);
                    if soonest.is_some_and(|at| at <= Instant::now()) {
                        *soonest = None;
                    }
                    return;
                }
                () = self.turns.moved_earlier.notified() => {}
            }
        }
    }

    /// Tells a worker waiting for a free slot that one was freed.
    pub fn free_slot(&self) {
        self.slots.give();
    }

    /// Resolves when a worker slot is freed (or at once if one was since the last wait).
    pub async fn slot_freed(&self) {
        self.slots.taken().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Far longer than any wait these tests expect to end early.
    const POLL: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn a_turn_set_ahead_wakes_the_worker_before_its_poll() {
        let wakeup = Wakeup::default();
        let started = Instant::now();
        wakeup.turn_after(Duration::from_millis(50));
        wakeup.notified_or_turn(POLL).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert!(waited < POLL / 2, "{waited:?}");
        // The turn is forgotten once it came: the next wait is the poll's (or a hint's).
        assert!(wakeup
            .turns
            .at
            .lock()
            .map(|at| at.is_none())
            .unwrap_or(false));
    }

    #[tokio::test]
    async fn a_turn_set_while_waiting_shortens_the_wait() {
        let wakeup = Wakeup::default();
        let started = Instant::now();
        let setter = wakeup.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            setter.turn_after(Duration::from_millis(30));
            // A later turn does not push the soonest back.
            setter.turn_after(POLL * 2);
        });
        wakeup.notified_or_turn(POLL).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert!(waited < POLL / 2, "{waited:?}");
        // A turn already past is replaced by the next one set, even a later one.
        wakeup.turn_after(Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(1)).await;
        wakeup.turn_after(Duration::from_millis(20));
        let before = Instant::now();
        wakeup.notified_or_turn(POLL).await;
        assert!(
            before.elapsed() >= Duration::from_millis(15),
            "{:?}",
            before.elapsed()
        );
        // A hint still ends a wait at once.
        let hinted = wakeup.clone();
        tokio::spawn(async move { hinted.hint() });
        wakeup.notified_or_turn(POLL).await;
        assert!(started.elapsed() < POLL / 2);
    }
}
