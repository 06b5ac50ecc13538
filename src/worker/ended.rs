//! Requests that have ended while their outcomes wait to be recorded. They are no longer in
//! flight at the receiver, though their deliveries stay `processing` until recorded: this
//! process's claims leave them out of its endpoints' in-flight counts (by id, so a row
//! recorded meanwhile is never subtracted twice), and come back for an endpoint that was
//! full as soon as one of its requests ends, rather than when its outcome is recorded.
//! Other processes count them until they are recorded, which only errs on the safe side.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use uuid::Uuid;

/// The ended requests of this process's worker, and which endpoints its last claims left full.
#[derive(Clone, Debug, Default)]
pub struct EndedRequests {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Delivery -> endpoint, for each request that ended and is not yet recorded.
    awaiting: HashMap<Uuid, Uuid>,
    /// Endpoints a claim left with no free slot.
    full: HashSet<Uuid>,
}

/// What a claim needs to know: the deliveries to leave out of in-flight counts, and the
/// full endpoints that got a slot back (to look at whatever their turn says).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Deliveries whose requests ended.
    pub ended: Vec<Uuid>,
    /// Endpoints left full that have an ended request.
    pub revisit: Vec<Uuid>,
}

impl EndedRequests {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that the request of `delivery_id` (to `endpoint_id`) ended; the returned guard
    /// forgets it once dropped, after its outcome is recorded. Also says whether the
    /// endpoint had been left full, so a claim is worth making now.
    pub fn ended(&self, delivery_id: Uuid, endpoint_id: Uuid) -> (EndedGuard, bool) {
        let mut inner = self.lock();
        inner.awaiting.insert(delivery_id, endpoint_id);
        let was_full = inner.full.contains(&endpoint_id);
        let guard = EndedGuard {
            requests: self.clone(),
            delivery_id,
        };
        (guard, was_full)
    }

    /// What the next claim should know.
    pub fn snapshot(&self) -> Snapshot {
        let inner = self.lock();
        let mut revisit: Vec<Uuid> = inner
            .awaiting
            .values()
            .filter(|endpoint| inner.full.contains(endpoint))
            .copied()
            .collect();
        revisit.sort();
        revisit.dedup();
        Snapshot {
            ended: inner.awaiting.keys().copied().collect(),
            revisit,
        }
    }

    /// Records which endpoints a claim visited and whether it left each full.
    pub fn visited(&self, endpoints: impl IntoIterator<Item = (Uuid, bool)>) {
        let mut inner = self.lock();
        for (endpoint_id, full) in endpoints {
            if full {
                inner.full.insert(endpoint_id);
            } else {
                inner.full.remove(&endpoint_id);
            }
        }
    }
}

/// Forgets an ended request when dropped (its outcome was recorded, or given up on).
#[derive(Debug)]
pub struct EndedGuard {
    requests: EndedRequests,
    delivery_id: Uuid,
}

impl Drop for EndedGuard {
    fn drop(&mut self) {
        self.requests.lock().awaiting.remove(&self.delivery_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_request_is_left_out_until_its_outcome_is_recorded() {
        let requests = EndedRequests::default();
        let (endpoint, other) = (Uuid::now_v7(), Uuid::now_v7());
        requests.visited([(endpoint, true), (other, false)]);
        let (first, was_full) = requests.ended(Uuid::now_v7(), endpoint);
        assert!(was_full);
        let (second, was_full) = requests.ended(Uuid::now_v7(), other);
        assert!(!was_full);
        let snapshot = requests.snapshot();
        assert_eq!(snapshot.ended.len(), 2);
        assert_eq!(
            snapshot.revisit,
            vec![endpoint],
            "only the full endpoint is revisited"
        );
        drop(first);
        drop(second);
        assert!(requests.snapshot().ended.is_empty());
        requests.visited([(endpoint, false)]);
        let (_third, was_full) = requests.ended(Uuid::now_v7(), endpoint);
        assert!(!was_full);
    }
}
