//! What claims at submit leave the worker (see [`crate::worker::handoff`]): the claim the
//! statement that stored a delivery made, or the endpoint it found full.

use entity::webhook_delivery::DeliveryState;
use sea_orm::{DbErr, QueryResult};
use uuid::Uuid;

use super::{claim_from, ClaimRequest, Claimed};

/// A claim the statement that stored its delivery made (see
/// [`crate::service::submissions::claiming`]): `row` holds the claimed row's columns, with
/// what to send; `full`, the endpoint's cap if the claim left it full (it is looked at again
/// when enough of its requests end, see [`crate::worker::ended`]).
pub(crate) fn claimed_in_store(
    row: QueryResult,
    full: Option<u32>,
    request: &ClaimRequest,
) -> Result<Claimed, DbErr> {
    let (claim, _) = claim_from(&row, DeliveryState::Pending)?;
    let mut claimed = at_submit(claim.endpoint_id, full.map(|cap| (cap, 1)), request);
    claimed.claims = vec![claim];
    claimed.rows = vec![row];
    Ok(claimed)
}

/// What a claim at submit that found `endpoint_id` full (at `cap`) leaves the worker: no
/// claim, and the endpoint to look at again once enough of its requests end (see
/// [`crate::worker::ended`]), as a claim that found it full leaves it.
pub(crate) fn left_full(endpoint_id: Uuid, cap: u32, request: &ClaimRequest) -> Claimed {
    at_submit(endpoint_id, Some((cap, 0)), request)
}

/// A claim at submit of `endpoint_id` under `request`, holding nothing yet, that visited
/// the endpoint (`full`: its cap and the requests started, if it left it full).
fn at_submit(endpoint_id: Uuid, full: Option<(u32, u32)>, request: &ClaimRequest) -> Claimed {
    let mut claimed = Claimed {
        seen: request.ended.ended.clone(),
        visited: vec![(endpoint_id, full)],
        ..Claimed::default()
    };
    claimed.follow_up.default_max_in_flight = request.default_max_in_flight;
    claimed
}
