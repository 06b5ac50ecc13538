//! Requests that have ended while their outcomes wait to be recorded. They are no longer in
//! flight at the receiver, though their deliveries stay `processing` until recorded: this
//! process's claims leave them out of its endpoints' in-flight counts (by id, so a row
//! recorded meanwhile is never subtracted twice), and come back for an endpoint that was
//! full once a quarter of its slots have ended (one, for a cap under 8; those that ended
//! while the claim that left it full ran count too), rather than when the outcomes are
//! recorded: claims stay large enough to be cheap, and the slots busy.
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
    /// Endpoints a claim left with no free slot: how many requests to each must end before
    /// it is worth a claim, and how many have.
    full: HashMap<Uuid, Gather>,
}

#[derive(Debug, Clone, Copy)]
struct Gather {
    wanted: u32,
    ended: u32,
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
    /// forgets it once dropped, after its outcome is recorded. Also says whether a claim is
    /// worth making now: the endpoint had been left full and enough of its slots are free.
    pub fn ended(&self, delivery_id: Uuid, endpoint_id: Uuid) -> (EndedGuard, bool) {
        let mut inner = self.lock();
        inner.awaiting.insert(delivery_id, endpoint_id);
        let was_full = match inner.full.get_mut(&endpoint_id) {
            Some(gather) => {
                gather.ended += 1;
                gather.ended >= gather.wanted
            }
            None => false,
        };
        let guard = EndedGuard {
            requests: self.clone(),
            delivery_id,
        };
        (guard, was_full)
    }

    /// What the next claim should know.
    pub fn snapshot(&self) -> Snapshot {
        let inner = self.lock();
        // A full endpoint with an ended request, or one whose gathered slots were recorded
        // meanwhile: either way it has room this process knows of, until a claim looks.
        let mut revisit: Vec<Uuid> = inner
            .awaiting
            .values()
            .filter(|endpoint| inner.full.contains_key(endpoint))
            .copied()
            .chain(
                inner
                    .full
                    .iter()
                    .filter(|(_, gather)| gather.ended >= gather.wanted)
                    .map(|(endpoint, _)| *endpoint),
            )
            .collect();
        revisit.sort();
        revisit.dedup();
        Snapshot {
            ended: inner.awaiting.keys().copied().collect(),
            revisit,
        }
    }

    /// Records which endpoints a claim visited, and for each it left full, its cap and how
    /// many requests the claim started for it (a quarter of the cap is awaited, but never
    /// more than this process has started). Requests to it that ended after `seen` (the
    /// claim's snapshot, [`Snapshot::ended`]) was taken count at once: the claim counted
    /// them in flight, yet their slots are free. (One whose outcome the recorder committed
    /// before the claim looked counts too, though the claim saw its slot free: the early
    /// claim that follows finds the endpoint full and awaits one request, so this only
    /// ever costs a claim.) Returns whether one of these endpoints is worth a claim already.
    pub fn visited(
        &self,
        endpoints: impl IntoIterator<Item = (Uuid, Option<(u32, u32)>)>,
        seen: &[Uuid],
    ) -> bool {
        let mut inner = self.lock();
        let mut ready = false;
        let mut known: Option<HashSet<&Uuid>> = None;
        for (endpoint_id, full) in endpoints {
            match full {
                Some((cap, started)) => {
                    let wanted = (cap / 4).min(started).max(1);
                    let known = known.get_or_insert_with(|| seen.iter().collect());
                    let ended = inner
                        .awaiting
                        .iter()
                        .filter(|(delivery, endpoint)| {
                            **endpoint == endpoint_id && !known.contains(delivery)
                        })
                        .count();
                    let ended = u32::try_from(ended).unwrap_or(u32::MAX);
                    ready |= ended >= wanted;
                    inner.full.insert(endpoint_id, Gather { wanted, ended });
                }
                None => {
                    inner.full.remove(&endpoint_id);
                }
            }
        }
        ready
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
        requests.visited([(endpoint, Some((2, 2))), (other, None)], &[]);
        let (first, was_full) = requests.ended(Uuid::now_v7(), endpoint);
        assert!(was_full, "a cap of 2: one free slot is worth a claim");
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
        requests.visited([(endpoint, None)], &[]);
        let (_third, was_full) = requests.ended(Uuid::now_v7(), endpoint);
        assert!(!was_full);
    }

    #[test]
    fn a_full_endpoint_is_worth_a_claim_once_a_quarter_of_its_slots_ended() {
        let requests = EndedRequests::default();
        let endpoint = Uuid::now_v7();
        requests.visited([(endpoint, Some((32, 32)))], &[]);
        let (guards, hints): (Vec<EndedGuard>, Vec<bool>) = (0..10)
            .map(|_| requests.ended(Uuid::now_v7(), endpoint))
            .unzip();
        drop(guards);
        assert_eq!(
            requests.snapshot().revisit,
            vec![endpoint],
            "recorded meanwhile, its room is still known until a claim looks"
        );
        assert_eq!(
            hints.iter().position(|h| *h),
            Some(7),
            "the eighth of 32 asks: {hints:?}"
        );
        assert!(
            hints[8..].iter().all(|h| *h),
            "and every one after, until a claim looks"
        );
        requests.visited([(endpoint, Some((32, 3)))], &[]);
        assert!(!requests.ended(Uuid::now_v7(), endpoint).1);
        assert!(!requests.ended(Uuid::now_v7(), endpoint).1);
        assert!(
            requests.ended(Uuid::now_v7(), endpoint).1,
            "all it started ended"
        );
    }

    #[test]
    fn requests_that_end_while_a_claim_runs_count_toward_the_next() {
        let requests = EndedRequests::default();
        let endpoint = Uuid::now_v7();
        let (before, _) = requests.ended(Uuid::now_v7(), endpoint);
        let seen = requests.snapshot().ended;
        // The claim runs; three more requests end meanwhile, which it counted in flight.
        let during: Vec<EndedGuard> = (0..3)
            .map(|_| requests.ended(Uuid::now_v7(), endpoint).0)
            .collect();
        assert!(
            !requests.visited([(endpoint, Some((32, 4)))], &seen),
            "three of the four awaited"
        );
        assert!(
            requests.ended(Uuid::now_v7(), endpoint).1,
            "the fourth asks for a claim"
        );
        assert!(
            requests.visited([(endpoint, Some((8, 8)))], &seen),
            "a claim leaving two of eight awaited, with four ended since its snapshot, asks again at once"
        );
        drop((before, during));
    }
}
