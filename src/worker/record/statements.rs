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
/// statistics say. A plain `IN` list on a table never analyzed (autovacuum off, or not yet
/// run) is estimated to match half the table and planned as a sequential scan, which made
/// every batch slower as attempts accumulated; `OFFSET 0` keeps the lateral subquery from
/// being flattened into such a join. The array makes the text the same for every batch
/// size, so each connection prepares it once.
pub const RECORDED_ATTEMPTS_POSTGRES: &str = "\
SELECT ids.id AS delivery_id, a.claim_token, a.number, a.superseded
FROM unnest($1::uuid[]) AS ids(id)
CROSS JOIN LATERAL (
    SELECT claim_token, number, superseded FROM delivery_attempts
    WHERE delivery_id = ids.id OFFSET 0
) AS a";

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
