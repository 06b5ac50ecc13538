//! How many of this process's slots endpoints may hold, so that slow or hanging receivers
//! cannot take every slot while other endpoints wait: an eighth of the slots (from eight
//! slots on) is kept for endpoints that answer quickly and hold only a few requests. An
//! endpoint that is slow (a request of it ran [`SLOW_AFTER`] or longer, or runs that long
//! now) or holds more (together, `heavy`) counts against what all such endpoints may hold
//! together, all but that eighth: one hanging receiver with a `maxInFlight` of hundreds, or
//! any number of slow ones with small caps, leave the kept slots to the others. An
//! endpoint's cap still counts across processes, on the database; these shares count one
//! process's requests, in the process.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::bus::Wakeup;

/// A request that runs this long makes its endpoint slow, until one of its requests ends
/// sooner: a webhook receiver answers in well under a second.
pub const SLOW_AFTER: Duration = Duration::from_secs(1);

/// A slow endpoint not seen slow for this long is forgotten (it sent nothing meanwhile).
const FORGET_SLOW: Duration = Duration::from_secs(600);

/// The requests each endpoint has under way in this process, against the shares.
#[derive(Debug)]
pub struct Shares {
    most: u32,
    light_below: u32,
    slow_after: Duration,
    state: Mutex<State>,
    wakeup: Wakeup,
}

/// When each endpoint's requests under way started, and which endpoints are slow (since
/// when they were last seen so).
#[derive(Debug, Default)]
struct State {
    held: HashMap<Uuid, Vec<Instant>>,
    slow: HashMap<Uuid, Instant>,
}

impl State {
    /// Marks the endpoints with a request running `slow_after` or longer slow, and returns
    /// what each holds.
    fn counts(&mut self, slow_after: Duration) -> HashMap<Uuid, u32> {
        let now = Instant::now();
        let State { held, slow } = self;
        for (endpoint_id, started) in held.iter() {
            if started
                .iter()
                .any(|at| now.duration_since(*at) >= slow_after)
            {
                slow.insert(*endpoint_id, now);
            }
        }
        held.iter()
            .map(|(id, started)| (*id, u32::try_from(started.len()).unwrap_or(u32::MAX)))
            .collect()
    }

    /// Forgets the slow endpoints not seen slow for long.
    fn forget_old(&mut self) {
        let now = Instant::now();
        self.slow
            .retain(|_, seen| now.duration_since(*seen) < FORGET_SLOW);
    }
}

impl Shares {
    /// The shares of a process with `slots` slots: the heavy endpoints hold at most all but
    /// an eighth of them together (rounded down: with fewer than eight, all), and an
    /// endpoint is heavy when slow, or from a quarter of that eighth on (at least two
    /// requests). `wakeup` is poked when an endpoint that could take no more has room again.
    pub fn new(slots: usize, wakeup: Wakeup) -> Self {
        Self::slow_after(slots, wakeup, SLOW_AFTER)
    }

    /// [`Shares::new`], with requests making their endpoint slow after `slow_after`.
    pub fn slow_after(slots: usize, wakeup: Wakeup, slow_after: Duration) -> Self {
        let slots = u32::try_from(slots).unwrap_or(u32::MAX).max(1);
        let kept = slots / 8;
        Shares {
            most: slots - kept,
            light_below: (kept / 4).max(2),
            slow_after,
            state: Mutex::default(),
            wakeup,
        }
    }

    /// The most the heavy endpoints may hold together (and so one endpoint alone).
    pub fn most(&self) -> u32 {
        self.most
    }

    /// Counts a request to `endpoint_id` under way until the returned guard is dropped.
    pub fn started(self: &Arc<Self>, endpoint_id: Uuid) -> Held {
        let started = Instant::now();
        self.lock()
            .held
            .entry(endpoint_id)
            .or_default()
            .push(started);
        Held {
            shares: Arc::clone(self),
            endpoint_id,
            started,
        }
    }

    /// What each endpoint holds now (those holding nothing are left out), for one claim.
    pub fn snapshot(&self) -> Snapshot {
        let mut state = self.lock();
        state.forget_old();
        let held = state.counts(self.slow_after);
        let slow: HashSet<Uuid> = state.slow.keys().copied().collect();
        self.snapshot_from(held, slow)
    }

    /// What `endpoint_id` alone holds, and whether it is slow, with what the heavy
    /// endpoints hold together, for a claim of that endpoint only (a claim at submit).
    pub fn snapshot_of(&self, endpoint_id: Uuid) -> Snapshot {
        let mut state = self.lock();
        let counts = state.counts(self.slow_after);
        let slow = &state.slow;
        let heavy = counts
            .iter()
            .filter(|(id, held)| **held >= self.light_below || slow.contains_key(*id))
            .map(|(_, held)| *held)
            .sum();
        let held = counts.get(&endpoint_id).copied();
        Snapshot {
            most: self.most,
            light_below: self.light_below,
            heavy,
            held: held.map(|held| (endpoint_id, held)).into_iter().collect(),
            slow: slow
                .contains_key(&endpoint_id)
                .then_some(endpoint_id)
                .into_iter()
                .collect(),
        }
    }

    fn snapshot_from(&self, held: HashMap<Uuid, u32>, slow: HashSet<Uuid>) -> Snapshot {
        let mut snapshot = Snapshot {
            most: self.most,
            light_below: self.light_below,
            heavy: 0,
            held,
            slow,
        };
        snapshot.heavy = snapshot
            .held
            .iter()
            .filter(|(id, _)| snapshot.is_heavy(**id))
            .map(|(_, held)| *held)
            .sum();
        snapshot
    }

    /// Whether `endpoint_id` may start nothing more now.
    pub fn is_full(&self, endpoint_id: Uuid) -> bool {
        self.snapshot_of(endpoint_id).room(endpoint_id) == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request to `endpoint_id` that began at `started` ended.
    fn ended(&self, endpoint_id: Uuid, started: Instant) {
        let held_back = {
            let mut state = self.lock();
            let heavy = |state: &State, id: &Uuid, running: usize| {
                running >= self.light_below as usize || state.slow.contains_key(id)
            };
            let was_heavy = state
                .held
                .get(&endpoint_id)
                .is_some_and(|running| heavy(&state, &endpoint_id, running.len()));
            let heavy_before: usize = state
                .held
                .iter()
                .filter(|(id, running)| heavy(&state, id, running.len()))
                .map(|(_, running)| running.len())
                .sum();
            let Some(running) = state.held.get_mut(&endpoint_id) else {
                return;
            };
            if let Some(at) = running.iter().position(|at| *at == started) {
                running.swap_remove(at);
            }
            if running.is_empty() {
                state.held.remove(&endpoint_id);
            }
            // The last answer decides whether the endpoint is slow.
            if started.elapsed() >= self.slow_after {
                state.slow.insert(endpoint_id, Instant::now());
            } else {
                state.slow.remove(&endpoint_id);
            }
            // A heavy endpoint's request ending frees room for every heavy endpoint.
            was_heavy && heavy_before >= self.most as usize
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
    started: Instant,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shares.ended(self.endpoint_id, self.started);
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
    /// The endpoints known to be slow: heavy whatever they hold.
    pub slow: HashSet<Uuid>,
}

impl Snapshot {
    fn held_by(&self, endpoint_id: Uuid) -> u32 {
        self.held.get(&endpoint_id).copied().unwrap_or(0)
    }

    /// Whether `endpoint_id` counts among the heavy endpoints as it stands.
    fn is_heavy(&self, endpoint_id: Uuid) -> bool {
        self.held_by(endpoint_id) >= self.light_below || self.slow.contains(&endpoint_id)
    }

    /// What `endpoint_id` may start while light (nothing once heavy).
    fn light_room(&self, endpoint_id: Uuid) -> u32 {
        if self.is_heavy(endpoint_id) {
            0
        } else {
            self.light_below - 1 - self.held_by(endpoint_id)
        }
    }

    /// How many more requests `endpoint_id` may start in this process: while light, up to
    /// the heavy threshold; beyond, or when slow, what the heavy endpoints together have
    /// left (it then counts its whole holding among them).
    pub fn room(&self, endpoint_id: Uuid) -> u32 {
        if self.most == 0 {
            return u32::MAX;
        }
        let held = self.held_by(endpoint_id);
        let heavy_others = if self.is_heavy(endpoint_id) {
            self.heavy.saturating_sub(held)
        } else {
            self.heavy
        };
        let heavy_room = self.most.saturating_sub(heavy_others).saturating_sub(held);
        self.light_room(endpoint_id).max(heavy_room)
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
            if self.is_heavy(*endpoint_id) {
                *want = (*want).min(left);
                left -= *want;
                continue;
            }
            let held = self.held_by(*endpoint_id);
            let light_room = self.light_room(*endpoint_id);
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
            .chain(self.slow.iter())
            .filter(|id| self.most > 0 && self.room(**id) == 0)
            .copied()
            .collect();
        full.sort();
        full.dedup();
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
    fn slow_endpoints_are_heavy_whatever_they_hold() {
        // 32 slots: 28 for the heavy, 4 kept. Each of thirty endpoints holds one request,
        // which counts as light until it has run long enough to make its endpoint slow.
        let slow_after = Duration::from_millis(20);
        let shares = Arc::new(Shares::slow_after(32, Wakeup::default(), slow_after));
        let hanging: Vec<Uuid> = (0..30).map(|_| Uuid::now_v7()).collect();
        let mut held: Vec<Held> = hanging.iter().map(|id| shares.started(*id)).collect();
        let fast = Uuid::now_v7();
        assert_eq!(shares.snapshot().heavy, 0, "light while young");
        std::thread::sleep(slow_after * 2);
        let snapshot = shares.snapshot();
        assert_eq!(snapshot.heavy, 30, "slow now: all heavy");
        assert_eq!(snapshot.room(hanging[0]), 0);
        assert_eq!(snapshot.full().len(), 30);
        assert_eq!(
            snapshot.room(fast),
            1,
            "a quick endpoint still has the kept slots"
        );
        // Ended slowly, they stay slow with nothing under way: no room while the heavy are
        // over their share, and no light room ever.
        held.truncate(28);
        let snapshot = shares.snapshot();
        assert_eq!(snapshot.heavy, 28);
        assert_eq!(snapshot.room(hanging[29]), 0);
        held.truncate(27);
        assert_eq!(shares.snapshot().room(hanging[29]), 1);
        let mut wants = vec![1, 1, 3];
        shares
            .snapshot()
            .fit(&[hanging[28], hanging[29], fast], &mut wants);
        assert_eq!(
            wants,
            vec![1, 0, 1],
            "one heavy room; the quick one stays light"
        );
        // A request that ends quickly makes its endpoint light again.
        let quick = shares.started(hanging[29]);
        drop(quick);
        assert!(!shares.snapshot().slow.contains(&hanging[29]));
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
