//! The statements that record attempts: the delivery locks, the lookup of attempts an
//! earlier try of a batch already wrote, the fenced transitions and the attempt rows.

/// Locks the deliveries (in id order, so concurrent recorders cannot deadlock): recorders
/// of one delivery take turns, and lifetime numbers are read under the lock. `{ids}` is a
/// [`Db::id_list`].
pub(super) const LOCK_DELIVERIES: &str =
    "SELECT id, next_attempt_at FROM webhook_deliveries WHERE id {ids} ORDER BY id";

/// Every attempt already recorded for the deliveries: the highest lifetime numbers, and
/// which claims have recorded already (a claim makes one attempt, so a retried batch,
/// after a commit whose acknowledgement was lost, must not add a second).
pub(super) const RECORDED_ATTEMPTS: &str =
    "SELECT delivery_id, claim_token, number, superseded FROM delivery_attempts WHERE delivery_id {ids}";

/// `RECORDED_ATTEMPTS` on PostgreSQL: one index lookup per delivery, whatever the table's
/// statistics say or said. A plain `IN` list on a table never analyzed is estimated to
/// match half the table and planned as a sequential scan; and any statement prepared on a
/// connection keeps the plan made when it first ran, which, with statistics taken while
/// the table was nearly empty (autovacuum off), was a sequential scan per delivery however
/// large the table grew. The lookup is a function (see the migration
/// `m20261210_000001_recorded_attempts`) whose body is planned on every call, with
/// sequential scans ruled out. The array makes the text the same for every batch size.
pub const RECORDED_ATTEMPTS_POSTGRES: &str = "\
SELECT delivery_id, claim_token, number, superseded FROM courier_recorded_attempts($1::uuid[])";

/// The fenced transitions: a row changes only while its claim still holds the delivery.
/// A row that is not returned was superseded by a newer claim, whose state stands. A retry
/// (the one transition to `pending`) is due `v.delay` after now on the database's clock,
/// or parked if the endpoint is disabled. `{rows}` is a [`Rows`] of [`TRANSITION_COLUMNS`];
/// an attempt without an error travels with `''`; `counted` is 1 for an attempt of the
/// cycle, 0 for a spent cycle ending without a request.
pub(super) const FENCED_TRANSITIONS: &str = "\
WITH v (id, token, state, delay, error, counted) AS ({rows})
UPDATE webhook_deliveries
SET state = v.state,
    cycle_attempts = webhook_deliveries.cycle_attempts + v.counted,
    next_attempt_at = CASE WHEN v.state <> 'pending' THEN NULL
                           WHEN {parked(webhook_deliveries.endpoint_id)} THEN NULL
                           ELSE {after(v.delay)} END,
    claim_token = NULL,
    claim_expires_at = NULL,
    last_error = NULLIF(v.error, ''),
    updated_at = {now}
FROM v
WHERE webhook_deliveries.id = v.id AND webhook_deliveries.claim_token = v.token
RETURNING webhook_deliveries.id, webhook_deliveries.next_attempt_at, webhook_deliveries.updated_at";

/// The types of [`FENCED_TRANSITIONS`]' rows.
pub(super) const TRANSITION_COLUMNS: &[&str] = &["uuid", "uuid", "text", "float8", "text", "int4"];

/// The attempts themselves. `{rows}` is a [`Rows`] of [`ATTEMPT_COLUMNS`]; an attempt
/// that got no response travels with status `0` (and then its body and headers, sent as
/// `''`, are NULL), one without an error with `''`.
pub(super) const INSERT_ATTEMPTS: &str = "\
WITH v (id, delivery_id, number, claim_token, started_at, finished_at, status_code, error,
        duration_ms, superseded, response_body, response_headers) AS ({rows})
INSERT INTO delivery_attempts
    (id, delivery_id, number, claim_token, started_at, finished_at, status_code, error, duration_ms,
     superseded, response_body, response_headers)
SELECT id, delivery_id, number, claim_token, started_at, finished_at, NULLIF(status_code, 0),
       NULLIF(error, ''), duration_ms, superseded,
       CASE WHEN status_code = 0 THEN NULL ELSE response_body END,
       CASE WHEN status_code = 0 THEN NULL ELSE response_headers END
FROM v";

/// The types of [`INSERT_ATTEMPTS`]' rows.
pub(super) const ATTEMPT_COLUMNS: &[&str] = &[
    "uuid",
    "uuid",
    "int4",
    "uuid",
    "timestamptz",
    "timestamptz",
    "int4",
    "text",
    "int4",
    "bool",
    "text",
    "text",
];
