//! Requests that have ended while their outcomes wait to be recorded. They are no longer in
//! flight at the receiver, though their deliveries stay `processing` until recorded: this
//! process's claims leave them out of its endpoints' in-flight counts (by id, so a row
//! recorded meanwhile is never subtracted twice), and come back for an endpoint that was
//! full once a quarter of its slots have ended (one, for a cap under 8; those that ended
//! while the claim that left it full ran count too), rather than when the outcomes are
//! recorded: claims stay large enough to be cheap, and the slots busy.
//! Other processes count them until they are recorded, which only errs on the safe side.
//!
//! A receiver that answers faster than a claim commits would otherwise get its slots in
//! two alternating halves: each claim finds free only the slots of the claim before it,
//! whose requests ended while it ran, while its own are still in flight. So once a quarter
//! have ended, the next claim still waits, for at most as long as the last claim took
//! ([`MAX_LINGER`] at most), until every request that claim started has ended too: a
//! claim costs the same whether it takes 16 rows or 32, and a slow receiver, whose
//! requests end long after the claim, never waits for it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::bus::Wakeup;

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
    /// Ended requests that make a claim worth its cost: a quarter of the cap, never more
    /// than the claim started.
    wanted: u32,
    /// Requests ended since the claim's snapshot (toward `wanted`).
    ended: u32,
    /// Requests the claim that left the endpoint full started.
    started: u32,
    /// Requests ended since that claim committed (toward `started`).
    ended_since: u32,
    /// When that claim committed.
    since: Instant,
    /// How long the next claim may wait, past `wanted`, for `started`.
    linger: Duration,
}

/// The longest a claim waits for a full endpoint's last requests (see the module docs).
pub const MAX_LINGER: Duration = Duration::from_millis(20);

/// Whether a full endpoint is worth a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Worth {
    /// Not yet: too few of its requests have ended.
    No,
    /// Now.
    Now,
    /// Once this much longer has passed, unless its last requests end first.
    After(Duration),
}

impl Worth {
    /// Wakes the claiming loop now, or by the time given.
    pub fn wake(self, wakeup: &Wakeup) {
        match self {
            Worth::Now => wakeup.hint(),
            Worth::After(after) => wakeup.turn_after(after),
            Worth::No => {}
        }
    }

    /// The more pressing of two.
    fn or(self, other: Worth) -> Worth {
        match (self, other) {
            (Worth::Now, _) | (_, Worth::Now) => Worth::Now,
            (Worth::After(a), Worth::After(b)) => Worth::After(a.min(b)),
            (Worth::After(a), Worth::No) | (Worth::No, Worth::After(a)) => Worth::After(a),
            (Worth::No, Worth::No) => Worth::No,
        }
    }
}

impl Gather {
    /// Whether a claim is worth making at `now` (see the module docs).
    fn worth(&self, now: Instant) -> Worth {
        if self.ended < self.wanted {
            return Worth::No;
        }
        if self.ended_since >= self.started {
            // Every request the claim started has ended (or it started none).
            return Worth::Now;
        }
        match (self.since + self.linger).checked_duration_since(now) {
            Some(left) if !left.is_zero() => Worth::After(left),
            _ => Worth::Now,
        }
    }
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
    /// worth making: the endpoint had been left full and enough of its slots are free.
    pub fn ended(&self, delivery_id: Uuid, endpoint_id: Uuid) -> (EndedGuard, Worth) {
        let mut inner = self.lock();
        inner.awaiting.insert(delivery_id, endpoint_id);
        let worth = match inner.full.get_mut(&endpoint_id) {
            Some(gather) => {
                gather.ended += 1;
                gather.ended_since += 1;
                gather.worth(Instant::now())
            }
            None => Worth::No,
        };
        let guard = EndedGuard {
            requests: self.clone(),
            delivery_id,
        };
        (guard, worth)
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
    /// ever costs a claim.) The next claim may wait up to `linger` (the time this one took,
    /// [`MAX_LINGER`] at most) for every request this one started (see the module docs).
    /// Returns whether one of these endpoints is worth a claim already, or soon.
    pub fn visited(
        &self,
        endpoints: impl IntoIterator<Item = (Uuid, Option<(u32, u32)>)>,
        seen: &[Uuid],
        linger: Duration,
    ) -> Worth {
        let mut inner = self.lock();
        let now = Instant::now();
        let mut ready = Worth::No;
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
                    let gather = Gather {
                        wanted,
                        ended: u32::try_from(ended).unwrap_or(u32::MAX),
                        started,
                        ended_since: 0,
                        since: now,
                        linger: linger.min(MAX_LINGER),
                    };
                    ready = ready.or(gather.worth(now));
                    inner.full.insert(endpoint_id, gather);
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

    /// No wait past a quarter: the rule before the last requests are awaited.
    const NO_LINGER: Duration = Duration::ZERO;

    /// Longer than any test takes.
    const LONG: Duration = Duration::from_secs(3600);

    fn now(worth: Worth) -> bool {
        worth == Worth::Now
    }

    #[test]
    fn an_ended_request_is_left_out_until_its_outcome_is_recorded() {
        let requests = EndedRequests::default();
        let (endpoint, other) = (Uuid::now_v7(), Uuid::now_v7());
        requests.visited([(endpoint, Some((2, 2))), (other, None)], &[], NO_LINGER);
        let (first, worth) = requests.ended(Uuid::now_v7(), endpoint);
        assert!(now(worth), "a cap of 2: one free slot is worth a claim");
        let (second, worth) = requests.ended(Uuid::now_v7(), other);
        assert_eq!(worth, Worth::No);
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
        requests.visited([(endpoint, None)], &[], NO_LINGER);
        let (_third, worth) = requests.ended(Uuid::now_v7(), endpoint);
        assert_eq!(worth, Worth::No);
    }

    #[test]
    fn a_full_endpoint_is_worth_a_claim_once_a_quarter_of_its_slots_ended() {
        let requests = EndedRequests::default();
        let endpoint = Uuid::now_v7();
        requests.visited([(endpoint, Some((32, 32)))], &[], NO_LINGER);
        let (guards, hints): (Vec<EndedGuard>, Vec<Worth>) = (0..10)
            .map(|_| requests.ended(Uuid::now_v7(), endpoint))
            .unzip();
        drop(guards);
        assert_eq!(
            requests.snapshot().revisit,
            vec![endpoint],
            "recorded meanwhile, its room is still known until a claim looks"
        );
        assert_eq!(
            hints.iter().position(|h| now(*h)),
            Some(7),
            "the eighth of 32 asks: {hints:?}"
        );
        assert!(
            hints[8..].iter().all(|h| now(*h)),
            "and every one after, until a claim looks"
        );
        requests.visited([(endpoint, Some((32, 3)))], &[], NO_LINGER);
        assert!(!now(requests.ended(Uuid::now_v7(), endpoint).1));
        assert!(!now(requests.ended(Uuid::now_v7(), endpoint).1));
        assert!(
            now(requests.ended(Uuid::now_v7(), endpoint).1),
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
        assert_eq!(
            requests.visited([(endpoint, Some((32, 4)))], &seen, NO_LINGER),
            Worth::No,
            "three of the four awaited"
        );
        assert!(
            now(requests.ended(Uuid::now_v7(), endpoint).1),
            "the fourth asks for a claim"
        );
        assert!(
            now(requests.visited([(endpoint, Some((8, 8)))], &seen, NO_LINGER)),
            "a claim leaving two of eight awaited, with four ended since its snapshot, asks again at once"
        );
        drop((before, during));
    }

    #[test]
    fn past_a_quarter_a_claim_waits_for_the_last_claims_requests_but_no_longer_than_it_took() {
        let requests = EndedRequests::default();
        let endpoint = Uuid::now_v7();
        let seen = requests.snapshot().ended;
        // The claim before this one started 16, which ended while this one ran: a
        // quarter of 32 is free, but the 16 this claim started are still in flight.
        let earlier: Vec<EndedGuard> = (0..16)
            .map(|_| requests.ended(Uuid::now_v7(), endpoint).0)
            .collect();
        let worth = requests.visited([(endpoint, Some((32, 16)))], &seen, LONG);
        let Worth::After(wait) = worth else {
            panic!("a wait, not {worth:?}");
        };
        assert!(wait <= MAX_LINGER, "{wait:?}");
        let mut last = Worth::No;
        for n in 1..=16 {
            last = requests.ended(Uuid::now_v7(), endpoint).1;
            // (At once only if this test took longer than the wait.)
            assert_ne!(last, Worth::No, "{n} of 16 ended");
        }
        assert_eq!(last, Worth::Now, "all 16 ended: a full batch is free");
        drop(earlier);
    }

    #[test]
    fn the_wait_past_a_quarter_ends_when_the_linger_does() {
        let since = Instant::now();
        let gather = Gather {
            wanted: 8,
            ended: 8,
            started: 16,
            ended_since: 4,
            since,
            linger: Duration::from_millis(10),
        };
        assert_eq!(gather.worth(since), Worth::After(Duration::from_millis(10)));
        assert_eq!(
            gather.worth(since + Duration::from_millis(4)),
            Worth::After(Duration::from_millis(6))
        );
        assert_eq!(gather.worth(since + Duration::from_millis(10)), Worth::Now);
        let short = Gather { ended: 7, ..gather };
        assert_eq!(
            short.worth(since + Duration::from_secs(1)),
            Worth::No,
            "under a quarter, no wait ends in a claim"
        );
    }

    #[test]
    fn the_more_pressing_worth_wins() {
        let (soon, later) = (
            Worth::After(Duration::from_millis(1)),
            Worth::After(Duration::from_millis(2)),
        );
        assert_eq!(soon.or(later), soon);
        assert_eq!(later.or(Worth::No), later);
        assert_eq!(Worth::No.or(soon), soon);
        assert_eq!(soon.or(Worth::Now), Worth::Now);
        assert_eq!(Worth::No.or(Worth::No), Worth::No);
    }

    #[test]
    fn a_slow_receiver_is_not_waited_for_once_the_linger_has_passed() {
        let requests = EndedRequests::default();
        let endpoint = Uuid::now_v7();
        requests.visited([(endpoint, Some((32, 32)))], &[], Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        let worths: Vec<Worth> = (0..8)
            .map(|_| requests.ended(Uuid::now_v7(), endpoint).1)
            .collect();
        assert_eq!(worths[6], Worth::No, "seven of 32 is less than a quarter");
        assert_eq!(
            worths[7],
            Worth::Now,
            "a quarter, after the linger: at once"
        );
    }

    #[test]
    fn an_endpoint_full_without_a_request_of_this_claim_awaits_one() {
        let requests = EndedRequests::default();
        let endpoint = Uuid::now_v7();
        assert_eq!(
            requests.visited([(endpoint, Some((32, 0)))], &[], LONG),
            Worth::No,
            "nothing started, nothing ended: no claim"
        );
        assert_eq!(requests.ended(Uuid::now_v7(), endpoint).1, Worth::Now);
    }
}
