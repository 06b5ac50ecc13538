//! Claims this process cannot sign: their endpoint's secret does not open with its
//! `COURIER_ENCRYPTION_KEY` (a process that does not know a newer key). They are handed back
//! at once, with no attempt recorded, for a process that holds the key, and this process's
//! claims leave their endpoints alone for a while.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::claim::{release_in_background, Claim};
use super::Worker;

/// How long this process leaves an endpoint whose secret it could not open to other
/// processes' claims. Its own claims look again after that (the key may have been rotated
/// in, or no process may hold it: the deliveries then wait, pending, and each look logs).
pub const LEAVE_ALONE: Duration = Duration::from_secs(30);

/// The endpoints whose secret this process could not open lately, and until when it
/// leaves them alone.
#[derive(Debug, Default)]
pub struct UnopenedEndpoints(Mutex<HashMap<Uuid, Instant>>);

impl UnopenedEndpoints {
    /// Leaves `endpoint_id` alone for [`LEAVE_ALONE`].
    pub fn remember(&self, endpoint_id: Uuid) {
        let mut until = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        until.insert(endpoint_id, Instant::now() + LEAVE_ALONE);
    }

    /// Whether `endpoint_id` is left alone now.
    pub fn contains(&self, endpoint_id: Uuid) -> bool {
        let until = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        until
            .get(&endpoint_id)
            .is_some_and(|until| *until > Instant::now())
    }

    /// The endpoints left alone now (forgetting those whose time is over).
    pub fn snapshot(&self) -> Vec<Uuid> {
        let mut until = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if until.is_empty() {
            return Vec::new();
        }
        let now = Instant::now();
        until.retain(|_, until| *until > now);
        until.keys().copied().collect()
    }
}

impl Worker {
    /// Hands `claims` back (fenced by their tokens; due at once, for another process's
    /// claims) and leaves their endpoints alone for a while: their secrets do not open here.
    pub(super) fn hand_back_unopened(&self, claims: Vec<Claim>) {
        if claims.is_empty() {
            return;
        }
        for claim in &claims {
            self.unopened.remember(claim.endpoint_id);
        }
        self.state
            .metrics
            .claims_unopened
            .inc_by(claims.len() as u64);
        release_in_background(
            self.state.db.clone(),
            self.state.bus.clone(),
            claims,
            "their endpoint's secret did not open with this process's key",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_left_alone_only_for_a_while() {
        let unopened = UnopenedEndpoints::default();
        let (kept, expired) = (Uuid::new_v4(), Uuid::new_v4());
        unopened.remember(kept);
        unopened.remember(expired);
        // As if remembered longer ago than LEAVE_ALONE.
        unopened
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(expired, Instant::now() - Duration::from_millis(1));
        assert!(unopened.contains(kept));
        assert!(!unopened.contains(expired));
        assert_eq!(unopened.snapshot(), vec![kept]);
        assert!(!unopened.contains(Uuid::new_v4()));
    }
}
