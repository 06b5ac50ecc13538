//! The shares as one claim sees them: how much more each endpoint may start, and how one
//! claim's wants are cut so that endpoints together stay within their shares.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use uuid::Uuid;

use super::Shares;

/// The shares as one claim sees them.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The most the heavy endpoints may hold together (0: no limit, a claim outside the
    /// worker).
    pub most: u32,
    /// From how many requests on an endpoint is heavy.
    pub light_below: u32,
    /// The most the endpoints not trusted may hold together.
    pub untrusted_most: u32,
    /// What the heavy endpoints hold together.
    pub heavy: u32,
    /// What the endpoints not trusted hold together.
    pub untrusted: u32,
    /// What each endpoint holding something holds.
    pub held: HashMap<Uuid, u32>,
    /// The endpoints known to be slow: heavy whatever they hold.
    pub slow: HashSet<Uuid>,
    /// The endpoints waiting for heavy room (see [`Shares::waiting`]).
    pub waiting: HashSet<Uuid>,
    /// The endpoints contending for the heavy share: the heavy ones holding some of it, and
    /// those waiting for it.
    pub contenders: HashSet<Uuid>,
    /// Where whether an endpoint is trusted is read (as it is when asked: it changes only
    /// as requests end). `None`: every endpoint is (a claim outside the worker).
    pub(super) trust: Option<Arc<Shares>>,
}

impl Snapshot {
    fn held_by(&self, endpoint_id: Uuid) -> u32 {
        self.held.get(&endpoint_id).copied().unwrap_or(0)
    }

    /// Whether `endpoint_id` counts among the heavy endpoints as it stands.
    fn is_heavy(&self, endpoint_id: Uuid) -> bool {
        self.held_by(endpoint_id) >= self.light_below || self.slow.contains(&endpoint_id)
    }

    /// Whether `endpoint_id`'s last request ended quickly: outside the untrusted share.
    fn is_trusted(&self, endpoint_id: Uuid) -> bool {
        self.trust
            .as_ref()
            .is_none_or(|shares| shares.trusts(endpoint_id))
    }

    /// What the endpoints not trusted may still start together.
    fn untrusted_room(&self) -> u32 {
        self.untrusted_most.saturating_sub(self.untrusted)
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
    /// left (it then counts its whole holding among them); and if it is not trusted, no
    /// more than the untrusted endpoints together have left.
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
        let trusted = self.is_trusted(endpoint_id);
        // An untrusted endpoint (a slow or a new one) takes heavy room only while the
        // untrusted hold less than the heavy share: what endpoints took while light, before
        // they were known slow, counts against it too.
        let others = if trusted {
            heavy_others
        } else {
            heavy_others.max(self.untrusted.saturating_sub(held))
        };
        let heavy_room = self
            .most
            .saturating_sub(others)
            .saturating_sub(held)
            .min(self.even_room(endpoint_id));
        let room = self.light_room(endpoint_id).max(heavy_room);
        if trusted {
            room
        } else {
            room.min(self.untrusted_room())
        }
    }

    /// While another endpoint waits for heavy room, how many more `endpoint_id` may hold
    /// of an even split of the heavy share among its contenders (itself included; never
    /// less than an endpoint holds while light): an endpoint over it takes nothing more, so
    /// the room its requests free as they end goes to those waiting. Unbounded while no
    /// other endpoint waits.
    fn even_room(&self, endpoint_id: Uuid) -> u32 {
        if !self.waiting.iter().any(|id| *id != endpoint_id) {
            return u32::MAX;
        }
        let contenders =
            self.contenders.len() + usize::from(!self.contenders.contains(&endpoint_id));
        let contenders = u32::try_from(contenders).unwrap_or(u32::MAX).max(1);
        let even = (self.most / contenders).max(self.light_below);
        even.saturating_sub(self.held_by(endpoint_id))
    }

    /// Cuts `wants` (of the endpoints `endpoints`, in turn order) so that what the claim
    /// gives the heavy endpoints, with what they hold, stays within their share together,
    /// and likewise for the endpoints not trusted: each endpoint's [`Snapshot::room`]
    /// alone would let two of them take the same room.
    pub fn fit(&self, endpoints: &[Uuid], wants: &mut [u32]) {
        if self.most == 0 {
            return;
        }
        let mut heavy_left = self.most.saturating_sub(self.heavy);
        let mut untrusted_left = self.untrusted_room();
        for (endpoint_id, want) in endpoints.iter().zip(wants.iter_mut()) {
            if self.is_trusted(*endpoint_id) {
                self.fit_heavy(*endpoint_id, want, &mut heavy_left);
                continue;
            }
            *want = (*want).min(untrusted_left);
            // Heavy room, for an untrusted endpoint, also within what leaves the untrusted
            // no more than the heavy share (see [`Snapshot::room`]).
            let beyond_heavy = self.untrusted_most.saturating_sub(self.most);
            let mut left = heavy_left.min(untrusted_left.saturating_sub(beyond_heavy));
            let before = left;
            self.fit_heavy(*endpoint_id, want, &mut left);
            heavy_left -= before - left;
            untrusted_left -= *want;
        }
    }

    /// Cuts `want` of `endpoint_id` to what the heavy endpoints have `left` if it is heavy
    /// or would be after this claim, and takes it from there.
    fn fit_heavy(&self, endpoint_id: Uuid, want: &mut u32, left: &mut u32) {
        if self.is_heavy(endpoint_id) {
            *want = (*want).min(*left);
            *left -= *want;
            return;
        }
        let held = self.held_by(endpoint_id);
        let light_room = self.light_room(endpoint_id);
        if *want <= light_room {
            return;
        }
        // Heavy after this claim: its whole holding counts.
        let heavy_take = (*want).min(left.saturating_sub(held));
        if heavy_take > light_room {
            *want = heavy_take;
            *left -= held + heavy_take;
        } else {
            *want = light_room;
        }
    }

    /// Notes the endpoints that `wants` leaves waiting for room: those among `endpoints` (in
    /// turn order) given less than they could take (`could`: their wants with no room
    /// counted) that still have work they could start (`due_left`: due, and under their
    /// own cap).
    pub fn note_waiting(
        &self,
        endpoints: &[Uuid],
        wants: &[u32],
        could: &[u32],
        due_left: impl Fn(Uuid) -> bool,
    ) {
        let Some(shares) = &self.trust else {
            return;
        };
        let waiting: Vec<Uuid> = endpoints
            .iter()
            .zip(wants.iter().zip(could))
            .filter(|(id, (want, could))| want < could && due_left(**id))
            .map(|(id, _)| *id)
            .collect();
        shares.waiting(&waiting);
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

    /// When the endpoints not trusted may start nothing more, the trusted ones: a claim
    /// looks at their turns only (every other endpoint, known or new, is full). `None`
    /// while the untrusted have room.
    pub fn only_trusted(&self) -> Option<Vec<Uuid>> {
        let shares = self.trust.as_ref()?;
        (self.most > 0 && self.untrusted_room() == 0).then(|| shares.trusted())
    }
}
