//! Holding back an endpoint that asked to wait (`429` or `503` with `Retry-After`), or never
//! to be called again (`410 Gone`), the moment its answer comes back, before the outcome is
//! recorded: no claim on any process starts another request to it in between (see
//! [`crate::service::flow::HOLD_TURN`]).

use std::time::Duration;

use sea_orm::ConnectionTrait as _;
use uuid::Uuid;

use crate::db::Db;
use crate::error::error_chain;
use crate::service::flow::{HOLD_TURN, MAX_PAUSE};

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
