//! Holding back an endpoint that asked to wait (`429` or `503` with `Retry-After`), or never
//! to be called again (`410 Gone`), the moment its answer comes back, before the outcome is
//! recorded: no claim on any process starts another request to it in between (see
//! [`crate::service::flow::HOLD_TURN`]), and this process at once sends none of the claims
//! it already holds for it ([`HeldEndpoints`]): they are handed back unsent.

use std::time::Duration;

use sea_orm::ConnectionTrait as _;
use uuid::Uuid;

use super::claim::{release_in_background, Claim};
use super::endpoints_until::EndpointsUntil;
use super::Worker;
use crate::db::Db;
use crate::error::error_chain;
use crate::service::flow::{HOLD_TURN, MAX_PAUSE};

/// How long this process itself holds an endpoint back after an answer asked it to wait,
/// at most: long enough for the claims it made before the answer to have started or been
/// handed back, and for the database's hold to have committed, which holds it from then on
/// for every process. Kept short, because only the database learns when the wait is cut
/// short (an operator's disable and enable ends a pause).
pub const LOCAL_HOLD: Duration = Duration::from_secs(2);

/// The endpoints that asked this process to wait (or answered `410`), and until when, known
/// the moment the answer came back: a request claimed before that, and not yet started, is
/// not started; this process's claims leave the endpoint to the database's hold meanwhile.
#[derive(Debug, Default)]
pub struct HeldEndpoints(EndpointsUntil);

impl HeldEndpoints {
    /// Holds `endpoint_id` for `wait`, at most [`LOCAL_HOLD`]; a longer hold stands.
    pub fn hold(&self, endpoint_id: Uuid, wait: Duration) {
        self.0.keep(endpoint_id, wait.min(LOCAL_HOLD));
    }

    /// Whether `endpoint_id` is held now.
    pub fn holds(&self, endpoint_id: Uuid) -> bool {
        self.0.contains(endpoint_id)
    }

    /// The endpoints held now (forgetting those whose hold is over).
    pub fn snapshot(&self) -> Vec<Uuid> {
        self.0.snapshot()
    }
}

/// Holds `endpoint_id`'s turn back for `wait` (at most [`MAX_PAUSE`]). If that fails, the
/// recording of the outcome pauses (or disables) the endpoint all the same, a moment later.
pub(super) async fn hold_turn(db: &Db, endpoint_id: Uuid, wait: Duration) {
    let clock = db.clock();
    let hold = clock.statement(
        HOLD_TURN,
        [endpoint_id.into(), clock.after(wait.min(MAX_PAUSE))],
    );
    if let Err(err) = db.within_deadline(db.conn().execute_raw(hold)).await {
        tracing::warn!(%endpoint_id, error = %error_chain(&err),
            "holding back an endpoint that asked to wait failed; its recording pauses it");
    }
}

impl Worker {
    /// Hands `claim` back unsent (fenced by its token; pending again, and due once the
    /// endpoint's hold or pause is over): its endpoint asked to wait after it was made.
    pub(super) fn hand_back_held(&self, claim: Claim) {
        self.state.metrics.claims_held_back.inc();
        tracing::debug!(delivery_id = %claim.delivery_id, endpoint_id = %claim.endpoint_id,
            "the endpoint asked to wait after this claim was made: handed back unsent");
        release_in_background(
            self.state.db.clone(),
            self.state.bus.clone(),
            vec![claim],
            "their endpoint asked to wait",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_hold_lasts_no_longer_than_the_local_hold() {
        let held = HeldEndpoints::default();
        let endpoint = Uuid::now_v7();
        held.hold(endpoint, Duration::from_secs(3600));
        assert!(held.holds(endpoint));
        let until = held.0.until(endpoint).expect("held");
        assert!(
            until <= Instant::now() + LOCAL_HOLD,
            "no longer than the local hold"
        );
        assert_eq!(held.snapshot(), vec![endpoint]);
    }
}
