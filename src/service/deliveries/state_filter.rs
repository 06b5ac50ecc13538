//! How a statement says "in this state", so that a statement about some endpoints reads
//! the indexes that lead with the endpoint, never an index of one state across every
//! endpoint.

use entity::webhook_delivery::DeliveryState;
use sea_orm::ActiveEnum as _;

/// The condition "in `state`", written into the statement rather than bound, so that
/// even a generic plan can read the partial indexes of that state (the value is one of
/// four words).
///
/// It is `state = 'x'`, except for failures over some endpoints (`for_endpoints`): then
/// the same as a range, `state BETWEEN 'failed' AND 'failed'`. The failed indexes across
/// every endpoint are written for `=` and cannot serve it, while those that lead with the
/// endpoint serve it (they are indexed in that very form). Otherwise a planner misjudging
/// how many of an endpoint's rows failed (it multiplies the endpoint's share by the share
/// of failures, and one receiver down for a day makes failures common) walks every
/// endpoint's failures, newest first, for one page of one endpoint. Other states keep `=`:
/// the backlog's own indexes that lead with the endpoint (its due and in-flight rows) are
/// written for it.
pub fn in_state(state: DeliveryState, for_endpoints: bool) -> String {
    let range = for_endpoints && state == DeliveryState::Failed;
    let state = state.to_value();
    if range {
        format!("state BETWEEN '{state}' AND '{state}'")
    } else {
        format!("state = '{state}'")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_some_endpoints_the_state_is_a_range() {
        assert_eq!(in_state(DeliveryState::Failed, false), "state = 'failed'");
        assert_eq!(
            in_state(DeliveryState::Failed, true),
            "state BETWEEN 'failed' AND 'failed'"
        );
        assert_eq!(in_state(DeliveryState::Pending, true), "state = 'pending'");
    }
}
