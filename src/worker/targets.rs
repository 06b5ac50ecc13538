//! Loading what to send for a batch of claims: payload, URL and secret, read just before sending.

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, DbErr, Statement};
use uuid::Uuid;

use super::claim::Claim;
use crate::db::Db;

/// Everything needed to send the claimed deliveries, in one query per batch.
const LOAD_TARGETS: &str = "\
SELECT d.id, s.payload, e.url, e.signing_secret
FROM webhook_deliveries d
JOIN submissions s ON s.id = d.submission_id
JOIN endpoints e ON e.id = d.endpoint_id
WHERE d.id IN ({ids})";

/// Where and what to send for one claimed delivery.
#[derive(Debug, Clone)]
pub struct Target {
    /// The endpoint URL.
    pub url: String,
    /// The endpoint's signing secret, as stored right now.
    pub secret: String,
    /// The JSON body.
    pub body: Vec<u8>,
}

/// Reads the payload, URL and secret of each claimed delivery in one query.
pub async fn load_targets(db: &Db, claims: &[Claim]) -> Result<HashMap<Uuid, Target>, DbErr> {
    if claims.is_empty() {
        return Ok(HashMap::new());
    }
    let sql = LOAD_TARGETS.replace("{ids}", &Db::placeholders(1, claims.len()));
    let values = claims.iter().map(|claim| claim.delivery_id.into());
    let rows = db
        .conn()
        .query_all_raw(Statement::from_sql_and_values(db.backend(), &sql, values))
        .await?;
    let mut targets = HashMap::with_capacity(rows.len());
    for row in rows {
        let id: Uuid = row.try_get("", "id")?;
        let payload: serde_json::Value = row.try_get("", "payload")?;
        let body = serde_json::to_vec(&payload).map_err(|err| DbErr::Json(err.to_string()))?;
        targets.insert(
            id,
            Target {
                url: row.try_get("", "url")?,
                secret: row.try_get("", "signing_secret")?,
                body,
            },
        );
    }
    Ok(targets)
}
