//! Wake-up hints for this process's delivery worker. Other processes learn of new work from
//! the `PENDING` state changes they receive (see [`crate::bus::listener`]). Only ever a hint:
//! workers also poll, so nothing depends on a wake-up arriving.

use super::Hint;

/// A cheap handle for poking the worker.
#[derive(Clone, Debug, Default)]
pub struct Wakeup {
    local: Hint,
    slots: Hint,
}

impl Wakeup {
    /// Tells the worker there may be due work. Hints that arrive while it is busy
    /// coalesce into one.
    pub fn hint(&self) {
        self.local.give();
    }

    /// Resolves at the next hint (or at once if one arrived since the last wait).
    pub async fn notified(&self) {
        self.local.taken().await;
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
