//! Claims this process cannot sign: their endpoint's secret does not open with its
//! `COURIER_ENCRYPTION_KEY` (a process that does not know a newer key). They are handed back
//! at once, with no attempt recorded, for a process that holds the key, and this process's
//! claims leave their endpoints alone for a while.

use std::time::Duration;

use uuid::Uuid;

use super::claim::{release_in_background, Claim};
use super::endpoints_until::EndpointsUntil;
use super::Worker;

/// How long this process leaves an endpoint whose secret it could not open to other
/// processes' claims. Its own claims look again after that (the key may have been rotated
/// in, or no process may hold it: the deliveries then wait, pending, and each look logs).
pub const LEAVE_ALONE: Duration = Duration::from_secs(30);

/// The endpoints whose secret this process could not open lately, and until when it
/// leaves them alone.
#[derive(Debug, Default)]
pub struct UnopenedEndpoints(EndpointsUntil);

impl UnopenedEndpoints {
    /// Leaves `endpoint_id` alone for [`LEAVE_ALONE`].
    pub fn remember(&self, endpoint_id: Uuid) {
        self.0.keep(endpoint_id, LEAVE_ALONE);
    }

    /// Whether `endpoint_id` is left alone now.
    pub fn contains(&self, endpoint_id: Uuid) -> bool {
        self.0.contains(endpoint_id)
    }

    /// The endpoints left alone now (forgetting those whose time is over).
    pub fn snapshot(&self) -> Vec<Uuid> {
        self.0.snapshot()
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
    use std::time::Instant;

    #[test]
    fn an_endpoint_is_left_alone_for_a_while() {
        let unopened = UnopenedEndpoints::default();
        let endpoint = Uuid::now_v7();
        unopened.remember(endpoint);
        assert!(unopened.contains(endpoint));
        assert_eq!(unopened.snapshot(), vec![endpoint]);
        let until = unopened.0.until(endpoint).expect("kept");
        assert!(until <= Instant::now() + LEAVE_ALONE);
        assert!(!unopened.contains(Uuid::now_v7()));
    }
}
