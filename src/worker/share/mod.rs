//! How many of this process's slots endpoints may hold, so that slow or hanging receivers
//! cannot take every slot while other endpoints wait: an eighth of the slots (from eight
//! slots on) is kept for endpoints that answer quickly and hold only a few requests. An
//! endpoint that is slow (a request of it ran [`SLOW_AFTER`] or longer, or runs that long
//! now) or holds more (together, `heavy`) counts against what all such endpoints may hold
//! together, all but that eighth: one hanging receiver with a `maxInFlight` of hundreds, or
//! any number of slow ones with small caps, leave the kept slots to the others. An endpoint
//! is known to be slow only once a request has run that long, so new endpoints get the
//! benefit of the doubt; but endpoints not trusted (whose last request here did not end
//! quickly: new ones and slow ones) hold all but a quarter of that eighth at most
//! together, and take heavy room only while they hold less than the heavy share, so that
//! many new receivers that all turn out to hang cannot take the slots of the receivers
//! known to answer quickly. While an endpoint with due work waits for room in the heavy
//! share (it was given less than it could take, and has work left), the heavy share is
//! split evenly among the endpoints contending for it (holding it, or waiting), so that
//! receivers that hang, holding their slots for a whole request timeout, give their slots
//! up as their requests end rather than take them back turn after turn while a quick
//! endpoint's backlog waits. An endpoint's cap still counts across processes, on
//! the database; these shares count one process's requests, in the process.

mod snapshot;
#[cfg(test)]
mod tests;

pub use snapshot::Snapshot;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::bus::Wakeup;

/// A request that runs this long makes its endpoint slow, until one of its requests ends
/// sooner: a webhook receiver answers in well under a second.
pub const SLOW_AFTER: Duration = Duration::from_secs(1);

/// An endpoint not seen slow or quick for this long is forgotten (it sent nothing
/// meanwhile): it is new again.
const FORGET: Duration = Duration::from_secs(600);

/// The most trusted endpoints one claim names (see [`Shares::trusted`]).
const MOST_LISTED: usize = 1_000;

/// How often the endpoints seen long ago are looked for, to forget them.
const FORGET_EVERY: Duration = Duration::from_secs(10);

/// How long an endpoint counts as waiting for heavy room after a claim last left it work
/// for want of room (claims see a waiting endpoint again as soon as one of its own
/// requests ends, or the room it waits for frees).
const WAITING_FOR: Duration = Duration::from_secs(2);

/// The requests each endpoint has under way in this process, against the shares.
#[derive(Debug)]
pub struct Shares {
    most: u32,
    light_below: u32,
    untrusted_most: u32,
    slow_after: Duration,
    state: Mutex<State>,
    wakeup: Wakeup,
}

/// When each endpoint's requests under way started, the slots reserved for its claims at
/// submit not yet started, and which endpoints are slow or trusted (since when they were
/// last seen so); an endpoint is at most one of the two. And the endpoints waiting for
/// heavy room, since when a claim last left them work for want of it.
#[derive(Debug, Default)]
struct State {
    held: HashMap<Uuid, Vec<Instant>>,
    reserved: HashMap<Uuid, u32>,
    slow: HashMap<Uuid, Instant>,
    trusted: HashMap<Uuid, Instant>,
    waiting: HashMap<Uuid, Instant>,
    forgot_at: Option<Instant>,
}

/// What the requests under way add up to, as one claim sees them.
struct Tally {
    held: HashMap<Uuid, u32>,
    heavy: u32,
    untrusted: u32,
    waiting: HashSet<Uuid>,
    contenders: HashSet<Uuid>,
}

impl State {
    /// Marks the endpoints with a request running `slow_after` or longer slow (and no
    /// longer trusted).
    fn mark_slow(&mut self, slow_after: Duration) {
        let now = Instant::now();
        let State {
            held,
            slow,
            trusted,
            ..
        } = self;
        for (endpoint_id, started) in held.iter() {
            if started
                .iter()
                .any(|at| now.duration_since(*at) >= slow_after)
            {
                slow.insert(*endpoint_id, now);
                trusted.remove(endpoint_id);
            }
        }
    }

    /// What `endpoint_id` holds: its requests under way and its slots reserved.
    fn held_by(&self, endpoint_id: Uuid) -> u32 {
        let running = self.held.get(&endpoint_id).map_or(0, |started| {
            u32::try_from(started.len()).unwrap_or(u32::MAX)
        });
        running.saturating_add(self.reserved.get(&endpoint_id).copied().unwrap_or(0))
    }

    /// Every endpoint holding something, with what it holds.
    fn holdings(&self) -> impl Iterator<Item = (Uuid, u32)> + '_ {
        let reserved_only = self
            .reserved
            .keys()
            .filter(|id| !self.held.contains_key(*id));
        self.held
            .keys()
            .chain(reserved_only)
            .map(|id| (*id, self.held_by(*id)))
    }

    /// What each endpoint holds, what the heavy and the untrusted ones hold together, and
    /// who contends for the heavy share (its holders, and the endpoints waiting for it).
    fn tally(&mut self, light_below: u32) -> Tally {
        let (heavy, untrusted) = self.sums(light_below);
        let now = Instant::now();
        self.waiting
            .retain(|_, since| now.duration_since(*since) < WAITING_FOR);
        let waiting: HashSet<Uuid> = self.waiting.keys().copied().collect();
        let contenders = self
            .holdings()
            .filter(|(id, held)| *held >= light_below || self.slow.contains_key(id))
            .map(|(id, _)| id)
            .chain(waiting.iter().copied())
            .collect();
        Tally {
            held: self.holdings().collect(),
            heavy,
            untrusted,
            waiting,
            contenders,
        }
    }

    /// What the heavy endpoints, and the untrusted ones, hold together.
    fn sums(&self, light_below: u32) -> (u32, u32) {
        let (mut heavy, mut untrusted) = (0u32, 0u32);
        for (id, held) in self.holdings() {
            if held >= light_below || self.slow.contains_key(&id) {
                heavy = heavy.saturating_add(held);
            }
            if !self.trusted.contains_key(&id) {
                untrusted = untrusted.saturating_add(held);
            }
        }
        (heavy, untrusted)
    }

    /// Forgets the endpoints not seen slow or quick for long (looking now and then only).
    fn forget_old(&mut self) {
        let now = Instant::now();
        if self
            .forgot_at
            .is_some_and(|at| now.duration_since(at) < FORGET_EVERY)
        {
            return;
        }
        self.forgot_at = Some(now);
        self.slow
            .retain(|_, seen| now.duration_since(*seen) < FORGET);
        self.trusted
            .retain(|_, seen| now.duration_since(*seen) < FORGET);
    }
}

impl Shares {
    /// The shares of a process with `slots` slots: the heavy endpoints hold at most all but
    /// an eighth of them together (rounded down: with fewer than eight, all), and an
    /// endpoint is heavy when slow, or from a quarter of that eighth on (at least two
    /// requests); endpoints not trusted hold at most all but a quarter of the eighth
    /// together.
    /// `wakeup` is poked when an endpoint that could take no more has room again.
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
            untrusted_most: slots - kept / 4,
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

    /// Counts a slot reserved for a claim at submit of `endpoint_id` as held by it until
    /// the returned guard is dropped (once the claim's request has started, or nothing was
    /// claimed): so that the next submission's claim, or the claiming loop's, sees it
    /// while the claim is stored and its delivery read.
    pub fn reserved(self: &Arc<Self>, endpoint_id: Uuid) -> Reserved {
        *self.lock().reserved.entry(endpoint_id).or_default() += 1;
        Reserved {
            shares: Arc::clone(self),
            endpoint_id,
        }
    }

    /// What each endpoint holds now (those holding nothing are left out), for one claim.
    pub fn snapshot(self: &Arc<Self>) -> Snapshot {
        let mut state = self.lock();
        state.forget_old();
        state.mark_slow(self.slow_after);
        let tally = state.tally(self.light_below);
        let slow: HashSet<Uuid> = state.slow.keys().copied().collect();
        drop(state);
        self.snapshot_from(tally, slow)
    }

    /// What `endpoint_id` alone holds, and whether it is slow, with what the heavy and the
    /// untrusted endpoints hold together, for a claim of that endpoint only (a claim at
    /// submit).
    pub fn snapshot_of(self: &Arc<Self>, endpoint_id: Uuid) -> Snapshot {
        let mut state = self.lock();
        state.mark_slow(self.slow_after);
        let mut tally = state.tally(self.light_below);
        let slow: HashSet<Uuid> = state
            .slow
            .contains_key(&endpoint_id)
            .then_some(endpoint_id)
            .into_iter()
            .collect();
        drop(state);
        let held = tally.held.remove(&endpoint_id);
        tally.held = held.map(|held| (endpoint_id, held)).into_iter().collect();
        self.snapshot_from(tally, slow)
    }

    fn snapshot_from(self: &Arc<Self>, tally: Tally, slow: HashSet<Uuid>) -> Snapshot {
        Snapshot {
            most: self.most,
            light_below: self.light_below,
            untrusted_most: self.untrusted_most,
            heavy: tally.heavy,
            untrusted: tally.untrusted,
            held: tally.held,
            slow,
            waiting: tally.waiting,
            contenders: tally.contenders,
            trust: Some(Arc::clone(self)),
        }
    }

    /// Notes that a claim left `endpoints` work they could have started but for their room
    /// in the shares: for a while, the heavy share is split among its contenders.
    pub fn waiting(&self, endpoints: &[Uuid]) {
        if endpoints.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut state = self.lock();
        for endpoint_id in endpoints {
            state.waiting.insert(*endpoint_id, now);
        }
    }

    /// Whether `endpoint_id`'s last request here ended quickly (and none runs long now).
    pub(super) fn trusts(&self, endpoint_id: Uuid) -> bool {
        self.lock().trusted.contains_key(&endpoint_id)
    }

    /// The endpoints trusted now: the [`MOST_LISTED`] seen most recently, when there are
    /// more (a claim names them in its statement).
    pub(super) fn trusted(&self) -> Vec<Uuid> {
        let state = self.lock();
        let mut trusted: Vec<(Instant, Uuid)> = state
            .trusted
            .iter()
            .map(|(id, seen)| (*seen, *id))
            .collect();
        drop(state);
        if trusted.len() > MOST_LISTED {
            trusted.select_nth_unstable_by(MOST_LISTED, |a, b| b.0.cmp(&a.0));
            trusted.truncate(MOST_LISTED);
        }
        trusted.into_iter().map(|(_, id)| id).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request to `endpoint_id` that began at `started` ended.
    fn ended(&self, endpoint_id: Uuid, started: Instant) {
        let held_back = {
            let mut state = self.lock();
            let (heavy_before, untrusted_before) = state.sums(self.light_below);
            let held_before = state.held_by(endpoint_id);
            let was_heavy =
                held_before >= self.light_below || state.slow.contains_key(&endpoint_id);
            // A light endpoint holding all a light one may, beside a full heavy share, had
            // no room: this end gives it a slot back.
            let was_light_and_full =
                !was_heavy && held_before + 1 >= self.light_below && heavy_before >= self.most;
            let was_untrusted = !state.trusted.contains_key(&endpoint_id);
            let Some(running) = state.held.get_mut(&endpoint_id) else {
                return;
            };
            if let Some(at) = running.iter().position(|at| *at == started) {
                running.swap_remove(at);
            }
            if running.is_empty() {
                state.held.remove(&endpoint_id);
            }
            // The last answer decides whether the endpoint is slow or trusted.
            let now = Instant::now();
            if now.duration_since(started) >= self.slow_after {
                state.slow.insert(endpoint_id, now);
                state.trusted.remove(&endpoint_id);
            } else {
                state.slow.remove(&endpoint_id);
                state.trusted.insert(endpoint_id, now);
            }
            // A heavy endpoint's request ending frees room for every heavy endpoint, an
            // untrusted one's for every untrusted one, and a light one's at its limit for
            // itself.
            (was_heavy && heavy_before >= self.most)
                || (was_untrusted && untrusted_before >= self.most)
                || was_light_and_full
        };
        if held_back {
            // Endpoints left to other processes' claims for want of room may be taken again.
            self.wakeup.hint();
        }
    }
}

/// A slot reserved for a claim at submit, counted in its endpoint's share until dropped.
#[derive(Debug)]
pub struct Reserved {
    shares: Arc<Shares>,
    endpoint_id: Uuid,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let mut state = self.shares.lock();
        if let Some(reserved) = state.reserved.get_mut(&self.endpoint_id) {
            *reserved -= 1;
            if *reserved == 0 {
                state.reserved.remove(&self.endpoint_id);
            }
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
