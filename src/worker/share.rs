//! How many of this process's slots endpoints may hold, so that slow or hanging receivers
//! cannot take every slot while other endpoints wait: an eighth of the slots (from eight
//! slots on) is kept for endpoints holding only a few requests. An endpoint holding more
//! (`heavy`) counts against what all such endpoints may hold together, all but that eighth:
//! one hanging receiver with a `maxInFlight` of hundreds, or several with smaller caps,
//! leave the kept slots to the others. An endpoint's cap still counts across processes, on
//! the database; these shares count one process's requests, in the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use uuid::Uuid;

use crate::bus::Wakeup;

/// The requests each endpoint has under way in this process, against the shares.
#[derive(Debug)]
pub struct Shares {
    most: u32,
    light_below: u32,
    held: Mutex<HashMap<Uuid, u32>>,
    wakeup: Wakeup,
}

impl Shares {
    /// The shares of a process with `slots` slots: the heavy endpoints hold at most all but
    /// an eighth of them together (rounded down: with fewer than eight, all), and an
    /// endpoint is heavy from a quarter of that eighth on (at least two requests).
    /// `wakeup` is poked when an endpoint that could take no more has room again.
    pub fn new(slots: usize, wakeup: Wakeup) -> Self {
        let slots = u32::try_from(slots).unwrap_or(u32::MAX).max(1);
        let kept = slots / 8;
        Shares {
            most: slots - kept,
            light_below: (kept / 4).max(2),
            held: Mutex::new(HashMap::new()),
            wakeup,
        }
    }

    /// The most the heavy endpoints may hold together (and so one endpoint alone).
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
        let held = self.lock().clone();
        let heavy = self.heavy_total(&held);
        Snapshot {
            most: self.most,
            light_below: self.light_below,
            heavy,
            held,
        }
    }

    /// What `endpoint_id` alone holds, with what the heavy endpoints hold together, for a
    /// claim of that endpoint only (a claim at submit).
    pub fn snapshot_of(&self, endpoint_id: Uuid) -> Snapshot {
        let all = self.lock();
        let held = all.get(&endpoint_id).copied();
        Snapshot {
            most: self.most,
            light_below: self.light_below,
            heavy: self.heavy_total(&all),
            held: held.map(|held| (endpoint_id, held)).into_iter().collect(),
        }
    }

    /// Whether `endpoint_id` may start nothing more now.
    pub fn is_full(&self, endpoint_id: Uuid) -> bool {
        self.snapshot_of(endpoint_id).room(endpoint_id) == 0
    }

    fn heavy_total(&self, held: &HashMap<Uuid, u32>) -> u32 {
        held.values()
            .filter(|held| **held >= self.light_below)
            .sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, u32>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request to `endpoint_id` ended.
    fn ended(&self, endpoint_id: Uuid) {
        let held_back = {
            let mut held = self.lock();
            let heavy = self.heavy_total(&held);
            let Some(count) = held.get_mut(&endpoint_id) else {
                return;
            };
            // A heavy endpoint's request ending frees room for every heavy endpoint.
            let held_back = *count >= self.light_below && heavy >= self.most;
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&endpoint_id);
            }
            held_back
        };
        if held_back {
            // Endpoints left to other processes' claims for want of room may be taken again.
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
    /// The most the heavy endpoints may hold together (0: no limit, a claim outside the
    /// worker).
    pub most: u32,
    /// From how many requests on an endpoint is heavy.
    pub light_below: u32,
    /// What the heavy endpoints hold together.
    pub heavy: u32,
    /// What each endpoint holding something holds.
    pub held: HashMap<Uuid, u32>,
}

impl Snapshot {
    fn held_by(&self, endpoint_id: Uuid) -> u32 {
        self.held.get(&endpoint_id).copied().unwrap_or(0)
    }

    /// How many more requests `endpoint_id` may start in this process: while light, up to
    /// the heavy threshold; beyond, what the heavy endpoints together have left (it then
    /// counts its whole holding among them).
    pub fn room(&self, endpoint_id: Uuid) -> u32 {
        if self.most == 0 {
            return u32::MAX;
        }
        let held = self.held_by(endpoint_id);
        let (light_room, heavy_others) = if held >= self.light_below {
            (0, self.heavy.saturating_sub(held))
        } else {
            (self.light_below - 1 - held, self.heavy)
        };
        let heavy_room = self.most.saturating_sub(heavy_others).saturating_sub(held);
        light_room.max(heavy_room)
    }

    /// Cuts `wants` (of the endpoints `endpoints`, in turn order) so that what the claim
    /// gives the heavy endpoints, with what they hold, stays within their share together:
    /// each endpoint's [`Snapshot::room`] alone would let two of them take the same room.
    pub fn fit(&self, endpoints: &[Uuid], wants: &mut [u32]) {
        if self.most == 0 {
            return;
        }
        let mut left = self.most.saturating_sub(self.heavy);
        for (endpoint_id, want) in endpoints.iter().zip(wants.iter_mut()) {
            let held = self.held_by(*endpoint_id);
            if held >= self.light_below {
                *want = (*want).min(left);
                left -= *want;
                continue;
            }
            let light_room = self.light_below - 1 - held;
            if *want <= light_room {
                continue;
            }
            // Heavy after this claim: its whole holding counts.
            let heavy_take = (*want).min(left.saturating_sub(held));
            if heavy_take > light_room {
                *want = heavy_take;
                left -= held + heavy_take;
            } else {
                *want = light_room;
            }
        }
    }

    /// The endpoints that may start nothing more: a claim leaves their turns to other
    /// processes.
    pub fn full(&self) -> Vec<Uuid> {
        let mut full: Vec<Uuid> = self
            .held
            .keys()
            .filter(|id| self.most > 0 && self.room(**id) == 0)
            .copied()
            .collect();
        full.sort();
        full
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eighth_of_the_slots_is_kept_for_light_endpoints() {
        for (slots, most, light_below) in [
            (1, 1, 2),
            (2, 2, 2),
            (7, 7, 2),
            (8, 7, 2),
            (16, 14, 2),
            (32, 28, 2),
            (128, 112, 4),
        ] {
            let shares = Shares::new(slots, Wakeup::default());
            assert_eq!(
                (shares.most(), shares.light_below),
                (most, light_below),
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
        // Holding the kept slot, it would be heavy with a second request: no room.
        assert!(shares.is_full(other));
        let snapshot = shares.snapshot();
        let mut both = vec![hog, other];
        both.sort();
        assert_eq!(snapshot.full(), both);
        assert_eq!(snapshot.room(hog), 0);
        assert_eq!(
            snapshot.room(Uuid::now_v7()),
            1,
            "a new endpoint: the kept slot"
        );
        assert_eq!(shares.snapshot_of(hog).room(hog), 0);
        assert_eq!(shares.snapshot_of(hog).held.len(), 1);
        held.pop();
        assert!(!shares.is_full(hog));
        assert_eq!(shares.snapshot().room(hog), 1);
        held.clear();
        assert!(!shares.snapshot().held.contains_key(&hog));
        assert_eq!(shares.snapshot().room(other), 6);
    }

    #[test]
    fn several_heavy_endpoints_share_what_one_may_hold() {
        // 32 slots: the heavy endpoints hold 28 at most together, light ones hold 1.
        let shares = Arc::new(Shares::new(32, Wakeup::default()));
        let (slow, hanging, fast) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let _slow: Vec<Held> = (0..16).map(|_| shares.started(slow)).collect();
        let mut hung: Vec<Held> = (0..12).map(|_| shares.started(hanging)).collect();
        let snapshot = shares.snapshot();
        assert_eq!(snapshot.heavy, 28);
        assert_eq!(snapshot.room(slow), 0);
        assert_eq!(snapshot.room(hanging), 0);
        assert_eq!(snapshot.room(fast), 1, "the kept slots stay for the others");
        let mut both = vec![slow, hanging];
        both.sort();
        assert_eq!(snapshot.full(), both);
        hung.pop();
        assert_eq!(shares.snapshot().room(slow), 1);
        assert_eq!(shares.snapshot().room(hanging), 1);
    }

    #[test]
    fn one_claim_gives_the_heavy_endpoints_no_more_than_their_share_together() {
        let shares = Arc::new(Shares::new(32, Wakeup::default()));
        let (a, b, c, d) = (
            Uuid::now_v7(),
            Uuid::now_v7(),
            Uuid::now_v7(),
            Uuid::now_v7(),
        );
        let _a: Vec<Held> = (0..10).map(|_| shares.started(a)).collect();
        let _c = shares.started(c);
        let snapshot = shares.snapshot();
        // 18 left to the heavy: a takes 8 of them, b (new) becomes heavy with the other 10,
        // c holding one can go heavy only with room left (none), d stays light with one.
        let mut wants = vec![8, 16, 5, 1];
        snapshot.fit(&[a, b, c, d], &mut wants);
        assert_eq!(wants, vec![8, 10, 0, 1]);
        // Room alone would have let both take it.
        assert_eq!((snapshot.room(a), snapshot.room(b)), (18, 18));
    }

    #[test]
    fn a_claim_outside_the_worker_has_no_share_to_keep() {
        let snapshot = Snapshot::default();
        assert_eq!(snapshot.room(Uuid::now_v7()), u32::MAX);
        assert!(snapshot.full().is_empty());
        let mut wants = vec![64];
        snapshot.fit(&[Uuid::now_v7()], &mut wants);
        assert_eq!(wants, vec![64]);
    }
}
