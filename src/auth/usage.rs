//! When each API key was last used, kept coarsely: a process writes a key's `last_used_at` at
//! most once per [`RESOLUTION`], in the background, and the write itself is skipped when any
//! process wrote within that time. Busy keys cost one small write a minute, not one per request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DbErr};
use uuid::Uuid;

use crate::db::Db;
use crate::error::error_chain;

/// How stale `last_used_at` may be.
pub const RESOLUTION: Duration = Duration::from_secs(60);

/// Keys remembered at most; past this, entries older than [`RESOLUTION`] are dropped.
const MAX_ENTRIES: usize = 10_000;

/// Moves `last_used_at` forward unless some process did so within the resolution (`$2`
/// before now), on the database's clock.
const TOUCH: &str = "UPDATE api_keys SET last_used_at = {now} \
     WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < {after($2)})";

/// This process's last write per key.
#[derive(Debug, Default)]
pub struct KeyUsage {
    written: Arc<Mutex<HashMap<Uuid, Instant>>>,
}

impl KeyUsage {
    /// Notes that `key_id` authenticated a request or holds an open session; writes it
    /// (without waiting) when this process has not in the last [`RESOLUTION`].
    pub fn touch(&self, db: &Db, key_id: Uuid) {
        {
            let Ok(mut written) = self.written.lock() else {
                return;
            };
            if written
                .get(&key_id)
                .is_some_and(|at| at.elapsed() < RESOLUTION)
            {
                return;
            }
            if written.len() >= MAX_ENTRIES {
                written.retain(|_, at| at.elapsed() < RESOLUTION);
            }
            written.insert(key_id, Instant::now());
        }
        let db = db.clone();
        let written = self.written.clone();
        tokio::spawn(async move {
            if let Err(err) = db.within_deadline(write(&db, key_id)).await {
                tracing::warn!(%key_id, error = %error_chain(&err), "recording an API key's use failed");
                // Not written: the next use tries again.
                if let Ok(mut written) = written.lock() {
                    written.remove(&key_id);
                }
            }
        });
    }
}

async fn write(db: &Db, key_id: Uuid) -> Result<(), DbErr> {
    let clock = db.clock();
    db.conn()
        .execute_raw(clock.statement(TOUCH, [key_id.into(), clock.before(RESOLUTION)]))
        .await?;
    Ok(())
}
