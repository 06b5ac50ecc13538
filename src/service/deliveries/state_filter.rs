//! How a statement says "in this state", so that a statement about some endpoints reads
//! the indexes that lead with the endpoint, never an index of one state across every
//! endpoint.

use entity::webhook_delivery::DeliveryState;
use sea_orm::ActiveEnum as _;

/// The condition "in `state`", written into the statement rather than bound, so that
/// even a generic plan can read the partial indexes of that state (the value is one of
/// four words).
///
/// Over every endpoint it is `state = 'failed'`. Over some endpoints (`for_endpoints`)
/// it is the same as a range, `state BETWEEN 'failed' AND 'failed'`: the indexes of one
/// state across every endpoint (every failure, the backlog) are written for `=` and cannot
/// serve it, while those that lead with the endpoint serve it (the endpoint's failures are
/// indexed in that very form). Otherwise a planner misjudging how many of an endpoint's
/// rows are in a state (it multiplies the endpoint's share by the state's, and one
/// receiver down for a day makes failures common) walks every endpoint's failures, newest
/// first, for one page of one endpoint.
pub fn in_state(state: DeliveryState, for_endpoints: bool) -> String {
    let state = state.to_value();
    if for_endpoints {
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
    }
}
