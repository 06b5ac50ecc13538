//! When a delivery is due and when it is a request in flight, one rule in one place: a
//! delivery's `next_attempt_at` is its due time while it waits (`pending`) and its lease
//! while it is claimed (`processing`), so a `processing` row whose lease has run out is due
//! again (retaken), and one whose lease runs is in flight. Statements ask with tokens that
//! [`super::Clock`] renders with its `{now}`:
//! - `{due(X)}`: the delivery row `X` (a table name or alias) is due now;
//! - `{in_flight(X)}`: `X` is a request in flight now.
//!
//! The partial indexes the claims read (`state IN ('pending', 'processing')`, `state =
//! 'processing'`) are matched by these same predicates.

/// The SQL of the token `name(row)`, if it is one of this rule's, with `now` as the
/// statement's time.
pub(super) fn expand(name: &str, row: &str, now: &str) -> Option<String> {
    match name {
        "due" => Some(format!(
            "{row}.state IN ('pending', 'processing') AND {row}.next_attempt_at <= {now}"
        )),
        "in_flight" => Some(format!(
            "{row}.state = 'processing' AND {row}.next_attempt_at > {now}"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_is_waiting_or_a_lease_run_out_and_in_flight_a_lease_running() {
        assert_eq!(
            expand("due", "d", "NOW").as_deref(),
            Some("d.state IN ('pending', 'processing') AND d.next_attempt_at <= NOW")
        );
        assert_eq!(
            expand("in_flight", "p", "NOW").as_deref(),
            Some("p.state = 'processing' AND p.next_attempt_at > NOW")
        );
        assert_eq!(expand("parked", "d", "NOW"), None);
    }
}
