//! How many of this process's slots one endpoint may hold: all but an eighth of them (from
//! eight slots on), so an endpoint whose cap is as large as the slots (a slow or hanging
//! receiver with a `maxInFlight` of hundreds) cannot take every slot while other endpoints
//! wait. Its cap
//! still counts across processes, on the database; this share counts one process's
//! requests, in the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use uuid::Uuid;

use crate::bus::Wakeup;

/// The requests each endpoint has under way in this process, against the share one may
/// hold.
#[derive(Debug)]
pub struct Shares {
    most: u32,
    held: Mutex<HashMap<Uuid, u32>>,
    wakeup: Wakeup,
}

impl Shares {
    /// The shares of a process with `slots` slots: one endpoint holds at most all but an
    /// eighth of them (rounded down: with fewer than eight, all). `wakeup` is poked when an
    /// endpoint that held its whole share has room again.
    pub fn new(slots: usize, wakeup: Wakeup) -> Self {
        let slots = u32::try_from(slots).unwrap_or(u32::MAX).max(1);
        let kept = slots / 8;
        Shares {
            most: slots - kept,
            held: Mutex::new(HashMap::new()),
            wakeup,
        }
    }

    /// The most one endpoint may hold.
    pub fn most(&self) -> u32 {
        self.most
    }

    /// Counts a request to `endpoint_id` under way until the returned guard is dropped.
    pub fn started(self: &Arc<Self>, endpoint_id: Uuid) -> Held {
        *self.lock().entry(endpoint_id).or_default() += 1;
        Held {
            shares: Arc::clone(self),
            endpoint_id,
        }
    }

    /// What each endpoint holds now (those holding nothing are left out), for one claim.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            most: self.most,
            held: self.lock().clone(),
        }
    }

    /// What `endpoint_id` alone holds, for a claim of that endpoint only (a claim at
    /// submit).
    pub fn snapshot_of(&self, endpoint_id: Uuid) -> Snapshot {
        let held = self.lock().get(&endpoint_id).copied();
        Snapshot {
            most: self.most,
            held: held.map(|held| (endpoint_id, held)).into_iter().collect(),
        }
    }

    /// Whether `endpoint_id` holds its whole share.
    pub fn is_full(&self, endpoint_id: Uuid) -> bool {
        self.lock()
            .get(&endpoint_id)
            .is_some_and(|held| *held >= self.most)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, u32>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request to `endpoint_id` ended.
    fn ended(&self, endpoint_id: Uuid) {
        let had_all = {
            let mut held = self.lock();
            let Some(count) = held.get_mut(&endpoint_id) else {
                return;
            };
            let had_all = *count >= self.most;
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&endpoint_id);
            }
            had_all
        };
        if had_all {
            // Its turn was left to other processes' claims: this one may take it again.
            self.wakeup.hint();
        }
    }
}

/// One request counted in its endpoint's share while it is under way.
#[derive(Debug)]
pub struct Held {
    shares: Arc<Shares>,
    endpoint_id: Uuid,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shares.ended(self.endpoint_id);
    }
}

/// The shares as one claim sees them.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The most one endpoint may hold (0: no limit, a claim outside the worker).
    pub most: u32,
    /// What each endpoint holding something holds.
    pub held: HashMap<Uuid, u32>,
}

impl Snapshot {
    /// How many more requests `endpoint_id` may start in this process.
    pub fn room(&self, endpoint_id: Uuid) -> u32 {
        if self.most == 0 {
            return u32::MAX;
        }
        self.most
            .saturating_sub(self.held.get(&endpoint_id).copied().unwrap_or(0))
    }

    /// The endpoints holding their whole share: a claim leaves their turns to other
    /// processes.
    pub fn full(&self) -> Vec<Uuid> {
        let mut full: Vec<Uuid> = self
            .held
            .iter()
            .filter(|(_, held)| self.most > 0 && **held >= self.most)
            .map(|(id, _)| *id)
            .collect();
        full.sort();
        full
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eighth_of_the_slots_is_kept_for_other_endpoints() {
        for (slots, most) in [(1, 1), (2, 2), (7, 7), (8, 7), (16, 14), (128, 112)] {
            assert_eq!(
                Shares::new(slots, Wakeup::default()).most(),
                most,
                "{slots}"
            );
        }
    }

    #[test]
    fn an_endpoint_is_full_at_its_share_until_a_request_ends() {
        let shares = Arc::new(Shares::new(8, Wakeup::default()));
        let (hog, other) = (Uuid::now_v7(), Uuid::now_v7());
        let mut held: Vec<Held> = (0..7).map(|_| shares.started(hog)).collect();
        let _other = shares.started(other);
        assert!(shares.is_full(hog));
        assert!(!shares.is_full(other));
        let snapshot = shares.snapshot();
        assert_eq!(snapshot.full(), vec![hog]);
        assert_eq!(snapshot.room(hog), 0);
        assert_eq!(snapshot.room(other), 6);
        assert_eq!(snapshot.room(Uuid::now_v7()), 7);
        assert_eq!(shares.snapshot_of(hog).room(hog), 0);
        assert_eq!(shares.snapshot_of(hog).held.len(), 1);
        held.pop();
        assert!(!shares.is_full(hog));
        assert_eq!(shares.snapshot().room(hog), 1);
        held.clear();
        assert!(!shares.snapshot().held.contains_key(&hog));
    }

    #[test]
    fn a_claim_outside_the_worker_has_no_share_to_keep() {
        let snapshot = Snapshot::default();
        assert_eq!(snapshot.room(Uuid::now_v7()), u32::MAX);
        assert!(snapshot.full().is_empty());
    }
}
